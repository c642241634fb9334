"""Reports on a run directory: tables (CSV, Markdown, JSON), plots and a static HTML site.

``write_report(run_dir)`` writes everything to ``run_dir/report/`` and returns the paths.
It refuses (ReportError) when the manifest does not version a plugin that produced rows.
scipy and matplotlib load only when a report is written, so the CLI starts quickly.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .data import ReportError

FORMATS = ("csv", "md", "html", "json", "png")
"""Every output a report can write; ``png`` is the plots, which ``html`` (embedding them) writes too."""

__all__ = ["FORMATS", "ReportError", "summarise", "write_report"]


def summarise(rows: Iterable[dict[str, Any]], binary: bool, prompts_only: bool = False) -> dict[Any, dict[str, Any]]:
    """(task, strategy, budget) -> the cell's summary from terminal rows: what the report's
    summary table shows, and what the terminal summary at the end of ``run`` prints (one
    computation for both; see ``tables.summarise``)."""
    from .tables import summarise as cells

    return cells(rows, binary, prompts_only)


def write_report(run_dir: Path, reference: str | None = None, formats: Iterable[str] = FORMATS) -> dict[str, Path]:
    """Write the report into ``run_dir/report/``; returns name -> path of every file written.

    Only the ``formats`` asked for are written (``html`` writes the plots too: it embeds them)."""
    from .writer import write_report as write

    return write(run_dir, reference=reference, formats=formats)
