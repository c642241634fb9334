"""Registers the ``swebench-verified`` task, its dataset, its grader and the ``budgetbench swebench`` commands."""

from pathlib import Path

import click

from budgetbench_core import Dataset, hookimpl

from .export import export_predictions
from .grader import PatchSimilarity
from .task import DATASET, SWEBenchVerified


@hookimpl
def register_tasks(register):
    register(SWEBenchVerified)


@hookimpl
def register_graders(register):
    register(PatchSimilarity)


@hookimpl
def register_datasets(register):
    register(
        Dataset(
            "swebench-verified",
            "princeton-nlp/SWE-bench_Verified",
            DATASET,
            {"data/test-00000-of-00001.parquet": "swebench_verified.parquet"},
            "SWE-bench Verified test split (500 instances)",
        )
    )


@hookimpl
def register_commands(cli):
    @cli.group("swebench")
    def swebench():
        """SWE-bench Verified: export predictions for the official evaluation."""

    @swebench.command("export")
    @click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
    @click.option(
        "--out",
        "-o",
        type=click.Path(path_type=Path),
        default=None,
        help="Folder for the JSONL files (default RUN_DIR/swebench_predictions).",
    )
    def swebench_export(run_dir, out):
        """Write a run's swebench-verified predictions in the official format, one file per cell."""
        cells = export_predictions(run_dir, out or run_dir / "swebench_predictions")
        for cell in cells:
            click.echo(f"{cell.path}: {cell.predictions} predictions ({cell.violations} over-budget, exported empty)")
            if cell.errors:
                click.echo(f"  left out, error rows without a prediction: {', '.join(cell.errors)}")
        click.echo("Evaluate where Docker is available (pip install swebench), for example:")
        click.echo(f"  {cells[0].evaluate_command}")
