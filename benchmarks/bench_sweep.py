"""Budget sweeps: strategy time of a 5-tier run divided by a 1-tier run.

Per-item work that does not depend on the budget (embedding a history, ingesting and
retrieving memories) must be done once per item and reused for every tier, so five
tiers should cost little more than one. Measured on LongMemEval_S items (~115K tokens)
against an instant-reply loopback server, from the rows' ``strategy_s``. The ratio is
taken inside one 5-tier run (all cells of an item / the item's first cell, which does
the per-item work plus one fill), so load drift on a shared machine cannot skew it; for
the cheap arm a separate 1-tier run is timed as well:

- ``rag`` (budgetbench-strategy-rag: sentence-transformers + embedded qdrant), when installed;
- a memory-system arm: ``keyword-memory`` below, a small but real MemorySystem (a BM25
  index of every message), run through the runner's MemorySystemStrategy (ingest and
  retrieve once per item, saved to retrievals/, fill_budget per tier).

    .venv/bin/python benchmarks/bench_sweep.py [--items 3]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import BENCH_TASK, FakeOpenAI, benchmark_registry, machine, median, require_data, write_result

from budgetbench_core import IngestReport, MemorySystem, Regime, RetrievedItem, RunConfig, hookimpl, run
from budgetbench_core.plugins import PluginInfo
from budgetbench_core.runlog import iter_events

TIERS = [2048, 4096, 8192, 16384, 32768]
ONE_TIER = [8192]


def _terms(text: str) -> list[str]:
    return [w for w in "".join(c if c.isalnum() else " " for c in text.lower()).split() if len(w) > 2]


class KeywordMemory(MemorySystem):
    """BM25 over every message of the item's sessions; returns the top ``top_k`` messages."""

    name = "keyword-memory"
    regime = Regime.RESET_PER_ITEM
    description = "BM25 over messages (benchmark memory system)"

    def __init__(self, top_k: int = 200, **params):
        super().__init__(top_k=top_k, **params)
        self.top_k = int(top_k)
        self.reset()

    def reset(self) -> None:
        self.docs: list[tuple[str, str, Counter]] = []

    def ingest(self, sessions, context) -> IngestReport:
        started = time.perf_counter()
        for session in sessions:
            for index, message in enumerate(session.messages):
                text = f"[{session.date}] {message.role}: {message.content}"
                self.docs.append((f"{session.id}:{index}", text, Counter(_terms(message.content))))
        return IngestReport(len(sessions), len(sessions), [], time.perf_counter() - started)

    def retrieve(self, query, context) -> list[RetrievedItem]:
        n = len(self.docs)
        average = sum(sum(d[2].values()) for d in self.docs) / max(n, 1)
        frequency = Counter(t for d in self.docs for t in d[2])
        scores = []
        for source, text, counts in self.docs:
            length = sum(counts.values())
            score = sum(
                math.log(1 + (n - frequency[t] + 0.5) / (frequency[t] + 0.5))
                * counts[t]
                * 2.2
                / (counts[t] + 1.2 * (0.25 + 0.75 * length / average))
                for t in set(_terms(query))
                if t in counts
            )
            scores.append((score, source, text))
        scores.sort(key=lambda s: -s[0])
        return [RetrievedItem(text, score, source) for score, source, text in scores[: self.top_k]]


class _Plugin:
    @staticmethod
    @hookimpl
    def register_strategies(register):
        register(KeywordMemory)


def sweep(
    server: FakeOpenAI,
    registry,
    out: Path,
    strategy: str,
    budgets: list[int],
    items: int,
    task: str = BENCH_TASK,
    options: dict | None = None,
) -> dict:
    config = RunConfig(
        task=task,
        task_options=options or {},
        strategies=[strategy],
        budgets=budgets,
        out=out,
        model="openai/bench",
        api_base=server.api_base,
        tokenizer="tiktoken:cl100k_base",
        limit=items,
        max_concurrency=1,
    )
    summary = run(config, registry)
    rows = [e for e in iter_events(out) if e["event"] in ("result", "violation", "error")]
    errors = [r for r in rows if r["event"] == "error"]
    assert not errors, errors[0]["cause"]
    by_item: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["time"]):
        by_item.setdefault(row["item_id"], []).append(row)
    # The first cell of an item (in run order) builds the index or ingests; the others reuse it.
    first = [cells[0]["strategy_s"] for cells in by_item.values()]
    total = [sum(c["strategy_s"] for c in cells) for cells in by_item.values()]
    return {
        "cells": len(rows),
        "results": summary.results,
        "violations": summary.violations,
        "strategy_s": sum(total),
        "first_cell_s": first,
        "item_total_s": total,
        "within_run_ratio": round(median(t / f for t, f in zip(total, first)), 3),
        "reuse_cell_ms": round(
            median((t - f) / max(len(c) - 1, 1) * 1e3 for t, f, c in zip(total, first, by_item.values())), 1
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=3)
    args = parser.parse_args()
    require_data()
    registry = benchmark_registry()
    if "keyword-memory" not in registry.names("strategy"):
        registry.add_plugin(_Plugin, PluginInfo("benchmarks-memory", "benchmarks", "0"))
    arms = ["keyword-memory"] + (["rag"] if "rag" in registry.names("strategy") else [])
    start = machine()
    figures = {}
    with FakeOpenAI() as server, tempfile.TemporaryDirectory() as tmp:
        for arm in arms:
            # loads the embedding model on a tiny history, so no item pays for it
            sweep(
                server,
                registry,
                Path(tmp) / f"{arm}-warm",
                arm,
                ONE_TIER,
                1,
                "synthetic-memory",
                {"items": 1, "history_tokens": 400},
            )
            five = sweep(server, registry, Path(tmp) / f"{arm}-5", arm, TIERS, args.items)
            figure = {"five_tiers": five, "ratio": five["within_run_ratio"], "reuse_cell_ms": five["reuse_cell_ms"]}
            if arm == "keyword-memory":  # cheap enough to also time a separate 1-tier run
                one = sweep(server, registry, Path(tmp) / f"{arm}-1", arm, ONE_TIER, args.items)
                figure.update(one_tier=one, separate_runs_ratio=round(five["strategy_s"] / one["strategy_s"], 3))
            figures[arm] = figure
            print(
                f"{arm}: first cell of an item (index/ingest + one fill) {median(five['first_cell_s']):.2f} s, "
                f"each reusing tier {five['reuse_cell_ms']:.0f} ms -> 5 tiers / 1 tier = {figure['ratio']} "
                f"(target <= 1.3)"
                + (f"; separate runs: {figure['separate_runs_ratio']}" if "separate_runs_ratio" in figure else "")
            )
    write_result(
        "sweep",
        {
            "machine": start,
            "items": args.items,
            "tiers": TIERS,
            "one_tier": ONE_TIER,
            "arms": figures,
            "rag_installed": "rag" in arms,
            "target": "ratio <= 1.3",
            "met": all(f["ratio"] <= 1.3 for f in figures.values()),
        },
    )


if __name__ == "__main__":
    main()
