"""The cost ledger: what each cell's questions cost, by phase, from the terminal rows alone.

Phases (every figure is a sum over the cell's terminal rows, repeats included):

- ``answer``: the prompt the harness sent (our exact count; a violation was never sent and
  costs nothing) and the completion the server reported;
- ``aux``: the strategy's auxiliary calls through ``context.complete`` (``aux_*`` fields);
- ``write``, ``read``, ``metered aux``: calls a plugin's own SDK made through the metering
  gateway while it ingested, retrieved or otherwise ran (``metered``; see docs/isolation.md).

"Tokens per question, end to end" is every phase's input and output tokens over the cell's
questions (results and violations; a prompts-only run's admitted prompts). A count the server
did not report makes the total it belongs to missing, never 0. With a price (``run --price
IN/OUT``, or litellm's cost map for the run's model, recorded in the manifest) each $ figure is
tokens x price: ``input x IN + output x OUT``, so it can be recomputed from the rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUESTION_EVENTS = ("result", "violation", "admitted")
METERED_PHASES = ("write", "read", "aux")


def _add(total: int | None, value: Any) -> int | None:
    """Sum that stays missing once a part is missing."""
    if total is None or value is None:
        return None
    return total + int(value)


def cell_ledger(rows: list[dict[str, Any]], price: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ledger of one cell's terminal rows (see the module docstring)."""
    questions = [r for r in rows if r.get("event") in QUESTION_EVENTS]
    sent = [r for r in questions if r["event"] in ("result", "admitted")]
    phases: dict[str, dict[str, Any]] = {
        "answer": {"calls": len(sent), "input_tokens": 0, "output_tokens": 0},
        "aux": {"calls": 0, "input_tokens": 0, "output_tokens": 0},
        **{f"metered_{p}": {"calls": 0, "input_tokens": 0, "output_tokens": 0} for p in METERED_PHASES},
    }
    for row in sent:
        phases["answer"]["input_tokens"] = _add(phases["answer"]["input_tokens"], row.get("prompt_tokens"))
        if row["event"] == "result":
            phases["answer"]["output_tokens"] = _add(phases["answer"]["output_tokens"], row.get("completion_tokens"))
    for row in rows:
        aux = phases["aux"]
        aux["calls"] += int(row.get("aux_calls") or 0)
        aux["input_tokens"] = _add(aux["input_tokens"], row.get("aux_prompt_tokens") or 0)
        aux["output_tokens"] = _add(aux["output_tokens"], row.get("aux_completion_tokens") or 0)
        for phase, figures in (row.get("metered") or {}).items():
            into = phases.get(f"metered_{phase}")
            if into is None:
                continue
            into["calls"] += int(figures.get("calls") or 0)
            into["input_tokens"] = _add(into["input_tokens"], figures.get("input_tokens"))
            into["output_tokens"] = _add(into["output_tokens"], figures.get("completion_tokens"))
    total_in: int | None = 0
    total_out: int | None = 0
    for figures in phases.values():
        total_in = _add(total_in, figures["input_tokens"])
        total_out = _add(total_out, figures["output_tokens"])
    n = len(questions)
    latencies = [
        r["latency_s"] for r in questions if r["event"] == "result" and not r.get("cached") and r.get("latency_s")
    ]
    ledger: dict[str, Any] = {
        "questions": n,
        "errors": sum(1 for r in rows if r.get("event") == "error"),
        **{f"{phase}_{k}": v for phase, figures in phases.items() for k, v in figures.items()},
        "input_tokens": total_in,
        "output_tokens": total_out,
        "tokens_per_question": None if not n or total_in is None or total_out is None else (total_in + total_out) / n,
        "latency_p50_s": float(np.percentile(latencies, 50)) if latencies else None,
        "latency_p95_s": float(np.percentile(latencies, 95)) if latencies else None,
        "cost_usd": None,
        "cost_per_question_usd": None,
    }
    if price is not None and total_in is not None and total_out is not None:
        cost = total_in * float(price["input_per_token"]) + total_out * float(price["output_per_token"])
        ledger["cost_usd"] = cost
        ledger["cost_per_question_usd"] = cost / n if n else None
    return ledger


def ledger_table(
    cells: dict[tuple[str, str, int], list[dict[str, Any]]], price: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """One ledger row per cell (task, strategy, budget), in the cells' order."""
    return [
        {"task": task, "strategy": strategy, "budget": budget, **cell_ledger(rows, price)}
        for (task, strategy, budget), rows in sorted(cells.items())
    ]
