"""``budgetbench taubench ...``: the leaderboard export and the regrade of a finished run."""

from __future__ import annotations

from pathlib import Path

import click

from budgetbench_core import hookimpl

RUN_DIR = click.Path(path_type=Path, exists=True, file_okay=False)


@hookimpl
def register_commands(cli):
    @cli.group("taubench")
    def taubench():
        """tau-bench: a leaderboard submission from runs, rewards regraded from stored episodes."""

    @taubench.command("export")
    @click.argument("run_dirs", nargs=-1, required=True, type=RUN_DIR)
    @click.option(
        "--out",
        "-o",
        type=click.Path(path_type=Path, dir_okay=False),
        required=True,
        help="submission.json to write; trajectories/ goes beside it.",
    )
    @click.option("--model-organization", required=True, help="Who made the model (upstream's model_organization).")
    @click.option("--submitting-organization", required=True, help="Who ran the evaluation.")
    @click.option("--email", default=None, help="Contact email for the submission.")
    @click.option("--model-name", default=None, help="Model name on the leaderboard (default: the run's --model).")
    @click.option("--strategy", default=None, help="The cell's strategy, when a run has more than one.")
    @click.option("--budget", type=int, default=None, help="The cell's budget, when a run has more than one.")
    @click.option("--data", default=None, help="A fixed domain folder: rewards regraded on it (one RUN_DIR).")
    def export_command(
        run_dirs, out, model_organization, submitting_organization, email, model_name, strategy, budget, data
    ):
        """Write upstream's submission.json and trajectory files from one run per domain (retail, airline, telecom)."""
        from .leaderboard import export
        from .replay import ReplayError

        try:
            submission = export(
                list(run_dirs),
                out,
                model_organization=model_organization,
                submitting_organization=submitting_organization,
                email=email,
                model_name=model_name,
                strategy=strategy,
                budget=budget,
                data=data,
            )
        except ReplayError as exc:
            raise click.UsageError(str(exc)) from None
        for domain, figures in submission["results"].items():
            shown = ", ".join(
                f"pass^{k} {figures[f'pass_{k}']:.1f}" for k in range(1, 5) if figures[f"pass_{k}"] is not None
            )
            click.echo(f"{domain}: {shown}")
        click.echo(
            f"{submission['submission_type']} submission written to {out} (trajectories in {out.parent / 'trajectories'})"
        )

    @taubench.command("regrade")
    @click.argument("run_dir", type=RUN_DIR)
    @click.option(
        "--out",
        "-o",
        type=click.Path(path_type=Path, file_okay=False),
        required=True,
        help="New folder for regrade.json and rewards.jsonl (never the run directory).",
    )
    @click.option("--data", default=None, help="The fixed domain folder (default: the run's data folder).")
    def regrade_command(run_dir, out, data):
        """Recompute every episode's reward from episodes.jsonl on (fixed) task data, with no model call."""
        from .regrade import regrade
        from .replay import ReplayError

        try:
            summary = regrade(run_dir, out, data)
        except ReplayError as exc:
            raise click.UsageError(str(exc)) from None
        click.echo(
            f"{summary['episodes']} episodes regraded, {summary['changed']} rewards changed; "
            f"run key {summary['run_key']} (from {summary['regraded_from_run_key']}); written to {out}"
        )
