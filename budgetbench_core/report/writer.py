"""Writes every output of a report: CSV, Markdown and JSON tables, the plots, the HTML site."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import FORMATS, tables
from .columns import USAGE, Column, cell, fmt, interval, summary_columns
from .curve import (
    answerable_without_memory,
    auc_ranking,
    control_findings,
    curve_rows,
    is_control,
    ranking_findings,
)
from .data import ReportError, RunData, load_run
from .evidence import evidence_columns, has_evidence, item_evidence, prompts_only_summary
from .html import item_page_name, write_html
from .judge_audit import judge_audit_section
from .ledger import ledger_markdown, ledger_table
from .noise import noise_table
from .pass_k import PASS_K_INTRO, pass_k_section
from .pivot import best_at_each_budget
from .plots import write_plots


def _write_csv(path: Path, rows: list[dict[str, Any]], empty_columns: Iterable[str]) -> Path:
    columns = list(rows[0]) if rows else list(empty_columns)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    return path


def _without_nan(value: Any) -> Any:
    """JSON has no NaN: an undefined statistic becomes null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nan(v) for v in value]
    return value


def _findings(data: RunData, summary, paired, errors, mismatches, pivot) -> list[str]:
    findings = []
    if data.approximate:
        findings.append(
            "Token counts are APPROXIMATE: at least one row was counted with an approximate tokenizer; "
            "every table is labelled so."
        )
    findings += tables.crossovers(pivot)
    findings += tables.monotone_note(summary)
    distinguished = [r for r in paired if r["result"] in ("higher", "lower")]
    for row in distinguished:
        findings.append(
            f"{row['task']}: {row['strategy']}@{row['budget']} is {row['result']} than {row['reference']} "
            f"by {row['delta']:+.3f} [{row['delta_low']:+.3f}, {row['delta_high']:+.3f}] over "
            f"{row['paired_items']} paired items."
        )
    if paired and not distinguished:
        findings.append("No paired difference is distinguished from zero at 95%: the report makes no ranking claim.")
    few = [r for r in paired if r["result"] in tables.stats.NO_VERDICT]
    if few:
        findings.append(
            f"{len(few)} paired comparisons have too few items to separate the two cells (no outcome "
            f"over so few items could be a result); the most needed: {max(r['needed_items'] for r in few)} items."
        )
    for row in summary:
        if row["violations"]:
            findings.append(
                f"{row['task']}: {row['strategy']}@{row['budget']} exceeded the budget on "
                f"{row['violations']} of {row['results'] + row['violations']} rows "
                f"(quality all {fmt(row['quality_all'])} vs admitted {fmt(row['quality_admitted'])})."
            )
    findings += tables.completeness(data, summary)
    failures = [r for r in errors if r["phase"] in tables.PLUGIN_PHASES]
    if failures:
        findings.append(
            f"{len(failures)} error rows caused by the strategy under test, scored 0 in quality (all) "
            "like violations (quality (scored) leaves them out; listed under Errors): "
            + tables.error_causes(r | {"event": "error"} for r in failures)
            + "."
        )
    if len(errors) > len(failures):
        findings.append(
            f"{len(errors) - len(failures)} error rows of the harness or server (not scored; listed under "
            "Errors): "
            + tables.error_causes(r | {"event": "error"} for r in errors if r["phase"] not in tables.PLUGIN_PHASES)
            + "."
        )
    for task, lost in sorted(data.ingest_losses().items()):
        findings.append(
            f"{task}: {len(lost)} items lost memory sessions at ingest and are dropped from every paired "
            f"comparison: {', '.join(sorted(lost))}."
        )
    served_over = [r for r in data.rows.values() if r["event"] == "violation" and r.get("phase") == "served"]
    reported = data.served_checked()
    if mismatches:
        findings.append(
            f"Served-count audit: on {len(mismatches)} result rows the server's prompt size differs from "
            f"our count (largest difference {max(abs(r['difference']) for r in mismatches)} tokens; "
            f"{len(reported)} prompts the server counted in all)."
        )
    if served_over:
        findings.append(
            f"Served-count audit: on {len(served_over)} calls the server counted the prompt over the budget "
            f"(violations of phase `served`), though our count admitted it."
        )
    if not reported:
        findings.append("Served-count audit: the server reported no prompt size, so nothing could be compared.")
    elif not mismatches and not served_over:
        findings.append(f"Served-count audit: every server-reported prompt size ({len(reported)}) matched our count.")
    if data.served_unreported():
        findings.append(
            f"Served-count audit: not reported by the server on {data.served_unreported()} result rows "
            f"(counted apart from mismatches)."
        )
    return findings


def run_header(manifest: dict[str, Any]) -> dict[str, Any]:
    """Model, tokenizer, grader, task (with every option it ran with) and where plugins ran (their
    isolation and sandbox), a line each, for the top of every report."""
    model = manifest.get("model") or {}
    tokenizer = manifest.get("tokenizer") or {}
    grader = manifest.get("grader") or {}
    config = manifest.get("config") or {}
    task = manifest.get("task") or {}  # its options as the task resolved them, defaults included
    isolation = (manifest.get("identity") or {}).get("isolation") or {}
    served = model.get("model") or config.get("model")
    where = model.get("model_file") or model.get("api_base")
    return {
        "model": f"{served} ({model.get('backend', '?')}{', ' + str(where) if where else ''})",
        "tokenizer": f"{tokenizer.get('id', '?')} ({tokenizer.get('backend', '?')}, "
        f"{'exact' if tokenizer.get('exact') else 'APPROXIMATE'})",
        "grader": f"{grader.get('name', '?')} v{grader.get('version', '?')} "
        f"({'binary' if grader.get('binary') else 'graded'}"
        f"{', judge ' + str(grader['judge_model']) if grader.get('judge_model') else ''})",
        "task": f"{task.get('name') or config.get('task')} "
        f"{json.dumps(task.get('options') or config.get('task_options') or {}, sort_keys=True)}",
        "plugins ran": (
            f"isolation {isolation['isolation']}, sandbox {isolation['sandbox']}"
            if isolation
            else "not recorded (a run of an older release)"
        ),
    }


def _with_category_evidence(data: RunData, categories: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cells = data.cells()
    for row in categories:
        rows = [
            r
            for r in cells[(row["task"], row["strategy"], row["budget"])]
            if (r.get("category") or "(none)") == row["category"]
        ]
        row.update(evidence_columns(rows))
    return categories


PROMPTS_ONLY_POLICY = (
    "Errors (failed strategy or counting calls) are never scored: they are counted per cell with "
    "their causes and listed. Evidence recall counts a violation as nothing kept (no prompt "
    "reaches the model) and leaves out items the task marks no evidence for."
)


def is_prompts_only(data: RunData) -> bool:
    """A prompts-only run (``budgetbench run --prompts-only``): no model call, no quality."""
    return bool(data.manifest.get("config", {}).get("prompts_only")) or any(
        r["event"] == "admitted" for r in data.rows.values()
    )


def _prompts_only_tables(data: RunData) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(summary, categories) of a prompts-only run: compliance, budget use, evidence recall."""
    summary, categories = [], []
    for (task, strategy, budget), rows in data.cells().items():
        regime = (data.manifest.get("strategies", {}).get(strategy) or {}).get("regime")
        summary.append(
            {
                "task": task,
                "strategy": strategy,
                "regime": regime,
                "budget": budget,
                **prompts_only_summary(rows, budget),
                "approximate_counts": data.approximate,
            }
        )
        by_category: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_category.setdefault(row.get("category") or "(none)", []).append(row)
        for category, category_rows in sorted(by_category.items()):
            categories.append(
                {
                    "task": task,
                    "category": category,
                    "strategy": strategy,
                    "budget": budget,
                    **prompts_only_summary(category_rows, budget),
                    "approximate_counts": data.approximate,
                }
            )
    return summary, sorted(categories, key=lambda r: (r["task"], r["category"]))


def _notes(data: RunData) -> list[str]:
    """The run's own notes (``run --note``), first: what its maker says its numbers can and cannot show."""
    notes = (data.manifest.get("config") or {}).get("notes") or []
    return [f"Note: {note}" for note in notes if isinstance(note, str) and note.strip()]


def _prompts_only_findings(summary: list[dict[str, Any]], pivot, errors, curve_findings: list[str]) -> list[str]:
    findings = [
        "Prompts-only run: strategies, the budget gate, the audit and evidence recall ran for every cell; "
        "no model was called, so there is no quality, latency or served-count figure.",
        *curve_findings,
    ]
    findings += tables.crossovers(pivot)
    for row in summary:
        if row["violations"]:
            findings.append(
                f"{row['task']}: {row['strategy']}@{row['budget']} exceeded the budget on "
                f"{row['violations']} of {row['admitted'] + row['violations']} prompts."
            )
    if not any(r["evidence_all_n"] for r in summary):
        findings.append("The task marks no evidence: no evidence recall is reported.")
    if errors:
        findings.append(
            f"{len(errors)} error rows (listed under Errors): "
            + tables.error_causes(r | {"event": "error"} for r in errors)
            + "."
        )
    return findings


def _curve_context(data: RunData, summary: list[dict[str, Any]], metric: str, values, binary: bool) -> dict[str, Any]:
    """Budget curves (effective budget, area), the headline ranking, the noise floor, controls."""
    cells = data.cells()
    price = data.manifest.get("price")
    ledger = ledger_table(cells, price)
    per_cell = {(r["task"], r["strategy"], r["budget"]): r for r in ledger}
    for row in summary:
        figures = per_cell[(row["task"], row["strategy"], row["budget"])]
        row.update(
            tokens_per_question=figures["tokens_per_question"], cost_per_question=figures["cost_per_question_usd"]
        )
    curves, areas = curve_rows(summary, values, metric) if values else ([], {})
    ranking = auc_ranking(curves, areas)
    noise = noise_table(cells, metric)
    findings = ranking_findings(ranking, curves)
    if noise:
        worst = max(noise, key=lambda r: r["flip_rate"])
        findings.append(
            f"Noise floor from {worst['repeats']} repeats: outcomes flip between repeats on up to "
            f"{worst['flip_rate']:.0%} of items ({worst['strategy']}@{worst['budget']}); see the noise table."
        )
    controls = sorted({r["strategy"] for r in summary if is_control(r["strategy"])})
    answerable, without_answerable = answerable_without_memory(summary, values, binary) if values else ([], [])
    findings += control_findings(curves, answerable, without_answerable)
    return {
        "curves": curves,
        "ranking": ranking,
        "noise": noise,
        "pass_k": pass_k_section(cells) if metric == "quality_all" else {},
        "controls": controls,
        "answerable": answerable,
        "without_answerable": without_answerable,
        "curve_findings": findings,
        "ledger": ledger,
        "price": price,
    }


def build_context(data: RunData, reference: str | None = None) -> dict[str, Any]:
    """Everything the outputs show, as plain data (also the JSON report)."""
    cells = data.cells()
    prompts_only = is_prompts_only(data)
    evidence = has_evidence(data.rows.values())
    if prompts_only:
        summary, categories = _prompts_only_tables(data)
        evidence_values = (lambda cell: item_evidence(cells.get(cell, []))[0]) if evidence else None
        curve_context = _curve_context(data, summary, "evidence_all", evidence_values, True)
        pivot = (
            best_at_each_budget(summary, evidence_values, "evidence_all") if evidence_values else []
        )  # no quality, no marks: nothing to rank
        evidence_pivot: list[dict] = []
        errors = [r | {"page": item_page_name(r["item_id"])} for r in tables.error_table(data)]
        return {
            "title": data.manifest.get("config", {}).get("task") or data.run_dir.name,
            "run_dir": str(data.run_dir),
            "written": datetime.now(UTC).isoformat(timespec="seconds"),
            "manifest": data.manifest,
            "header": run_header(data.manifest),
            "prompts_only": True,
            "evidence": evidence,
            "pivot": pivot,
            "evidence_pivot": evidence_pivot,
            "approximate": data.approximate,
            "error_policy": PROMPTS_ONLY_POLICY,
            "reference": reference,
            "summary": summary,
            "paired": [],
            "categories": categories,
            "errors": errors,
            "ingest_lost": [],
            "served_mismatches": [],
            "served_checked": 0,
            "served_unreported": 0,
            "incomplete": [],
            "findings": _notes(data)
            + _prompts_only_findings(summary, pivot, errors, curve_context.pop("curve_findings")),
            **curve_context,
        }
    summary = tables.summary_table(data)
    if evidence:
        for row in summary:
            row.update(evidence_columns(cells[(row["task"], row["strategy"], row["budget"])]))
    quality_values = lambda cell: tables.item_values(cells.get(cell, []))  # noqa: E731
    curve_context = _curve_context(data, summary, "quality_all", quality_values, data.binary)
    pivot = best_at_each_budget(summary, quality_values)
    evidence_pivot = (
        best_at_each_budget(summary, lambda cell: item_evidence(cells.get(cell, []))[0], "evidence_all")
        if evidence
        else []
    )
    paired = tables.paired_table(data, reference)
    errors = [r | {"page": item_page_name(r["item_id"])} for r in tables.error_table(data)]
    mismatches = [
        {
            "task": r["task"],
            "strategy": r["strategy"],
            "budget": r["budget"],
            "repeat": r["repeat"],
            "item_id": r["item_id"],
            "page": item_page_name(str(r["item_id"])),
            "prompt_tokens": r["prompt_tokens"],
            "served_prompt_tokens": r["served_prompt_tokens"],
            "difference": r["served_prompt_tokens"] - r["prompt_tokens"],
        }
        for r in sorted(data.served_mismatches(), key=lambda r: (r["strategy"], r["budget"], r["item_id"]))
    ]
    ingest_lost = [
        {"task": task, "item_id": item, "strategy": row["strategy"], "cause": row.get("cause")}
        for task, lost in sorted(data.ingest_losses().items())
        for item, row in sorted(lost.items())
    ]
    served_checked = len(data.served_checked())
    return {
        "title": data.manifest.get("config", {}).get("task") or data.run_dir.name,
        "run_dir": str(data.run_dir),
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "manifest": data.manifest,
        "header": run_header(data.manifest),
        "prompts_only": False,
        "evidence": evidence,
        "pivot": pivot,
        "evidence_pivot": evidence_pivot,
        "approximate": data.approximate,
        "error_policy": tables.ERROR_POLICY,
        "reference": reference,
        "summary": summary,
        "paired": paired,
        "categories": _with_category_evidence(data, tables.category_table(data))
        if evidence
        else tables.category_table(data),
        "errors": errors,
        "ingest_lost": ingest_lost,
        "served_mismatches": mismatches,
        "served_checked": served_checked,
        "served_unreported": data.served_unreported(),
        "incomplete": tables.incomplete_cells(summary),
        "findings": _notes(data)
        + tables.incomplete_cells(summary)
        + curve_context.pop("curve_findings")
        + _findings(data, summary, paired, errors, mismatches, pivot),
        **curve_context,
    }


def _pivot_cell(row: dict[str, Any] | None, metric: str) -> str:
    if row is None:
        return "–"
    value = f"{fmt(row.get(metric))} [{fmt(row.get(metric + '_low'))}, {fmt(row.get(metric + '_high'))}]"
    failed, harness = row.get("plugin_errors", 0), row.get("harness_errors", row.get("errors", 0))
    return (
        f"{value}, viol. {fmt(row.get('violation_rate'), 2)}"
        + (f", {failed} failed (0)" if failed else "")
        + (f", {harness} err., incomplete" if harness else "")
    )


def _auc_text(row: dict[str, Any]) -> str:
    if row.get("auc") is None or (isinstance(row["auc"], float) and math.isnan(row["auc"])):
        return row["effective_status"]
    text = interval(row, "auc")
    if row.get("auc_low") is None or math.isnan(row["auc_low"]):
        text += f" (too few items for an interval: {row['n_items']} < {tables.stats.MIN_PAIRED_ITEMS})"
    return text


def _headline_markdown(context: dict[str, Any]) -> list[str]:
    """The headline: strategies ranked by area under the budget curve, said so."""
    if not context["ranking"]:
        return []
    lines = [
        "## Headline: strategies ranked by area under the budget curve (AUC)",
        "",
        *[f"**{note}**\n" for note in context["incomplete"]],
        "The ranking uses the AUC: each strategy's "
        + (
            "evidence recall"
            if context["prompts_only"]
            else "quality (all items, violations and the strategy's errors = 0)"
        )
        + " integrated over log(budget) from the smallest to the largest tier run, normalised to [0, 1], "
        "over the items it scored at every tier, with its 95% interval. Each strategy is compared with the "
        "next one down by the paired difference of per-item areas; MDE is the smallest difference that "
        "comparison detects with 80% power at its n. Controls are never ranked.",
        "",
        "| rank | task | strategy | AUC [95%] | items | vs next | difference [95%] | result | MDE |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in context["ranking"]:
        lines.append(
            f"| {r['rank']} | {r['task']} | {r['strategy']} | {interval(r, 'auc')} | {r['n_items']} | "
            f"{fmt(r['next'])} | {interval(r, 'delta_next') if r['next'] else '–'} | {fmt(r.get('result'))} | "
            f"{fmt(r.get('mde'))} |"
        )
    return lines + [""]


def _curve_markdown(context: dict[str, Any], note: str) -> list[str]:
    """Budget curves, controls and the noise floor, as Markdown sections."""
    lines: list[str] = []
    if context["curves"]:
        lines += [
            f"## Budget curves{note}",
            "",
            "Effective budget: the smallest tier keeping at least 85% of the strategy's best score, with the "
            "range of tiers consistent with the data (95%). AUC: see the headline. Controls are marked.",
            "",
            "| task | strategy | items | score per tier | best | effective budget [range] | AUC [95%] |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in context["curves"]:
            name = f"{c['strategy']} (control)" if c["control"] else c["strategy"]
            scores = ", ".join(f"{b}: {fmt(s)}" for b, s in zip(c["budgets"], c["scores"]))
            lines.append(
                f"| {c['task']} | {name} | {c['n_items']} | {scores} | {fmt(c['best_score'])} | "
                f"{c['effective_text']} | {_auc_text(c)} |"
            )
        lines.append("")
    if context["controls"]:
        lines += [
            "## Controls",
            "",
            f"Harness controls (never ranked): {', '.join(context['controls'])}. An item control:no_memory "
            "(system prompt and question alone) answers correctly at a tier is *answerable without memory* there; "
            "every cell's score is also shown without those items.",
            "",
        ]
        if context["answerable"]:
            lines += ["| task | budget | answerable without memory | of items | items |", "|---|---|---|---|---|"]
            lines += [
                f"| {f['task']} | {f['budget']} | {f['answerable']} | {f['control_items']} | {f['items'] or '–'} |"
                for f in context["answerable"]
            ]
            lines += [
                "",
                "| task | strategy | budget | score (all items) | n | score without them [95%] | n | left out |",
                "|---|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['task']} | {r['strategy']}{' (control)' if r['control'] else ''} | {r['budget']} | "
                f"{fmt(r['score_all'])} | {r['n_all']} | {interval(r, 'score_remaining')} | {r['n_remaining']} | "
                f"{r['left_out']} |"
                for r in context["without_answerable"]
            ]
            lines.append("")
    lines += ledger_markdown(context["ledger"], context.get("price"), note)
    lines += _pass_k_markdown(context["pass_k"], note)
    if context["noise"]:
        lines += [
            f"## Noise floor from repeats{note}",
            "",
            "Per cell: the share of items whose outcome is not the same on every repeat (flip rate), how much two "
            "single repeats disagree item by item (discordance, or the sd of the difference for graded values), "
            "and the noise floor: the smallest difference between two single-repeat results over the cell's items "
            "that a paired comparison detects (95%, 80% power) when they disagree only by this repeat noise.",
            "",
            "| task | strategy | budget | repeats | items | flip rate | flipped | repeat spread | noise floor |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['task']} | {r['strategy']} | {r['budget']} | {r['repeats']} | {r['items_repeated']} | "
            f"{fmt(r['flip_rate'])} | {r['flipped_items']} | {r['spread_kind']} {fmt(r['repeat_spread'])} | "
            f"{fmt(r['noise_floor'])} |"
            for r in context["noise"]
        ]
        lines.append("")
    return lines


def _pass_k_markdown(section: dict[str, Any], note: str) -> list[str]:
    """The pass^k section (``pass_k.pass_k_section``) as Markdown lines; none without repeats."""
    if not section:
        return []
    ks = section["k"]
    lines = [
        f"## pass^k from repeats{note}",
        "",
        PASS_K_INTRO,
        "",
        "| task | strategy | budget | items | trials | "
        + " | ".join(f"pass^{k}" for k in ks)
        + " | flip rate | flipped |",
        "|---|---|---|---|---|" + "---|" * len(ks) + "---|---|",
    ]
    lines += [
        f"| {r['task']} | {r['strategy']} | {r['budget']} | {r['tasks']} | {', '.join(map(str, r['trials']))} | "
        + " | ".join(fmt(r["pass_k"].get(k)) for k in ks)
        + f" | {fmt(r['flip_rate'])} | {len(r['flipped_tasks'])} |"
        for r in section["cells"]
    ]
    return lines + [""]


def _markdown(context: dict[str, Any]) -> str:
    note = " (approximate token counts)" if context["approximate"] else ""

    def table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
        return lines + [""]

    def spec_table(rows: list[dict[str, Any]], columns: list[Column]) -> list[str]:
        lines = ["| " + " | ".join(c.heading for c in columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows]
        return lines + [""]

    lines = [f"# BudgetBench report: {context['title']}", ""]
    lines += [f"- {name}: {value}" for name, value in context["header"].items()] + [""]
    if context["prompts_only"]:
        lines += ["**Prompts-only run**: no model was called; evidence recall, compliance and budget use only.", ""]
    lines += _headline_markdown(context)
    for grid in context["pivot"] + context["evidence_pivot"]:
        what = "quality" if grid["metric"] == "quality_all" else "evidence recall (all evidence kept)"
        lines += [
            f"## Best at each budget, {what}: {grid['task']}{note}",
            "",
            "| strategy | " + " | ".join(str(b) for b in grid["budgets"]) + " |",
            "|---|" + "---|" * len(grid["budgets"]),
        ]
        for strategy in grid["strategies"]:
            cells = [grid["cells"][strategy].get(b) for b in grid["budgets"]]
            name = f"{strategy} (control, not ranked)" if strategy in grid.get("controls", ()) else strategy
            lines.append(f"| {name} | " + " | ".join(_pivot_cell(c, grid["metric"]) for c in cells) + " |")
        lines.append("| **best** | " + " | ".join(grid["best"][b]["text"] for b in grid["budgets"]) + " |")
        lines.append("")
    if context["approximate"]:
        lines += ["**Approximate token counts**: every table below is approximate.", ""]
    lines += ["## Findings", ""] + [f"- {f}" for f in context["findings"]] + ["", context["error_policy"], ""]
    lines += _curve_markdown(context, note)
    evidence = (
        [
            "evidence_all",
            "evidence_all_low",
            "evidence_all_high",
            "evidence_all_n",
            "evidence_share",
            "evidence_share_low",
            "evidence_share_high",
        ]
        if context["evidence"]
        else []
    )
    if context["prompts_only"]:
        lines += [f"## Evidence recall and compliance per cell (prompts only){note}", ""] + spec_table(
            context["summary"], summary_columns(True, context["evidence"])
        )
        lines += [f"## Evidence recall per category (prompts only){note}", ""] + table(
            context["categories"], ["task", "category", "strategy", "budget", "n_items", "violations", *evidence[:4]]
        )
        if context["errors"]:
            lines += ["## Errors", ""] + table(
                context["errors"], ["strategy", "budget", "repeat", "item_id", "phase", "cause"]
            )
        return "\n".join(lines)
    lines += [f"## Summary per cell{note}", ""] + spec_table(
        context["summary"], summary_columns(False, context["evidence"])
    )
    lines += [f"## Budget use, time and tokens per cell{note}", ""] + spec_table(context["summary"], USAGE)
    episodic = [r for r in context["summary"] if "episodes" in r]
    if episodic:
        lines += [
            f"## Agent episodes per cell{note}",
            "",
            "Reward over items with its 95% interval (violations = 0, errors left out); turns, calls and tool "
            "errors are means per episode; peak is the largest prompt of any call; end_* count how the "
            "episodes ended.",
            "",
        ] + table(
            episodic,
            [
                "task",
                "strategy",
                "budget",
                "episodes",
                "reward",
                "reward_low",
                "reward_high",
                "reward_n",
                "turns_mean",
                "calls_mean",
                "peak_prompt_tokens_max",
                "tool_errors_mean",
                *(f"end_{r}" for r in tables.END_REASONS),
            ],
        )
    lines += [f"## Paired differences{note}", ""] + table(
        context["paired"],
        [
            "task",
            "strategy",
            "budget",
            "reference",
            "paired_items",
            "delta",
            "delta_low",
            "delta_high",
            "result",
            "mde",
            "missing_in_candidate",
            "missing_in_reference",
            "dropped_ingest_loss",
        ],
    )
    lines += [f"## Per category{note}", ""] + table(
        context["categories"],
        [
            "task",
            "category",
            "strategy",
            "budget",
            "n_items",
            "violations",
            "quality_all",
            "quality_all_low",
            "quality_all_high",
            "quality_admitted",
            *evidence[:1],
        ],
    )
    if context["errors"]:
        lines += ["## Errors", ""] + table(
            context["errors"], ["strategy", "budget", "repeat", "item_id", "phase", "cause"]
        )
    return "\n".join(lines)


def write_report(run_dir: Path, reference: str | None = None, formats: Iterable[str] = FORMATS) -> dict[str, Path]:
    """Write the report into ``run_dir/report/``; returns name -> path of every file written."""
    formats = list(formats)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ReportError(f"unknown report format(s) {unknown}; choose from {list(FORMATS)}")
    data = load_run(Path(run_dir), with_prompts="html" in formats)
    context = build_context(data, reference)
    # issue 27: the judge audit card (report/judge_audit.py) first in the findings of every judged run
    judge_audit_section(data.run_dir, data.rows.values()).add_to(context)
    out = data.run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    plots: dict[str, Path] = {}
    if "png" in formats or "html" in formats:  # the HTML embeds the plots
        plots = write_plots(
            context["summary"],
            out,
            data.approximate,
            context["categories"],
            "evidence_all" if context["prompts_only"] else "quality_all",
        )
        paths.update({f"plot_{name}": path for name, path in plots.items()})
    if "csv" in formats:
        paths["summary_csv"] = _write_csv(out / "summary.csv", context["summary"], ["task", "strategy", "budget"])
        paths["paired_csv"] = _write_csv(
            out / "paired.csv", context["paired"], ["task", "strategy", "budget", "reference", "paired_items", "delta"]
        )
        paths["categories_csv"] = _write_csv(
            out / "categories.csv", context["categories"], ["task", "category", "strategy", "budget"]
        )
        paths["errors_csv"] = _write_csv(
            out / "errors.csv",
            context["errors"],
            ["task", "strategy", "budget", "repeat", "item_id", "phase", "cause", "page"],
        )
    if "md" in formats:
        paths["md"] = out / "report.md"
        paths["md"].write_text(_markdown(context), encoding="utf-8")
    if "json" in formats:
        paths["json"] = out / "report.json"
        body = _without_nan({k: v for k, v in context.items() if k != "manifest"})
        paths["json"].write_text(
            json.dumps(body, indent=1, ensure_ascii=False, default=str, allow_nan=False), encoding="utf-8"
        )
    if "html" in formats:
        paths["html"] = write_html(out, data, context, plots)
    return paths


def _comparison_markdown(context: dict[str, Any]) -> str:
    def table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        return lines + ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows] + [""]

    lines = [
        f"# {context['title']}",
        "",
        f"Reference run: {context['reference_run']}. Paired on "
        + (
            "quality (all items, violations = 0)."
            if context["metric"] == "quality_all"
            else "evidence recall (all evidence kept; a run is prompts-only)."
        ),
        "",
    ]
    if context["different_data"]:
        lines += [
            "**The runs were made on different task data** (--allow-different-data): paired items with the "
            "same id may be different questions.",
            "",
        ]
    lines += ["## Runs", ""] + table(
        context["runs"],
        ["run", "model", "tokenizer", "grader", "grader_version", "core_version", "data_hash", "run_dir"],
    )
    lines += ["## Cells", ""] + table(
        context["summary"],
        [
            "task",
            "strategy",
            "budget",
            "run",
            "n_items",
            "violation_rate",
            "errors",
            context["metric"],
            context["metric"] + "_low",
            context["metric"] + "_high",
        ],
    )
    lines += ["## Paired against the reference run", ""] + table(
        context["paired"],
        [
            "task",
            "strategy",
            "budget",
            "run",
            "reference_run",
            "paired_items",
            "delta",
            "delta_low",
            "delta_high",
            "result",
            "missing_in_run",
            "missing_in_reference",
            "missing_items",
        ],
    )
    if context["unmatched"]:
        lines += ["## Cells in one run only", ""] + table(
            context["unmatched"], ["task", "strategy", "budget", "only_in"]
        )
    return "\n".join(lines)


def write_comparison(
    run_dirs: list[Path], out: Path, labels: Iterable[str] = (), allow_different_data: bool = False
) -> dict[str, Path]:
    """``budgetbench compare``: write the cross-run report into ``out``; returns name -> path."""
    from .compare import compare_runs
    from .html import write_comparison_html
    from .plots import quality_vs_budget

    context = compare_runs(run_dirs, list(labels), allow_different_data)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    approximate = any(r["approximate"] for r in context["runs"])
    curves = [r | {"strategy": f"{r['run']}: {r['strategy']}"} for r in context["summary"]]
    plot = out / "quality_vs_budget.png"
    quality_vs_budget(
        curves,
        sorted({r["task"] for r in curves}),
        " (approximate counts)" if approximate else "",
        plot,
        context["metric"],
    )
    paths = {
        "plot_quality": plot,
        "summary_csv": _write_csv(out / "summary.csv", context["summary"], ["run", "task", "strategy", "budget"]),
        "paired_csv": _write_csv(
            out / "paired.csv",
            context["paired"],
            ["task", "strategy", "budget", "run", "reference_run", "paired_items", "delta"],
        ),
        "runs_csv": _write_csv(out / "runs.csv", context["runs"], ["run", "run_dir"]),
    }
    paths["md"] = out / "report.md"
    paths["md"].write_text(_comparison_markdown(context), encoding="utf-8")
    paths["json"] = out / "report.json"
    paths["json"].write_text(
        json.dumps(_without_nan(context), indent=1, ensure_ascii=False, default=str, allow_nan=False), encoding="utf-8"
    )
    paths["html"] = write_comparison_html(out, context, {"quality": plot})
    return paths
