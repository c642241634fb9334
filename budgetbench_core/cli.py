"""The ``budgetbench`` command line: run, demo, list-plugins, plus commands from plugins."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .config_file import config_option, copy_into_run
from .plugin_commands import check_plugin, data, new_plugin
from .plugins import PluginError, get_registry
from .report.cli import compare_command, gate_command, plan_command, report_command
from .runner import DEFAULT_BUDGETS, RunConfig, RunConfigError, run
from .runlog import RunLogError
from .tasks import TaskDataError

console = Console(stderr=True)

SECRET_OPTION_HINT = (
    "API keys are never taken on the command line (they would land in shell history and logs). "
    "Set the provider's environment variable instead, e.g. OPENAI_API_KEY or OPENROUTER_API_KEY."
)


def _parse_pairs(values: tuple[str, ...], option: str) -> dict[str, object]:
    """``key=value`` pairs; values parsed as JSON when they are valid JSON, else kept as text."""
    parsed: dict[str, object] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {raw!r}", param_hint=option)
        if "key" in key.lower() and "api" in key.lower():
            raise click.UsageError(SECRET_OPTION_HINT)
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return parsed


def _strategy_params(values: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """``strategy.key=value`` pairs grouped by strategy."""
    grouped: dict[str, dict[str, object]] = {}
    for key, value in _parse_pairs(values, "--strategy-param").items():
        strategy, dot, name = key.partition(".")
        if not dot:
            raise click.BadParameter(f"expected strategy.key=value, got {key!r}", param_hint="--strategy-param")
        grouped.setdefault(strategy, {})[name] = value
    return grouped


def _refuse_secret_option(ctx, param, value) -> None:
    """Callback of the hidden --api-key/--key options: click parses options before the
    command runs, so without them a key on the command line got click's generic error."""
    if value is not None:
        raise click.UsageError(SECRET_OPTION_HINT)


def execute(config: RunConfig, write_report: bool = True) -> None:
    """Run with progress bars, print the summary, then write the report."""
    with Progress(
        TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False,
    ) as progress:
        bars: dict[str, int] = {}

        def on_start(total: int, per_strategy: dict[str, int]) -> None:
            for name, cells in per_strategy.items():
                bars[name] = progress.add_task(name, total=cells)

        def advance(strategy: str, cells: int) -> None:
            progress.advance(bars[strategy], cells)

        summary = run(config, progress=advance, on_start=on_start)
    console.print(
        f"[bold]{summary.run_dir}[/]: {summary.cells_total} cells, {summary.cells_skipped} already done, "
        f"{summary.results} results, {summary.violations} violations, {summary.errors} errors, "
        f"{summary.model_calls} model calls, {summary.wall_s:.1f} s"
    )
    if write_report:
        from .report import write_report as build_report

        paths = build_report(summary.run_dir)
        console.print(f"report: {paths.get('html', summary.run_dir / 'report')}")


class BudgetBenchGroup(click.Group):
    """Turns the errors users can fix into one clear line instead of a traceback.

    Plugins' commands are added only when a command name is not the core's or the
    commands are listed (``--help``), so ``--version`` and core commands import no plugin.
    """

    _plugin_commands_added = False

    def _add_plugin_commands(self) -> None:
        if not self._plugin_commands_added:
            self._plugin_commands_added = True
            get_registry().add_commands(self)

    def list_commands(self, ctx):
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is None:
            self._add_plugin_commands()
            command = super().get_command(ctx, cmd_name)
        return command

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (PluginError, RunConfigError, TaskDataError, RunLogError, FileNotFoundError, ValueError) as exc:
            console.print(f"[red]error:[/] {exc}")
            sys.exit(2)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]: finished rows are saved; run the same command again to resume")
            sys.exit(130)


@click.group(cls=BudgetBenchGroup)
@click.version_option(package_name="budgetbench")
def cli() -> None:
    """BudgetBench: memory strategies for LLM agents under an exact input-token budget."""


def run_options(function):
    options = [
        click.option("--task", "-t", required=True, help="Task name (see list-plugins)."),
        click.option("--strategy", "-s", "strategies", multiple=True, required=True, help="Strategy name; repeat for several."),
        click.option("--budgets", "-b", default=" ".join(map(str, DEFAULT_BUDGETS)), show_default=True,
                     help="Budget tiers in input tokens, space or comma separated."),
        click.option("--model", "-m", default="local", show_default=True,
                     help="'local' (embedded SmolLM2), 'local:<gguf>', or a litellm model string."),
        click.option("--api-key", "--key", hidden=True, expose_value=False, callback=_refuse_secret_option),
        click.option("--api-base", default=None, help="Server address for openai/<name> models (MLX, vLLM, llama.cpp)."),
        click.option("--tokenizer", default=None, help="hf:<dir>, tiktoken:<encoding>, gguf:<file> or server. "
                     "Default: the backend's exact tokenizer."),
        click.option("--grader", default=None, help="Grader name (default: the task's)."),
        click.option("--judge-model", default=None, help="Model for model-based graders (litellm string or 'local')."),
        click.option("--task-option", "task_options", multiple=True, help="key=value passed to the task."),
        click.option("--strategy-param", "strategy_params", multiple=True, help="strategy.key=value passed to a strategy."),
        click.option("--limit", "-n", type=int, default=None, help="At most this many items (seeded selection)."),
        click.option("--repeats", type=int, default=1, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--max-concurrency", "-j", type=int, default=4, show_default=True),
        click.option("--temperature", type=float, default=0.0, show_default=True),
        click.option("--max-output-tokens", type=int, default=None, help="Default: the task's."),
        click.option("--retries", type=int, default=4, show_default=True, help="Retries for transport errors only."),
        click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True, help="Per model call, seconds."),
        click.option("--item-timeout", "item_timeout_s", type=float, default=600.0, show_default=True,
                     help="Per strategy call, seconds."),
        click.option("--max-ingest-loss", type=float, default=0.0, show_default=True,
                     help="Fraction of sessions a memory system may fail to ingest before the item is an error."),
        click.option("--out", "-o", type=click.Path(path_type=Path), default=None, help="Run directory (default runs/<task>)."),
        click.option("--no-report", is_flag=True, help="Do not write the report at the end."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = [int(b) for b in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"budgets must be integers, got {text!r}", param_hint="--budgets") from None
    if not budgets or min(budgets) <= 0:
        raise click.BadParameter("give at least one positive budget", param_hint="--budgets")
    return budgets


@cli.command("run")
@config_option
@run_options
def run_command(task, strategies, budgets, out, no_report, task_options, strategy_params, config_path, **settings):
    """Run (or resume) a benchmark: every strategy at every budget tier on every item."""
    config = RunConfig(task=task, strategies=list(strategies), budgets=parse_budgets(budgets),
                       out=out or Path("runs") / task, task_options=_parse_pairs(task_options, "--task-option"),
                       strategy_params=_strategy_params(strategy_params), **settings)
    if config_path:
        copy_into_run(config_path, Path(config.out))
    execute(config, write_report=not no_report)


DEMO_STRATEGIES = ("truncation", "recency", "checkpoint")
DEMO_BUDGETS = (512, 1024, 2048)


@cli.command()
@click.option("--out", "-o", type=click.Path(path_type=Path), default=Path("runs/demo"), show_default=True)
@click.option("--limit", "-n", type=int, default=8, show_default=True)
@click.option("--max-concurrency", "-j", type=int, default=2, show_default=True)
def demo(out, limit, max_concurrency):
    """The embedded default: synthetic-memory on the local model, 3 strategies, tiers 512 1024 2048."""
    config = RunConfig(task="synthetic-memory", strategies=list(DEMO_STRATEGIES), budgets=list(DEMO_BUDGETS),
                       out=out, limit=limit, max_concurrency=max_concurrency,
                       task_options={"items": limit, "history_tokens": 3000})
    execute(config)
    console.print(f"results: {out / 'cells'} (one JSONL per task/strategy/budget/repeat), manifest: {out / 'manifest.json'}")


cli.add_command(report_command)
cli.add_command(gate_command)
cli.add_command(plan_command)
cli.add_command(compare_command)
cli.add_command(new_plugin)
cli.add_command(check_plugin)
cli.add_command(data)


def plugin_rows() -> list[dict]:
    """One row per registered name, plus one per plugin that failed to load."""
    registry = get_registry()
    rows = []
    for kind, entries in registry.entries.items():
        for name, entry in sorted(entries.items()):
            row = {"name": name, "kind": kind, "plugin": entry.plugin.name, "distribution": entry.plugin.distribution,
                   "version": entry.plugin.version, "hooks": entry.plugin.hooks}
            regime = getattr(entry.obj, "regime", None)
            if kind == "strategy":
                row["regime"] = getattr(regime, "value", regime)
                row["contract"] = "memory-system" if hasattr(entry.obj, "ingest") else "strategy"
            row["description"] = getattr(entry.obj, "description", "") or (entry.obj.__doc__ or "").strip().split("\n")[0]
            rows.append(row)
    for failed in registry.failures:
        rows.append({"name": failed.name, "kind": "error", "plugin": failed.name, "distribution": failed.distribution,
                     "version": failed.version, "hooks": failed.hooks, "error": failed.error})
    return rows


@cli.command("list-plugins")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_plugins(as_json):
    """Every strategy, task, grader, backend and tokenizer registered, and plugins that failed."""
    rows = plugin_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="BudgetBench plugins")
    for column in ("kind", "name", "regime", "distribution", "version", "description"):
        table.add_column(column)
    for row in rows:
        if row["kind"] == "error":
            continue
        table.add_row(row["kind"], row["name"], row.get("regime") or "", row["distribution"], row["version"],
                      row["description"])
    Console().print(table)
    for row in rows:
        if row["kind"] == "error":
            console.print(f"[red]plugin {row['name']!r} ({row['distribution']}) failed:[/] {row['error']}")


def main() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    cli(prog_name="budgetbench")


if __name__ == "__main__":
    main()
