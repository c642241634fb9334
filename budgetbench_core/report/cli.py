"""``budgetbench report RUN_DIR``: (re)write the report of a run directory."""

from __future__ import annotations

from pathlib import Path

import click

from . import FORMATS, write_report


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--reference", default=None, metavar="STRATEGY[@BUDGET]",
              help="Reference for paired deltas: one cell (STRATEGY@BUDGET) or a strategy compared at each "
                   "budget. Default: the run's first strategy at each budget.")
@click.option("--format", "formats", multiple=True, type=click.Choice(FORMATS),
              help="Output format; repeat for several. Default: all. Plots are always written.")
def report_command(run_dir: Path, reference: str | None, formats: tuple[str, ...]) -> None:
    """Tables, paired deltas, plots and a static HTML report in RUN_DIR/report/."""
    paths = write_report(run_dir, reference=reference, formats=formats or FORMATS)
    for name, path in paths.items():
        click.echo(f"{name}: {path}")
