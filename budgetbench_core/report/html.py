"""The static HTML report: index.html plus one drill-down page per item.

Rendered with jinja2 with autoescaping on, so dataset and model text (questions,
prompts, predictions) is always escaped. Plots are embedded as data URIs, so
index.html opens from disk with nothing else running.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from ..runlog import safe_name
from .columns import TEXT_FORMATS, USAGE, cell, fmt, summary_columns
from .data import RunData
from .ledger import (
    BREAK_EVEN_INTRO,
    OUTSIDE_INTRO,
    WORKER_PHASES,
    break_even_rows,
    fmt_figure,
    ledger_intro,
    network_rows,
)
from .pass_k import PASS_K_INTRO


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("budgetbench_core.report", "templates"),
        autoescape=select_autoescape(["html", "j2"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = fmt
    env.filters["figure"] = fmt_figure
    env.globals.update(
        ledger_intro=ledger_intro,
        break_even_rows=break_even_rows,
        network_rows=network_rows,
        BREAK_EVEN_INTRO=BREAK_EVEN_INTRO,
        OUTSIDE_INTRO=OUTSIDE_INTRO,
        WORKER_LABELS=[label for _, label in WORKER_PHASES],
        pass_k_intro=PASS_K_INTRO,
        summary_columns=summary_columns,
        usage_columns=USAGE,
        cell=cell,
        text_formats=TEXT_FORMATS,
    )
    env.filters["tojson_pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return env


def item_page_name(item_id: str) -> str:
    return f"items/{safe_name(item_id)}.html"


def _item_entries(data: RunData) -> dict[str, list[dict[str, Any]]]:
    """item_id -> one entry per terminal row, with the exact prompt that was sent (or refused)."""
    order = {s: i for i, s in enumerate(data.strategy_order())}
    entries: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for key in sorted(data.rows, key=lambda k: (k[0], order[k[1]], k[2], k[3])):
        audit = data.prompts.get(key) or {}
        entries[key[4]].append(
            {
                "key": key,
                "row": data.rows[key],
                "messages": audit.get("messages"),
                "prompt_hash": audit.get("prompt_hash"),
                "strategy_audit": audit.get("strategy_audit"),
                "aux_calls": data.aux_calls.get(key, []),
            }
        )
    return dict(sorted(entries.items()))


def write_html(out_dir: Path, data: RunData, context: dict[str, Any], plot_paths: dict[str, Path]) -> Path:
    env = _environment()
    images = {
        name: "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
        for name, path in plot_paths.items()
    }
    items = _item_entries(data)
    (out_dir / "items").mkdir(parents=True, exist_ok=True)
    item_template = env.get_template("item.html.j2")
    links = []
    for item_id, entries in items.items():
        page = item_page_name(item_id)
        first = entries[0]
        query = first["messages"][-1]["content"] if first["messages"] else None
        answer = next((e["row"].get("answer") for e in entries if "answer" in e["row"]), None)
        (out_dir / page).write_text(
            item_template.render(
                item_id=item_id,
                category=first["row"].get("category"),
                query=query,
                answer=answer,
                entries=entries,
                approximate=data.approximate,
            ),
            encoding="utf-8",
        )
        links.append(
            {
                "item_id": item_id,
                "page": page,
                "category": first["row"].get("category"),
                "marks": [(e["key"], e["row"]) for e in entries],
            }
        )
    path = out_dir / "index.html"
    path.write_text(env.get_template("index.html.j2").render(images=images, items=links, **context), encoding="utf-8")
    return path


def write_comparison_html(out_dir: Path, context: dict[str, Any], plot_paths: dict[str, Path]) -> Path:
    images = {
        name: "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
        for name, path in plot_paths.items()
    }
    path = out_dir / "index.html"
    path.write_text(
        _environment()
        .get_template("compare.html.j2")
        .render(images=images, approximate=any(r["approximate"] for r in context["runs"]), **context),
        encoding="utf-8",
    )
    return path
