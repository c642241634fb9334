"""Report commands: ``report`` (re)writes a run's report; ``gate``, ``plan`` and ``compare`` turn runs into decisions."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import FORMATS, write_report


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--reference",
    default=None,
    metavar="STRATEGY[@BUDGET]",
    help="Reference for paired deltas: one cell (STRATEGY@BUDGET) or a strategy compared at each "
    "budget. Default: the run's first strategy at each budget.",
)
@click.option(
    "--format",
    "formats",
    multiple=True,
    type=click.Choice(FORMATS),
    help="Output format; repeat for several. Default: all. png: the plots (html writes them too, "
    "as it embeds them); only the formats asked for are written.",
)
def report_command(run_dir: Path, reference: str | None, formats: tuple[str, ...]) -> None:
    """Tables, paired deltas, plots and a static HTML report in RUN_DIR/report/."""
    paths = write_report(run_dir, reference=reference, formats=formats or FORMATS)
    for name, path in paths.items():
        click.echo(f"{name}: {path}")


@click.command("gate")
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--max-violation-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Largest violation rate a checked cell may have.",
)
@click.option(
    "--max-error-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Largest share of error rows (never scored) a checked cell may have.",
)
@click.option(
    "--candidate", default=None, metavar="STRATEGY@BUDGET", help="The cell to gate; default: every cell of the run."
)
@click.option(
    "--reference",
    default=None,
    metavar="STRATEGY@BUDGET",
    help="Cell the candidate must not be worse than (needs --candidate and --margin).",
)
@click.option(
    "--margin",
    type=float,
    default=None,
    help="Non-inferiority: the lower bound of the paired delta's 95%% interval must be above -MARGIN.",
)
@click.option(
    "--min-items",
    type=click.IntRange(1),
    default=None,
    help="Fewest scored (and paired) items a checked cell or comparison may have.",
)
@click.option(
    "--metric",
    type=click.Choice(["quality", "evidence"]),
    default="quality",
    show_default=True,
    help="What --margin compares: quality, or evidence recall (all evidence kept; a prompts-only run has only this).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def gate_command(
    run_dir: Path,
    max_violation_rate: float,
    max_error_rate: float,
    candidate: str | None,
    reference: str | None,
    margin: float | None,
    min_items: int | None,
    metric: str,
    as_json: bool,
) -> None:
    """Release gate: exit 0 when every check passes, 1 when any fails (2: usage error)."""
    from .data import load_run
    from .release_gate import gate

    result = gate(
        load_run(run_dir, with_prompts=False),
        max_violation_rate,
        max_error_rate,
        reference,
        candidate,
        margin,
        min_items,
        metric,
    )
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        width = max(len(c.name) for c in result.checks)
        for check in result.checks:
            click.echo(f"{'PASS' if check.passed else 'FAIL'}  {check.name:<{width}}  {check.cell}: {check.figure}")
        failed = sum(not c.passed for c in result.checks)
        click.echo(
            f"gate {'passed' if result.passed else 'FAILED'}: {len(result.checks) - failed} of "
            f"{len(result.checks)} checks passed ({run_dir})"
        )
    sys.exit(0 if result.passed else 1)


@click.command("plan")
@click.argument("pilot_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--delta", type=float, default=None, help="Difference to detect (default: each pair's observed delta in the pilot)."
)
@click.option(
    "--margin",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Plan for non-inferiority at this margin instead of detection.",
)
@click.option(
    "--assume-delta",
    type=float,
    default=None,
    help="With --margin: the true delta assumed (default: the pilot's observed delta).",
)
@click.option(
    "--power",
    type=click.FloatRange(0.5, 1, max_open=True),
    default=0.8,
    show_default=True,
    help="Chance the planned run detects the difference if it is real.",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 1, max_open=True),
    default=0.95,
    show_default=True,
    help="Confidence level of the intervals the planned run will report.",
)
@click.option(
    "--metric",
    type=click.Choice(["quality", "evidence"]),
    default="quality",
    show_default=True,
    help="What to plan for: quality, or evidence recall (all evidence kept; a prompts-only pilot has only this).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def plan_command(
    pilot_dir: Path,
    delta: float | None,
    margin: float | None,
    assume_delta: float | None,
    power: float,
    confidence: float,
    metric: str,
    as_json: bool,
) -> None:
    """Items needed per strategy pair and tier, planned from a pilot run."""
    from rich.console import Console
    from rich.table import Table

    from .data import load_run
    from .plan import plan_table

    if assume_delta is not None and margin is None:
        raise click.UsageError("--assume-delta applies to --margin (non-inferiority) plans")
    if delta is not None and margin is not None:
        raise click.UsageError("give --delta (detect) or --margin (non-inferiority), not both")
    if delta == 0:
        raise click.UsageError("--delta must not be 0")
    rows = plan_table(load_run(pilot_dir, with_prompts=False), delta, margin, assume_delta, confidence, power, metric)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str).replace("NaN", "null"))
        return
    if not rows:
        click.echo(f"{pilot_dir}: fewer than two strategies at every tier: nothing to pair")
        return
    goal = (
        f"show non-inferiority at margin {margin:g} (lower bound of the paired delta above {-margin:g})"
        if margin is not None
        else "detect a difference (paired interval excludes 0)"
    )
    console = Console(width=max(100, Console().width))
    what = "evidence recall (all evidence kept)" if metric == "evidence" else "quality"
    console.print(
        f"{pilot_dir}: items needed to {goal} in {what} with {power:.0%} power at {confidence:.0%} confidence"
    )
    for task, budget in sorted({(r["task"], r["budget"]) for r in rows}):
        table = Table(title=f"{task} @ {budget}")
        for column in ("candidate", "reference", "pilot items", "observed delta", "spread", "effect", "items needed"):
            table.add_column(column, justify="left" if column in ("candidate", "reference") else "right")
        for r in (r for r in rows if (r["task"], r["budget"]) == (task, budget)):
            spread = "–" if r["spread"] != r["spread"] else f"{r['spread_kind']} {r['spread']:.3f}"
            table.add_row(
                r["candidate"],
                r["reference"],
                str(r["pilot_items"]),
                f"{r['observed_delta']:+.3f}",
                spread,
                f"{r['effect']:.3f}",
                str(r["needed"]) if r["needed"] else "–",
            )
        console.print(table)
        for r in (r for r in rows if (r["task"], r["budget"]) == (task, budget) and not r["needed"]):
            console.print(f"  {r['candidate']} vs {r['reference']}: {r['reason']}")


@click.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    default=Path("compare"),
    show_default=True,
    help="Directory for the comparison report.",
)
@click.option("--label", "labels", multiple=True, help="A name per run, in order (default: directory names).")
@click.option("--allow-different-data", is_flag=True, help="Compare runs made on different task data.")
def compare_command(run_dirs: tuple[Path, ...], out: Path, labels: tuple[str, ...], allow_different_data: bool) -> None:
    """One report across runs: the first run is the reference every other run is paired with."""
    from .writer import write_comparison

    paths = write_comparison(list(run_dirs), out, labels, allow_different_data)
    for name, path in paths.items():
        click.echo(f"{name}: {path}")
