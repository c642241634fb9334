"""The cost ledger: what each cell's questions cost, by phase, from the terminal rows alone.

Phases (every figure is a sum over the cell's terminal rows, repeats included):

- ``answer``: the prompt the harness sent (our exact count; a violation was never sent and
  costs nothing) and the completion the server reported;
- ``aux``: the strategy's auxiliary calls through ``context.complete`` (``aux_*`` fields);
- ``write``, ``read``, ``metered aux``: calls a plugin's own SDK made through the metering
  gateway while it ingested, retrieved or otherwise ran (``metered``; see docs/isolation.md);
- ``judge``: a model judge's calls, where the row carries them (``metered.judge``);
- the plugin's worker: the CPU seconds it measured of itself in each phase (``cpu_s``; missing
  in an in-process run), the declared outside services it reached through the harness's proxy
  (calls and bytes per host) and the connections it tried to undeclared hosts (refused).

A memory system ingests an item once (on whichever row of the item ran first) and every
budget tier and repeat reuses that memory, so its write cost is recorded once per item and
amortised: each cell that asks an item bears that item's write once, shared by the cell's
questions about it. "Tokens per question, end to end" is answer + aux + read + the question's
share of write + judge, over the cell's questions (results and violations; a prompts-only
run's admitted prompts). A count the server did not report makes the total it belongs to
missing, never 0. With a price (``run --price IN/OUT``, or litellm's cost map for the run's
model, recorded in the manifest) each $ figure is tokens x price: ``input x IN + output x
OUT``, so it can be recomputed from the rows; ``cost_usd`` is what the cell's own rows spent,
``cost_per_question_usd`` the end-to-end tokens per question priced.

Break-even (memory systems with a write cost, against ``full_context`` at the same budget,
over the items full context fits): the write per item ``W`` pays for itself after ``N``
questions on the same memory when ``W + N x q_memory <= N x q_full``, so ``N = ceil(W /
(q_full - q_memory))`` (at least 1); none when the memory costs as much per question as
the full history.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

QUESTION_EVENTS = ("result", "violation", "admitted")
METERED_PHASES = ("write", "read", "aux")
FULL_CONTEXT = "full_context"
WORKER_PHASES = (("write", "write"), ("read", "read"), ("aux", "other"))  # metered phase -> ledger label

Tokens = tuple[int | None, int | None]  # input, output; None: a count the server did not report


def _add(total: int | None, value: Any) -> int | None:
    """Sum that stays missing once a part is missing."""
    if total is None or value is None:
        return None
    return total + int(value)


def _pair(a: Tokens, b: Tokens) -> Tokens:
    return _add(a[0], b[0]), _add(a[1], b[1])


def _write_of(row: dict[str, Any]) -> Tokens:
    """The write tokens a row recorded (a memory system's ingest through the gateway)."""
    figures = (row.get("metered") or {}).get("write") or {}
    if not figures.get("calls"):
        return 0, 0
    return figures.get("input_tokens"), figures.get("completion_tokens")


def item_writes(rows: list[dict[str, Any]]) -> dict[str, Tokens]:
    """Write tokens per item over every row of one strategy (all budgets and repeats): recorded
    once, on the row that ingested."""
    writes: dict[str, Tokens] = defaultdict(lambda: (0, 0))
    for row in rows:
        writes[str(row.get("item_id"))] = _pair(writes[str(row.get("item_id"))], _write_of(row))
    return dict(writes)


def _question_tokens(rows: list[dict[str, Any]]) -> Tokens:
    """Every token of ``rows`` but their write: answer, aux, metered read and aux, judge."""
    total: Tokens = (0, 0)
    for row in rows:
        if row.get("event") in ("result", "admitted"):
            total = _pair(total, (row.get("prompt_tokens"), 0))
        if row.get("event") == "result":
            total = _pair(total, (0, row.get("completion_tokens")))
        total = _pair(total, (row.get("aux_prompt_tokens") or 0, row.get("aux_completion_tokens") or 0))
        for phase, figures in (row.get("metered") or {}).items():
            if phase in ("read", "aux", "judge") and figures.get("calls"):
                total = _pair(total, (figures.get("input_tokens"), figures.get("completion_tokens")))
    return total


def _per_question(tokens: Tokens, n: int) -> float | None:
    if not n or tokens[0] is None or tokens[1] is None:
        return None
    return (tokens[0] + tokens[1]) / n


def cell_ledger(
    rows: list[dict[str, Any]], price: dict[str, Any] | None = None, writes: dict[str, Tokens] | None = None
) -> dict[str, Any]:
    """The ledger of one cell's terminal rows (see the module docstring); ``writes``: the
    strategy's write per item over all its cells (``item_writes``), else this cell's own."""
    writes = item_writes(rows) if writes is None else writes
    questions = [r for r in rows if r.get("event") in QUESTION_EVENTS]
    sent = [r for r in questions if r["event"] in ("result", "admitted")]
    phases: dict[str, dict[str, Any]] = {
        "answer": {"calls": len(sent), "input_tokens": 0, "output_tokens": 0},
        "aux": {"calls": 0, "input_tokens": 0, "output_tokens": 0},
        **{f"metered_{p}": {"calls": 0, "input_tokens": 0, "output_tokens": 0} for p in (*METERED_PHASES, "judge")},
    }
    cpu: dict[str, float | None] = {label: None for _, label in WORKER_PHASES}
    outside: dict[str, dict[str, int]] = {}
    undeclared: dict[str, int] = {}
    for row in sent:
        phases["answer"]["input_tokens"] = _add(phases["answer"]["input_tokens"], row.get("prompt_tokens"))
        if row["event"] == "result":
            phases["answer"]["output_tokens"] = _add(phases["answer"]["output_tokens"], row.get("completion_tokens"))
    for row in rows:
        aux = phases["aux"]
        aux["calls"] += int(row.get("aux_calls") or 0)
        aux["input_tokens"] = _add(aux["input_tokens"], row.get("aux_prompt_tokens") or 0)
        aux["output_tokens"] = _add(aux["output_tokens"], row.get("aux_completion_tokens") or 0)
        metered = row.get("metered") or {}
        for phase, figures in metered.items():
            into = phases.get(f"metered_{phase}")
            if into is None:
                continue
            into["calls"] += int(figures.get("calls") or 0)
            into["input_tokens"] = _add(into["input_tokens"], figures.get("input_tokens"))
            into["output_tokens"] = _add(into["output_tokens"], figures.get("completion_tokens"))
        for phase, label in WORKER_PHASES:
            seconds = (metered.get(phase) or {}).get("cpu_s")
            if isinstance(seconds, (int, float)):
                cpu[label] = (cpu[label] or 0.0) + float(seconds)
        for host, figures in ((metered.get("outside") or {}).get("hosts") or {}).items():
            into_host = outside.setdefault(host, {"calls": 0, "bytes_sent": 0, "bytes_received": 0})
            for key in into_host:
                into_host[key] += int(figures.get(key) or 0)
        for host, calls in ((metered.get("undeclared") or {}).get("hosts") or {}).items():
            undeclared[host] = undeclared.get(host, 0) + int(calls)
    total_in: int | None = 0
    total_out: int | None = 0
    for figures in phases.values():
        total_in = _add(total_in, figures["input_tokens"])
        total_out = _add(total_out, figures["output_tokens"])
    n = len(questions)
    asked = sorted({str(r.get("item_id")) for r in questions})
    write_share: Tokens = (0, 0)
    for item in asked:
        write_share = _pair(write_share, writes.get(item, (0, 0)))
    end_to_end = _pair(_question_tokens(rows), write_share)
    latencies = [
        r["latency_s"] for r in questions if r["event"] == "result" and not r.get("cached") and r.get("latency_s")
    ]
    measured = [s for s in cpu.values() if s is not None]
    ledger: dict[str, Any] = {
        "questions": n,
        "errors": sum(1 for r in rows if r.get("event") == "error"),
        **{f"{phase}_{k}": v for phase, figures in phases.items() for k, v in figures.items()},
        "input_tokens": total_in,
        "output_tokens": total_out,
        "write_items": sum(1 for item in asked if writes.get(item, (0, 0)) != (0, 0)),
        "write_share_per_question": _per_question(write_share, n),
        "tokens_per_question": _per_question(end_to_end, n),
        "latency_p50_s": float(np.percentile(latencies, 50)) if latencies else None,
        "latency_p95_s": float(np.percentile(latencies, 95)) if latencies else None,
        "worker_cpu_s": round(sum(measured), 6) if measured else None,
        **{f"worker_cpu_{label}_s": None if s is None else round(s, 6) for label, s in cpu.items()},
        "outside": outside,
        "outside_calls": sum(f["calls"] for f in outside.values()),
        "outside_bytes": sum(f["bytes_sent"] + f["bytes_received"] for f in outside.values()),
        "undeclared_network": undeclared,
        "cost_usd": None,
        "cost_per_question_usd": None,
    }
    if price is not None and total_in is not None and total_out is not None:
        per_in, per_out = float(price["input_per_token"]), float(price["output_per_token"])
        ledger["cost_usd"] = total_in * per_in + total_out * per_out
        if n and end_to_end[0] is not None and end_to_end[1] is not None:
            ledger["cost_per_question_usd"] = (end_to_end[0] * per_in + end_to_end[1] * per_out) / n
    return ledger


def break_even(
    memory: list[dict[str, Any]], full: list[dict[str, Any]] | None, writes: dict[str, Tokens]
) -> dict[str, Any]:
    """Questions on one memory after which its write has paid for itself against full context
    (see the module docstring), over the items full context fits at this budget."""
    if full is None:
        return {"break_even_questions": None, "break_even_items": 0, "break_even_note": "full context not run"}
    fits = {str(r["item_id"]) for r in full if r.get("event") in ("result", "admitted")}
    fits -= {str(r["item_id"]) for r in full if r.get("event") in ("violation", "error")}
    fits &= {str(r["item_id"]) for r in memory if r.get("event") in QUESTION_EVENTS}
    if not fits:
        return {"break_even_questions": None, "break_even_items": 0, "break_even_note": "full context fits no item"}
    ours = [r for r in memory if str(r.get("item_id")) in fits]
    theirs = [r for r in full if str(r.get("item_id")) in fits]
    q_memory = _per_question(_question_tokens(ours), sum(r.get("event") in QUESTION_EVENTS for r in ours))
    q_full = _per_question(_question_tokens(theirs), sum(r.get("event") in QUESTION_EVENTS for r in theirs))
    write: Tokens = (0, 0)
    for item in sorted(fits):
        write = _pair(write, writes.get(item, (0, 0)))
    w = _per_question(write, len(fits))
    out: dict[str, Any] = {"break_even_questions": None, "break_even_items": len(fits), "break_even_note": None}
    if q_memory is None or q_full is None or w is None:
        out["break_even_note"] = "a count the server did not report"
    elif q_full <= q_memory:
        out["break_even_note"] = "never: it costs as much per question as full context"
    else:
        out["break_even_questions"] = max(1, math.ceil(w / (q_full - q_memory)))
        out["break_even_note"] = f"write {w:g} tokens per item, saves {q_full - q_memory:g} per question"
    return out


def ledger_table(
    cells: dict[tuple[str, str, int], list[dict[str, Any]]], price: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """One ledger row per cell (task, strategy, budget), in the cells' order; memory systems
    with a write cost also get their break-even against full context."""
    by_strategy: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for (task, strategy, _), rows in cells.items():
        by_strategy[(task, strategy)].extend(rows)
    writes = {key: item_writes(rows) for key, rows in by_strategy.items()}
    table = []
    for (task, strategy, budget), rows in sorted(cells.items()):
        row = {"task": task, "strategy": strategy, "budget": budget}
        row.update(cell_ledger(rows, price, writes[(task, strategy)]))
        if row["write_items"] and strategy != FULL_CONTEXT:
            row.update(break_even(rows, cells.get((task, FULL_CONTEXT, budget)), writes[(task, strategy)]))
        table.append(row)
    return table


def fmt_figure(value: Any) -> str:
    """A ledger figure as both the Markdown and the HTML ledger show it (4 significant digits)."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def ledger_intro(price: dict[str, Any] | None) -> str:
    """What the ledger counts and how its $ figures are priced: one text for Markdown and HTML."""
    return (
        "Per cell, summed over its terminal rows: the answer prompts sent (violations were never sent) and "
        "their completions, the strategy's auxiliary calls, and the calls a plugin's own SDK made through the "
        "metering gateway (write: ingest, read: retrieval, aux: the rest). A memory system's write is recorded "
        "once per item and shared by the questions asked of that memory: tokens per question, end to end, are "
        "answer + aux + read + the question's share of write + judge. Worker CPU is what the plugin's worker "
        "process measured of itself (— in an in-process run). A count the server did not report leaves its "
        "total empty. "
        + (
            f"Price ({price['source']}): input x {price['input_per_token'] * 1e6:g} + output x "
            f"{price['output_per_token'] * 1e6:g} $ per million tokens."
            if price
            else "No price for this model (the embedded model costs CPU time, not dollars; run --price IN/OUT)."
        )
    )


BREAK_EVEN_INTRO = (
    "Break-even against full context (memory systems with a write cost, over the items full context fits "
    "at the same budget): the questions on one memory after which its write has paid for itself."
)
OUTSIDE_INTRO = (
    "Outside services (through the harness's proxy): declared hosts are let through and metered; "
    "connections to undeclared hosts were refused."
)


def break_even_rows(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ledger rows that carry a break-even (memory systems with a write cost)."""
    return [r for r in ledger if "break_even_items" in r]


def network_rows(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell and outside host: declared (calls, bytes) or undeclared (refused calls)."""
    rows: list[dict[str, Any]] = []
    for r in ledger:
        cell = {"task": r["task"], "strategy": r["strategy"], "budget": r["budget"]}
        for host, f in sorted(r["outside"].items()):
            sent = f"{f['bytes_sent']} / {f['bytes_received']}"
            rows.append(cell | {"host": host, "calls": f["calls"], "bytes": sent, "declared": True})
        for host, calls in sorted(r["undeclared_network"].items()):
            rows.append(cell | {"host": host, "calls": calls, "bytes": "—", "declared": False})
    return rows


def ledger_markdown(ledger: list[dict[str, Any]], price: dict[str, Any] | None, note: str = "") -> list[str]:
    """The report's "Cost ledger" section (Markdown lines), from ``ledger_table``'s rows."""
    if not ledger:
        return []
    lines = [
        f"## Cost ledger{note}",
        "",
        ledger_intro(price),
        "",
        "| task | strategy | budget | questions | answer in / out | aux calls (in / out) | write calls (in / out) "
        "| read calls (in / out) | metered aux calls (in / out) | write per question | tokens per question "
        "| worker CPU s (write / read / other) | latency p50 / p95 (s) | $ per question |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['task']} | {r['strategy']} | {r['budget']} | {r['questions']} | "
        f"{fmt_figure(r['answer_input_tokens'])} / {fmt_figure(r['answer_output_tokens'])} | "
        + " | ".join(
            f"{r[f'{p}_calls']} ({fmt_figure(r[f'{p}_input_tokens'])} / {fmt_figure(r[f'{p}_output_tokens'])})"
            for p in ("aux", "metered_write", "metered_read", "metered_aux")
        )
        + f" | {fmt_figure(r['write_share_per_question'])} | {fmt_figure(r['tokens_per_question'])} | "
        f"{fmt_figure(r['worker_cpu_s'])} "
        f"({' / '.join(fmt_figure(r[f'worker_cpu_{label}_s']) for _, label in WORKER_PHASES)}) | "
        f"{fmt_figure(r['latency_p50_s'])} / {fmt_figure(r['latency_p95_s'])} | "
        f"{fmt_figure(r['cost_per_question_usd'])} |"
        for r in ledger
    ]
    lines.append("")
    even = break_even_rows(ledger)
    if even:
        lines += [
            BREAK_EVEN_INTRO,
            "",
            "| task | strategy | budget | items | break-even questions | why |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['task']} | {r['strategy']} | {r['budget']} | {r['break_even_items']} | "
            f"{fmt_figure(r['break_even_questions'])} | {r['break_even_note'] or ''} |"
            for r in even
        ]
        lines.append("")
    network = network_rows(ledger)
    if network:
        lines += [
            OUTSIDE_INTRO,
            "",
            "| task | strategy | budget | host | calls | bytes sent / received | |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['task']} | {r['strategy']} | {r['budget']} | {r['host']} | {r['calls']} | {r['bytes']} | "
            + ("declared |" if r["declared"] else "**undeclared network use: refused** |")
            for r in network
        ]
        lines.append("")
    return lines
