"""``run --dry-run``: what a run would send and cost, learnt before any paid call.

The same cells run prompts-only (strategies, the gate and the audit, no model call) into a
temporary folder, removed afterwards; nothing is written to ``--out``. From its rows: per
strategy and budget, the cells, the prompts that fit (one answer call each), how many of those
reach the model (a prompt another cell already sends, at the same repeat, is answered by the
reply cache), their exact input tokens, the output tokens at most (``max_output_tokens`` per
call) and the dollars at ``--price`` or litellm's cost map, all counted on what is sent. What a prompts-only pass cannot see is said, not guessed:
a strategy's auxiliary calls, a judge's calls, an agent episode's later turns.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .host.pricing import price_for
from .run_config import RunConfig
from .runlog import final_rows, read_manifest


@dataclass
class CellEstimate:
    """One strategy at one budget: what its answer calls would carry."""

    strategy: str
    budget: int
    cells: int = 0
    calls: int = 0  # prompts that fit: each is one answer call
    sent: int = 0  # the calls whose prompt no earlier cell sends: the reply cache answers the rest
    violations: int = 0
    errors: int = 0
    input_tokens: int = 0
    max_output_tokens: int = 0
    max_cost_usd: float | None = None


@dataclass
class Estimate:
    cells: list[CellEstimate]
    price_source: str | None
    unseen: list[str]  # calls a prompts-only pass cannot count

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.cells)

    @property
    def sent(self) -> int:
        return sum(c.sent for c in self.cells)

    @property
    def input_tokens(self) -> int:
        return sum(c.input_tokens for c in self.cells)

    @property
    def max_output_tokens(self) -> int:
        return sum(c.max_output_tokens for c in self.cells)

    @property
    def max_cost_usd(self) -> float | None:
        costs = [c.max_cost_usd for c in self.cells]
        return None if not costs or any(c is None for c in costs) else sum(c for c in costs if c is not None)


def estimate(config: RunConfig, run: Any, episodic: bool = False, **callbacks: Any) -> Estimate:
    """Run ``config``'s cells prompts-only in a temporary folder (with ``run``, the runner's
    entry point) and estimate the real run; ``episodic``: the task's cells are agent episodes."""
    scratch = Path(tempfile.mkdtemp(prefix="budgetbench-dry-run-"))
    try:
        run(replace(config, prompts_only=True, out=scratch / "run"), **callbacks)
        rows = final_rows(scratch / "run")
        manifest = read_manifest(scratch / "run") or {}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    output_cap = int((manifest.get("identity") or {}).get("max_output_tokens") or 0)
    price = price_for(config.model, config.price)
    cells: dict[tuple[str, int], CellEstimate] = {}
    asked: set[tuple[str, int]] = set()  # (prompt, repeat): the reply cache's key, in effect
    for (_, strategy, budget, repeat, _), row in sorted(rows.items()):
        cell = cells.setdefault((strategy, budget), CellEstimate(strategy, budget))
        cell.cells += 1
        if row["event"] == "admitted":
            cell.calls += 1
            if (row["prompt_hash"], repeat) not in asked:
                asked.add((row["prompt_hash"], repeat))
                cell.sent += 1
                cell.input_tokens += int(row["prompt_tokens"])
                cell.max_output_tokens += output_cap
        elif row["event"] == "violation":
            cell.violations += 1
        else:
            cell.errors += 1
    for cell in cells.values():
        cell.max_cost_usd = None if price is None else price.cost(cell.input_tokens, cell.max_output_tokens)
    unseen = ["auxiliary calls a strategy makes while building its prompt (none are made in a dry run)"]
    if config.judge_model:
        unseen.append("the judge's calls (one or more per graded answer)")
    if episodic:
        unseen.append("an agent episode's later turns and its simulated user (only each first turn is gated)")
    by_strategy: dict[str, list[CellEstimate]] = defaultdict(list)
    for cell in cells.values():
        by_strategy[cell.strategy].append(cell)
    ordered = [c for s in config.strategies for c in sorted(by_strategy.get(s, []), key=lambda c: c.budget)]
    return Estimate(ordered, price.source if price is not None else None, unseen)
