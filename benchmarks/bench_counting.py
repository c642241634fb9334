"""Exact token counting: throughput, and the cost of counting inside strategies.

1. Tokens per second of the exact count of a whole rendered prompt: a LongMemEval_S
   history (~115K tokens) with the embedded llama.cpp server's own template and
   vocabulary (``server``: /apply-template then /tokenize), and with tiktoken.
2. The same history counted message by message, as ``PromptCounter`` does on a cold
   cache (one /tokenize request per message for the server tokenizer).
3. Truncation at five tiers (2048 ... 32768) over LongMemEval_S text of 50K, 100K and 200K tokens,
   with a fresh counter per item, plus the runner's own exact recount of each prompt:
   milliseconds per item (wall, and this process's CPU time, which a busy machine inflates
   less; for the server tokenizer the work is in the server), and how many tokenizer requests were made (the per-message
   cache means each message is counted once per item, and truncation only looks at the
   newest messages that can fit, so the time must not grow with the history). Also the
   ``hf:`` tokenizer (transformers' conversion of the embedded model's GGUF, saved as a
   folder), piece-wise and, for comparison, counting whole texts as it did before.
4. Counting's share of a cell's CPU in the runner's setting (LongMemEval_S, truncation,
   five tiers, tiktoken): the strategy (its estimates and ``fit``), the canonical prompt
   and the gate (exact count and the prompt's one serialisation), per cell, with a fresh
   counter per run and once more with every message already counted (what is left when
   tiktoken's own encoding of each message is taken away).

    .venv/bin/python benchmarks/bench_counting.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import longmemeval_items, machine, median, require_data, write_result

from budgetbench_core import Item, Message, PromptCounter, StrategyContext
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.builtin.tokenizers import (
    HuggingFaceTokenizer,
    ServerTokenizer,
    TiktokenTokenizer,
    server_tokenizer,
)
from budgetbench_core.gate import gate
from budgetbench_core.sandbox import canonical_prompt

TIERS = [2048, 4096, 8192, 16384, 32768]


class Counting:
    """Wraps a tokenizer and counts the calls made to it (and, for the server tokenizer,
    the HTTP requests it sends)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.info = tokenizer.info
        self.calls = 0
        self.http_requests = 0
        http = getattr(tokenizer, "_http", None)
        if http is not None:
            http.event_hooks["request"].append(self._sent)

    def _sent(self, request) -> None:
        self.http_requests += 1

    def render(self, messages):
        return self.tokenizer.render(messages)

    def count_text(self, text):
        self.calls += 1
        return self.tokenizer.count_text(text)

    def count_in_message(self, role, content):
        self.calls += 1
        return self.tokenizer.count_in_message(role, content)

    def count(self, messages):
        self.calls += 1
        return self.tokenizer.count(messages)


def whole_prompt(make_tokenizer, item: Item, repeats: int) -> dict:
    prompt = item.frame(list(item.history))
    times, tokens = [], 0
    for _ in range(repeats):
        tokenizer = make_tokenizer()  # cold: no cached per-message counts
        tokenizer.count_text("warm-up")  # the server tokenizer's one-time probe of the template, paid once per run
        started = time.perf_counter()
        tokens = tokenizer.count(prompt)
        times.append(time.perf_counter() - started)
    seconds = median(times)
    return {"tokens": tokens, "seconds": round(seconds, 4), "tokens_per_s": round(tokens / seconds)}


def per_message(make_tokenizer, item: Item, repeats: int) -> dict:
    times, tokens = [], 0
    for _ in range(repeats):
        counter = PromptCounter(make_tokenizer())
        counter.tokenizer.count_text("warm-up")
        started = time.perf_counter()
        tokens = sum(counter.message_tokens(m) for m in item.history)
        times.append(time.perf_counter() - started)
    seconds = median(times)
    return {
        "messages": len(item.history),
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds),
    }


def truncation_item(make_tokenizer, item: Item) -> dict:
    tokenizer = Counting(make_tokenizer())
    counter = PromptCounter(tokenizer)
    # Once per run, not per item: the server tokenizer's probe of the template, and the
    # template's fixed tokens per role. The per-message caches stay cold.
    counter.estimate([Message(role, "") for role in ("system", "user", "assistant")])
    tokenizer.http_requests = tokenizer.calls = 0
    strategy = Truncation()
    started, cpu = time.perf_counter(), time.process_time()
    for budget in TIERS:
        context = StrategyContext(
            item=item, budget=budget, counter=counter, complete=None, seed=0, scratch_dir=Path(".")
        )
        prompt = strategy.apply(item.history, budget, context)
        assert counter.count(prompt) <= budget  # the runner's own exact count
    return {
        "ms_per_item": (time.perf_counter() - started) * 1e3,
        "tokenizer_calls": tokenizer.calls,
        "http_requests": tokenizer.http_requests,
        "cpu_ms_per_item": (time.process_time() - cpu) * 1e3,
    }


def cell_counting(items: list[Item], repeats: int) -> dict:
    """CPU per cell of counting in the runner's steps (strategy, canonical prompt, gate), over
    ``items`` at five tiers with tiktoken: cold (a fresh counter, as a run starts) and warm
    (every message counted before, so tiktoken's encoding is left out)."""

    def sweep(counter: PromptCounter) -> float:
        cpu = time.process_time()
        for item in items:
            for budget in TIERS:
                context = StrategyContext(
                    item=item, budget=budget, counter=counter, complete=None, seed=0, scratch_dir=Path(".")
                )
                prompt = canonical_prompt(Truncation().apply(item.history, budget, context))
                assert gate(prompt, budget, counter).admitted
        return (time.process_time() - cpu) * 1e3 / (len(items) * len(TIERS))

    cold, warm = [], []
    for _ in range(repeats):
        counter = PromptCounter(TiktokenTokenizer("cl100k_base"))
        counter.estimate([Message(role, "") for role in ("system", "user", "assistant")])
        cold.append(sweep(counter))
        warm.append(sweep(counter))
    return {
        "items": len(items),
        "cells": len(items) * len(TIERS),
        "cpu_ms_per_cell": round(median(cold), 3),
        "cpu_ms_per_cell_messages_counted_before": round(median(warm), 3),
        "tiktoken_encoding_ms_per_cell": round(median(cold) - median(warm), 3),
    }


def hf_folder(backend, folder: Path) -> Path:
    """The embedded model's tokenizer and chat template as an hf: folder (transformers'
    conversion of the GGUF), so the hf: path runs offline."""
    from transformers import AutoTokenizer

    model = Path(backend.model_path)
    AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name).save_pretrained(folder)
    return folder


def history_of(tokens: int, pool: list[Item]) -> Item:
    """An item whose history is the LongMemEval_S histories of ``pool`` one after another,
    cut once it holds ``tokens`` tiktoken tokens (two items give the 200K-token history)."""
    counter = TiktokenTokenizer("cl100k_base")
    history, total = [], 0
    for message in (m for item in pool for m in item.history):
        if total >= tokens:
            break
        history.append(message)
        total += counter.count_text(message.content)
    return Item(
        id=f"history-{tokens}",
        history=tuple(history),
        query=pool[0].query,
        answer=pool[0].answer,
        system=pool[0].system,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    require_data()
    start = machine()
    from budgetbench_core.builtin.local_backend import LocalBackend

    backend = LocalBackend()
    backend.start()
    tokenizers = {
        "server": lambda: server_tokenizer("", backend),  # as a run builds it (in-process estimates)
        "tiktoken": lambda: TiktokenTokenizer("cl100k_base"),
    }
    results: dict = {"machine": start, "tiers": TIERS}
    scratch = tempfile.TemporaryDirectory()
    try:
        pool = longmemeval_items(8)
        results["cell_counting_tiktoken"] = cell_counting(pool, args.repeats)
        print(
            f"counting per cell, LongMemEval_S, truncation, five tiers, tiktoken: {results['cell_counting_tiktoken']}"
        )
        folder = hf_folder(backend, Path(scratch.name) / "hf")
        item = max(pool, key=lambda i: sum(len(m.content) for m in i.history))
        results["history"] = {"item": item.id, "messages": len(item.history)}
        for name, make in tokenizers.items():
            results[f"{name}_whole_prompt"] = whole_prompt(make, item, args.repeats)
            results[f"{name}_per_message_cold"] = per_message(make, item, args.repeats)
            print(
                f"{name}: whole 115K prompt {results[f'{name}_whole_prompt']}; "
                f"per message, cold {results[f'{name}_per_message_cold']}"
            )
        synthetic = {size: history_of(size, pool) for size in (50_000, 100_000, 200_000)}
        truncation: dict = {}

        def whole_texts():
            """The server tokenizer as it was before piece-wise counting: every count sends the
            whole text, and estimates are one request per message (for comparison in this run)."""
            tokenizer = ServerTokenizer(backend.server_url)
            tokenizer._specials = []
            return tokenizer

        def hf_whole_texts():
            """The hf: tokenizer as it was before piece-wise counting: every count encodes the whole text."""
            tokenizer = HuggingFaceTokenizer(str(folder))
            tokenizer._patterns = []
            return tokenizer

        compared = {
            **tokenizers,
            "server-whole-texts (before)": whole_texts,
            "hf": lambda: HuggingFaceTokenizer(str(folder)),
            "hf-whole-texts (before)": hf_whole_texts,
        }
        for name, make in compared.items():
            for size, history_item in synthetic.items():
                runs = [truncation_item(make, history_item) for _ in range(args.repeats)]
                figure = {
                    "ms_per_item": round(median(r["ms_per_item"] for r in runs), 1),
                    "cpu_ms_per_item": round(median(r["cpu_ms_per_item"] for r in runs), 1),
                    "tokenizer_calls": runs[0]["tokenizer_calls"],
                    "http_requests": runs[0]["http_requests"],
                    "history_messages": len(history_item.history),
                }
                truncation[f"{name}:{size}"] = figure
                print(f"truncation, {name}, {size}-token history, five tiers: {figure}")
        results["truncation_five_tiers"] = truncation
        results["history_200k_tiktoken_tokens"] = TiktokenTokenizer("cl100k_base").count(
            synthetic[200_000].frame(list(synthetic[200_000].history))
        )
    finally:
        backend.stop()
        scratch.cleanup()
    figures = results["truncation_five_tiers"]
    results["targets"] = {
        "tiktoken": "truncation over a 200K-token history at five tiers < 100 ms per item",
        "server": "the same with the exact server tokenizer < 200 ms per item",
    }
    cell = results["cell_counting_tiktoken"]
    print(
        f"counting per cell (LongMemEval_S, five tiers, tiktoken): {cell['cpu_ms_per_cell']} ms CPU, of which "
        f"{cell['tiktoken_encoding_ms_per_cell']} ms is tiktoken encoding each message once"
    )
    results["met"] = {
        "tiktoken": figures["tiktoken:200000"]["ms_per_item"] < 100,
        "server": figures["server:200000"]["ms_per_item"] < 200,
    }
    print(
        f"200K-token history, five tiers: tiktoken {figures['tiktoken:200000']['ms_per_item']} ms (target < 100), "
        f"server {figures['server:200000']['ms_per_item']} ms (target < 200), "
        f"hf {figures['hf:200000']['ms_per_item']} ms (whole texts: {figures['hf-whole-texts (before):200000']['ms_per_item']} ms)"
    )
    write_result("counting", results)


if __name__ == "__main__":
    main()
