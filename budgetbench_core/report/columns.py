"""The summary tables' columns, listed once: the Markdown writer and the HTML template both
render from these specs, so the two outputs cannot show different columns (issue 24).

A column is ``(key, heading, format)``: ``key`` is the summary row's field (the CSV and JSON
name), ``heading`` what both tables print, ``format`` how the value is written (``FORMATS``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from jinja2 import Undefined


def fmt(value: Any, digits: int = 3) -> str:
    """Numbers for tables: fixed digits, '–' for missing, 'not reported' for None costs."""
    if value is None or isinstance(value, Undefined):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


class Column(NamedTuple):
    key: str
    heading: str
    format: str = "text"


def interval(row: dict[str, Any], key: str) -> str:
    """``value [low, high]``, or the value alone when the interval is undefined (too few items)."""
    low = row.get(key + "_low")
    if low is None or (isinstance(low, float) and math.isnan(low)):
        return fmt(row.get(key))
    return f"{fmt(row.get(key))} [{fmt(low)}, {fmt(row.get(key + '_high'))}]"


def _errors(row: dict[str, Any], key: str) -> str:
    causes = row.get("error_causes")
    return f"{fmt(row.get(key))} ({causes})" if causes else fmt(row.get(key))


def _reported(row: dict[str, Any], key: str) -> str:
    """A server figure: None means the server did not report it, which is not 0."""
    value = row.get(key)
    return "not reported" if value is None else fmt(value, 4)


FORMATS = {
    "text": lambda row, key: fmt(row.get(key)),
    "ci": interval,
    "errors": _errors,
    "reported": _reported,
    **{f"{digits}f": (lambda d: lambda row, key: fmt(row.get(key), d))(digits) for digits in range(4)},
}
"""format -> (row, key) -> the text a table cell shows."""

TEXT_FORMATS = ("text", "errors")  # left-aligned in HTML


def cell(row: dict[str, Any], column: Column) -> str:
    """The text of one table cell, the same in Markdown and HTML."""
    return FORMATS[column.format](row, column.key)


EVIDENCE = [
    Column("evidence_all", "all evidence kept [95%]", "ci"),
    Column("evidence_all_n", "n (evidence)"),
]
EVIDENCE_SHARE = [Column("evidence_share", "share of evidence kept [95%]", "ci")]
CELL = [Column("task", "task"), Column("strategy", "strategy"), Column("budget", "budget")]

SUMMARY = [
    *CELL,
    Column("n_items", "items"),
    Column("results", "results"),
    Column("violations", "violations"),
    Column("errors", "errors (causes)", "errors"),
    Column("plugin_errors", "strategy failures (scored 0)"),
    Column("harness_errors", "harness errors"),
    Column("incomplete", "incomplete"),
    Column("violation_rate", "violation rate", "3f"),
    Column("quality_all", "quality (all; violations, strategy errors = 0) [95%]", "ci"),
    Column("quality_all_n", "n (all)"),
    Column("quality_scored", "quality (scored; strategy errors left out) [95%]", "ci"),
    Column("quality_scored_n", "n (scored)"),
    Column("quality_admitted", "quality (admitted only) [95%]", "ci"),
    Column("quality_admitted_n", "n (admitted)"),
]
"""The summary per cell of a run that called the model (evidence columns appended when marked)."""

USAGE = [
    Column("strategy", "strategy"),
    Column("regime", "regime"),
    Column("budget", "budget"),
    Column("used_tokens_mean", "used tokens mean", "1f"),
    Column("used_tokens_max", "used tokens max", "0f"),
    Column("utilisation_mean", "utilisation mean", "3f"),
    Column("utilisation_max", "utilisation max", "3f"),
    Column("latency_p50_s", "model latency p50 (s)", "2f"),
    Column("latency_p95_s", "model latency p95 (s)", "2f"),
    Column("model_calls", "model calls"),
    Column("cache_hits", "cache hits"),
    Column("strategy_p50_s", "strategy time p50 (s)", "3f"),
    Column("strategy_p95_s", "strategy time p95 (s)", "3f"),
    Column("served_prompt_tokens", "server prompt tokens", "reported"),
    Column("completion_tokens", "completion tokens"),
    Column("aux_calls", "aux calls"),
    Column("aux_prompt_tokens", "aux prompt tokens"),
    Column("aux_completion_tokens", "aux completion tokens"),
    Column("cost", "cost", "reported"),
]
"""Budget use, time and tokens per cell (latency over calls made: cache hits apart)."""

PROMPTS_ONLY = [
    *CELL,
    Column("n_items", "items"),
    Column("admitted", "admitted"),
    Column("violations", "violations"),
    Column("errors", "errors (causes)", "errors"),
    Column("violation_rate", "violation rate", "3f"),
]
PROMPTS_ONLY_USE = [
    Column("used_tokens_mean", "used tokens mean", "1f"),
    Column("used_tokens_max", "used tokens max", "0f"),
    Column("utilisation_mean", "utilisation mean", "3f"),
    Column("utilisation_max", "utilisation max", "3f"),
    Column("strategy_p50_s", "strategy time p50 (s)", "3f"),
    Column("strategy_p95_s", "strategy time p95 (s)", "3f"),
]


def summary_columns(prompts_only: bool, evidence: bool) -> list[Column]:
    """The summary per cell's columns: quality and violations, or a prompts-only run's compliance
    and budget use; the evidence columns where the task marks evidence."""
    if prompts_only:
        return PROMPTS_ONLY + (EVIDENCE + EVIDENCE_SHARE if evidence else []) + PROMPTS_ONLY_USE
    return SUMMARY + (EVIDENCE if evidence else [])
