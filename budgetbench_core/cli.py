"""The ``budgetbench`` command line: run, demo, list-plugins, plus commands from plugins."""

from __future__ import annotations

import inspect
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import interrupts
from .config_file import config_option, copy_into_run
from .merge import merge_command
from .option_values import SECRET_OPTION_HINT, parse_budgets, parse_pairs, parse_strategy_params
from .params import check_run, did_you_mean, parameters_of
from .plugin_commands import check_plugin, data, new_plugin
from .plugins import PluginError, UnknownNameError, get_registry
from .preflight import preflight
from .progress import DISPLAYS, Display, choose_display, outcome, print_outcome
from .report.cli import compare_command, gate_command, plan_command, report_command
from .report.judge_audit import judge_audit_command
from .run_config import Setting, settings
from .runlog import RunLogError, final_rows, load_manifest
from .runner import RunConfig, RunConfigError, refuse_credentials_in_urls, run
from .tasks import TaskDataError

console = Console(stderr=True)


def _refuse_secret_option(ctx, param, value) -> None:
    """Callback of the hidden --api-key/--key options: click parses options before the
    command runs, so without them a key on the command line got click's generic error."""
    if value is not None:
        raise click.UsageError(SECRET_OPTION_HINT)


EXIT_OK, EXIT_ERRORED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, interrupts.EXIT_INTERRUPTED


def _say(line: str) -> None:
    """A line of the interrupt handling, on stderr above any progress display."""
    console.print(f"[yellow]{escape(line)}[/]", soft_wrap=True, highlight=False)


def execute(config: RunConfig, write_report: bool = True, display: str = "auto") -> int:
    """Run with the chosen display, print the outcome, write the report; return the exit status."""
    mode = choose_display(display)
    screen = Display(mode, console=console)
    try:
        summary = run(
            config, progress=screen.progress, on_start=screen.start, on_cell=screen.finished, on_turn=screen.turn
        )
    finally:
        screen.close()
    console.print(
        f"[bold]{summary.run_dir}[/]: {summary.cells_total} cells, {summary.cells_skipped} already done, "
        f"{summary.results} results, {summary.violations} violations, {summary.errors} errors, "
        f"{summary.model_calls} model calls, {summary.wall_s:.1f} s",
        highlight=False,
        soft_wrap=True,
    )
    manifest = load_manifest(summary.run_dir)  # this run wrote it: of this schema
    binary = bool(((manifest.grader if manifest else None) or {}).get("binary", True))
    rows = [
        r
        for r in final_rows(summary.run_dir).values()
        if r["task"] == config.task and r["strategy"] in config.strategies and int(r["budget"]) in config.budgets
    ]
    result = outcome(rows, config.strategies, config.budgets, binary, prompts_only=config.prompts_only)
    if mode != "none":
        print_outcome(console, result)
    errored = sum(cell.get("error", 0) + cell.get("failed", 0) for cell in result.cells.values())
    code = EXIT_ERRORED if errored else EXIT_OK
    if summary.stopped:
        code = EXIT_CONFIG if summary.stopped_fatal else EXIT_ERRORED
        console.print(
            f"[red]error:[/] the run stopped early: {escape(summary.stopped)}. Finished cells are kept; fix "
            "the cause and run the same command again to resume.",
            soft_wrap=True,
            highlight=False,
        )
    if write_report and rows:  # a run whose every cell errored is reported too: that is its finding
        from .report import write_report as build_report

        try:
            paths = build_report(summary.run_dir)
        except Exception as exc:  # the rows are safe on disk; say how to retry the report alone
            console.print(
                f"[red]error:[/] the report could not be written ({type(exc).__name__}: {exc}); the rows "
                f"are saved: fix and run `budgetbench report {summary.run_dir}`",
                highlight=False,
            )
            return max(code, EXIT_ERRORED)
        console.print(f"report: {paths.get('html', summary.run_dir / 'report')}", highlight=False)
    elif write_report:
        console.print("no report: no cell of this command finished", highlight=False)
    return code


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
            add_executor_options(self.commands["run"])
            explicit_defaults(self)

    def list_commands(self, ctx):
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if cmd_name == "run":  # the executors' options (--ray-address), from the index: no plugin imported
            add_executor_options(command)
        elif command is None:
            self._add_plugin_commands()
            command = super().get_command(ctx, cmd_name)
        return command

    def invoke(self, ctx):
        try:
            with interrupts.handled(_say):
                return super().invoke(ctx)
        except (PluginError, RunConfigError, TaskDataError, RunLogError, FileNotFoundError, ValueError) as exc:
            for line in str(exc).splitlines() or [type(exc).__name__]:  # a PreflightError has one per problem
                console.print(f"[red]error:[/] {escape(line)}", soft_wrap=True, highlight=False)
            sys.exit(EXIT_CONFIG)
        except KeyboardInterrupt:
            console.print(
                "[yellow]interrupted[/]: finished rows are saved; run the same command again to resume", soft_wrap=True
            )
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=BudgetBenchGroup)
@click.version_option(package_name="budgetbench")
def cli() -> None:
    """BudgetBench: memory strategies for LLM agents under an exact input-token budget."""


class RequiredOption(click.Option):
    """A required option with ``default=None``, so the CLI reference says "required" rather than
    click's UNSET marker: click 8.3+ takes None for a given value, so None counts as missing here."""

    def value_is_missing(self, value) -> bool:
        return value is None or super().value_is_missing(value)


# The options of ``run`` (and ``demo``) that steer the command, not the run: not RunConfig fields.
COMMAND_SETTINGS = (
    Setting("--no-report", "Do not write the report at the end.", kind="flag", default=False),
    Setting(
        "--dry-run",
        "Before any paid call: run the same cells prompts-only in a temporary folder and print the cells, "
        "the answer calls and how many reach the model, their exact input tokens, the output tokens at "
        "most and the $ they would cost; nothing is written to --out.",
        kind="flag",
        default=False,
    ),
)
DISPLAY_SETTINGS = (
    Setting(
        "--display",
        "Progress: rich bars, plain (one line per finished cell), none. auto: rich on a terminal, plain otherwise.",
        kind="choice",
        choices=DISPLAYS,
        default="auto",
    ),
    Setting(
        "--no-preflight",
        "Skip the checks before the first cell (provider, key, server, tokenizer, context).",
        kind="flag",
        default=False,
    ),
)
RUN_SETTINGS = (*settings(), *COMMAND_SETTINGS, *DISPLAY_SETTINGS)
"""Every option of ``run`` but ``--config`` and the executors' own: the one source of the click
options, the ``--config`` keys and the options table of docs/cli/run.md (``options_table``)."""

_CLICK_TYPES: dict[str, Any] = {"float": float, "path": click.Path(path_type=Path)}


def click_option(spec: Setting):
    """The click option of ``spec``, reading ``BUDGETBENCH_<LONG_NAME>`` too (the command line
    wins over the variable, the variable over ``--config``, which wins over the default)."""
    names = [spec.flag, *([spec.short] if spec.short else [])]
    if spec.name != spec.flag[2:].replace("-", "_"):
        names.append(spec.name)
    attrs: dict[str, Any] = {"default": spec.default, "help": spec.help, "envvar": spec.envvar, "show_envvar": True}
    if spec.required:
        attrs.update(cls=RequiredOption, required=True)
    if spec.kind == "int":
        attrs["type"] = int if spec.minimum is None else click.IntRange(min=spec.minimum)
    elif spec.kind == "choice":
        attrs["type"] = click.Choice(spec.choices)
    elif spec.kind in _CLICK_TYPES:
        attrs["type"] = _CLICK_TYPES[spec.kind]
    if spec.kind == "flag":
        attrs["is_flag"] = True
    if spec.multiple:
        attrs["multiple"] = True
    if spec.metavar:
        attrs["metavar"] = spec.metavar
    if spec.shows_default:
        attrs["show_default"] = True
    return click.option(*names, **attrs)


def run_options(function):
    secret = click.option("--api-key", "--key", hidden=True, expose_value=False, callback=_refuse_secret_option)
    options = [click_option(spec) for spec in RUN_SETTINGS]
    options.insert([spec.name for spec in RUN_SETTINGS].index("model") + 1, secret)
    for option in reversed(options):
        function = option(function)
    return function


def display_options() -> list:
    """Options shared by ``run`` and ``demo``."""
    return [click_option(spec) for spec in DISPLAY_SETTINGS]


def _prepare(config: RunConfig, budgets_given: bool, no_preflight: bool, quiet: bool) -> RunConfig:
    """Names and parameters always; then the preflight, which also picks default tiers."""
    try:
        refuse_credentials_in_urls(config)  # before any server is asked anything
    except RunConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if Path(config.out).exists() and not Path(config.out).is_dir():
        raise click.UsageError(
            f"--out {config.out}: a file, not a folder; give a new folder or a run directory to resume"
        )
    registry = get_registry()
    check_run(registry, config.task, config.task_options, config.strategies, config.strategy_params, config.grader)
    max_output = config.max_output_tokens or registry.get("task", config.task).obj.max_output_tokens
    report = preflight(config, registry, budgets_given=budgets_given, full=not no_preflight, max_output=max_output)
    for note in report.notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    if report.passed and not quiet:
        console.print("preflight: " + "; ".join(report.passed), highlight=False, soft_wrap=True)
    return replace(config, budgets=report.budgets)


@cli.command("run")
@config_option(RUN_SETTINGS)
@run_options
def run_command(
    task,
    strategies,
    budgets,
    out,
    no_report,
    dry_run,
    task_options,
    strategy_params,
    config_path,
    display,
    no_preflight,
    **settings,
):
    """Run (or resume) a benchmark: every strategy at every budget tier on every item.

    Exit status: 0 every cell finished without error; 1 some cells errored (run the same
    command again to retry them); 2 a usage or configuration error, found before any cell
    ran or by stopping the run early; 130 interrupted (finished cells are kept).
    """
    config = RunConfig(
        task=task,
        strategies=list(strategies),
        budgets=parse_budgets(budgets) if budgets else [],
        out=out or Path("runs") / task,
        task_options=parse_pairs(task_options, "--task-option"),
        strategy_params=parse_strategy_params(strategy_params),
        **{**settings, "executor_options": _executor_options(settings["executor_options"])},
    )
    config = _prepare(config, budgets_given=bool(budgets), no_preflight=no_preflight, quiet=display == "none")
    if dry_run:
        sys.exit(print_dry_run(config, display))
    if config_path:
        copy_into_run(config_path, Path(config.out))
    sys.exit(execute(config, write_report=not no_report, display=display))


def print_dry_run(config: RunConfig, display: str) -> int:
    """``run --dry-run``: the estimate of ``dry_run.estimate``, as a table; no model is called."""
    from .dry_run import estimate
    from .episodes import EpisodicTask

    screen = Display(choose_display(display), console=console)
    task_class = get_registry().get("task", config.task).obj
    try:
        found = estimate(
            config,
            run,
            episodic=isinstance(task_class, type) and issubclass(task_class, EpisodicTask),
            progress=screen.progress,
            on_start=screen.start,
        )
    finally:
        screen.close()
    table = Table(title=f"dry run of {config.task} on {config.model}: nothing was sent", box=box.SIMPLE)
    for heading in ("strategy", "budget", "cells", "answer calls", "sent", "over budget", "errors", "input tokens"):
        table.add_column(heading, justify="left" if heading == "strategy" else "right")
    table.add_column("output tokens (at most)", justify="right")
    table.add_column("$ (at most)", justify="right")

    def dollars(value: float | None) -> str:
        return "unknown" if value is None else f"{value:.4f}"

    for cell in found.cells:
        table.add_row(
            cell.strategy,
            str(cell.budget),
            str(cell.cells),
            str(cell.calls),
            str(cell.sent),
            str(cell.violations),
            str(cell.errors),
            f"{cell.input_tokens:,}",
            f"{cell.max_output_tokens:,}",
            dollars(cell.max_cost_usd),
        )
    console.print(table)
    price = f"priced at {found.price_source}" if found.price_source else "no price known (pass --price IN/OUT)"
    console.print(
        f"total: {found.calls} answer calls, {found.sent} sent (the others answered by the reply cache), "
        f"{found.input_tokens:,} input tokens, at most "
        f"{found.max_output_tokens:,} output tokens, at most ${dollars(found.max_cost_usd)} ({price}). "
        f"Not counted: {'; '.join(found.unseen)}.",
        soft_wrap=True,
        highlight=False,
    )
    return EXIT_OK


def _demo_options(function):
    from . import demo as demo_plan

    options = [
        click.option(
            "--out",
            "-o",
            type=click.Path(path_type=Path),
            default=Path("runs/demo"),
            show_default=True,
            help="Directory for the demo's two runs (prompts/ and answered/); existing ones are resumed.",
        ),
        click.option(
            "--limit",
            "-n",
            type=click.IntRange(min=1),
            default=demo_plan.PROMPT_ITEMS,
            show_default=True,
            help="Items of the prompts-only run (no model call).",
        ),
        click.option(
            "--answered",
            type=click.IntRange(min=0),
            default=demo_plan.ANSWERED_ITEMS,
            show_default=True,
            help="Items of the run answered by the embedded model (0: none).",
        ),
        click.option(
            "--max-concurrency",
            "-j",
            type=click.IntRange(min=1),
            default=2,
            show_default=True,
            help="Cells in flight at once.",
        ),
        *display_options(),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@cli.command()
@_demo_options
def demo(out, limit, answered, max_concurrency, display, no_preflight):
    """Budgets and memory strategies in a few minutes: truncation, checkpoint, rag and full_context on
    synthetic-memory at 512/1024/2048 tokens, prompts only (evidence recall, violations), then a small
    run answered by the embedded model at 512 (quality, served-count audit).

    Exit status as for ``run`` (the worse of the two runs).
    """
    from .demo import available_strategies, demo_configs, summary_lines

    strategies, missing = available_strategies(get_registry())
    if missing:
        console.print(
            f"note: {', '.join(missing)} not installed; the demo runs {', '.join(strategies)}", highlight=False
        )
    codes = []
    for config in demo_configs(out, limit, answered, max_concurrency, strategies):
        config = _prepare(config, budgets_given=True, no_preflight=no_preflight, quiet=display == "none")
        codes.append(execute(config, display=display))
    for line in summary_lines(out):
        console.print(line, highlight=False, soft_wrap=True)
    sys.exit(max(codes))


cli.add_command(report_command)
cli.add_command(gate_command)
cli.add_command(plan_command)
cli.add_command(compare_command)
cli.add_command(merge_command)
cli.add_command(new_plugin)
cli.add_command(check_plugin)
cli.add_command(data)
cli.add_command(judge_audit_command)


def plugin_rows() -> list[dict]:
    """One row per registered name, plus one per plugin that failed to load."""
    registry = get_registry()
    rows: list[dict[str, Any]] = []
    for kind, entries in registry.entries.items():
        for name, entry in sorted(entries.items()):
            row: dict[str, Any] = {
                "name": name,
                "kind": kind,
                "plugin": entry.plugin.name,
                "distribution": entry.plugin.distribution,
                "version": entry.plugin.version,
                "hooks": entry.plugin.hooks,
            }
            regime = getattr(entry.obj, "regime", None)
            if kind == "strategy":
                row["regime"] = getattr(regime, "value", regime)
                row["contract"] = "memory-system" if hasattr(entry.obj, "ingest") else "strategy"
            row["description"] = (
                getattr(entry.obj, "description", "") or (entry.obj.__doc__ or "").strip().split("\n")[0]
            )
            if kind in PARAMETER_KINDS and isinstance(entry.obj, type):
                row["parameters"] = [spec.to_dict() for spec in parameters_of(entry.obj).values()]
            rows.append(row)
    for failed in registry.failures:
        rows.append(
            {
                "name": failed.name,
                "kind": "error",
                "plugin": failed.name,
                "distribution": failed.distribution,
                "version": failed.version,
                "hooks": failed.hooks,
                "error": failed.error,
            }
        )
    return rows


PARAMETER_KINDS = ("strategy", "task", "grader")


@cli.command("list-plugins")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    default=False,
    help="Machine-readable output: every name with its kind, distribution, version, hooks, regime "
    "(strategies) and parameters.",
)
def list_plugins(as_json):
    """Every strategy, task, grader, backend and tokenizer registered, and plugins that failed."""
    rows = plugin_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    out = Console()
    for kind in ("strategy", "task", "grader", "backend", "tokenizer", "dataset"):
        entries = [r for r in rows if r["kind"] == kind]
        if not entries:
            continue
        # Names are never cut (no_wrap); distribution and description wrap in one column.
        table = Table(
            title=f"{kind} ({len(entries)})",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            expand=False,
            show_edge=False,
            pad_edge=False,
        )
        table.add_column("name", no_wrap=True, style="bold")
        if kind == "strategy":
            table.add_column("regime", no_wrap=True)
        table.add_column("description / distribution", ratio=1, overflow="fold")
        for row in entries:
            about = f"{row['description']}\n[dim]{row['distribution']} {row['version']}[/]"
            table.add_row(row["name"], *([row.get("regime") or ""] if kind == "strategy" else []), about)
        out.print(table)
    for row in rows:
        if row["kind"] == "error":
            console.print(
                f"[red]plugin {row['name']!r} ({row['distribution']}) failed:[/] {row['error']}", highlight=False
            )


@cli.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, default=False, help="Machine-readable output.")
def describe(name, as_json):
    """A strategy, task, grader, backend or tokenizer: what it is and the parameters it accepts.

    Parameters are passed with ``--strategy-param NAME.KEY=VALUE`` or ``--task-option KEY=VALUE``.
    """
    rows = [r for r in plugin_rows() if r["name"] == name and r["kind"] != "error"]
    if not rows and ":" in name:  # a tokenizer spec (tiktoken:cl100k_base): its prefix describes it
        prefix = name.partition(":")[0]
        rows = [r for r in plugin_rows() if r["name"] == prefix and r["kind"] == "tokenizer"]
        name = prefix if rows else name
    if not rows:
        names = sorted({r["name"] for r in plugin_rows() if r["kind"] != "error"})
        raise UnknownNameError(
            f"nothing is registered as {name!r}; {did_you_mean(name, names)}see `budgetbench list-plugins`"
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    out = Console()
    for row in rows:
        regime = f", {row['regime']}" if row.get("regime") else ""
        out.print(
            f"[bold]{row['name']}[/] ({row['kind']}{regime}) from {row['distribution']} {row['version']}",
            highlight=False,
        )
        entry = get_registry().get(row["kind"], name)
        own = entry.obj.__dict__.get("__doc__") if isinstance(entry.obj, type) else None
        doc = inspect.cleandoc(own) if own else None  # never a base class's docstring
        paragraphs = [" ".join(p.split()) for p in (doc or row["description"]).split("\n\n")]
        out.print(escape("\n\n".join(paragraphs).replace("``", "")), highlight=False)
        if row["kind"] not in PARAMETER_KINDS:
            continue
        parameters = row.get("parameters") or []
        if not parameters:
            out.print("parameters: none")
            continue
        option = {"strategy": f"--strategy-param {name}.KEY=VALUE", "task": "--task-option KEY=VALUE"}.get(row["kind"])
        table = Table(
            title=f"parameters{f' ({option})' if option else ''}",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
        )
        table.add_column("name", no_wrap=True, style="bold")
        table.add_column("default", overflow="fold")
        table.add_column("help", ratio=1, overflow="fold")
        for param in parameters:
            default = "(required)" if param["required"] else json.dumps(param["default"])
            table.add_row(param["name"], default, param["help"])
        out.print(table)


def _executor_options(pairs: tuple[str, ...]) -> dict[str, object]:
    """``--executor-option`` pairs, then the ``--<executor>-<key>`` spellings given."""
    given = click.get_current_context().meta.get("executor_options", {})
    return {**parse_pairs(pairs, "--executor-option"), **given}


def add_executor_options(command: click.Command) -> None:
    """``--<executor>-<key>`` on ``run`` for every option a registered executor declares
    (``--ray-address``); each value goes to ``RunConfig.executor_options`` under ``key``. The
    names and help come from the plugin index, so no executor plugin is imported for them."""
    try:
        declared = get_registry().executor_options()
    except PluginError:
        return  # a broken executor plugin is reported by list-plugins; the others still run
    taken = {opt for param in command.params for opt in getattr(param, "opts", [])}
    for executor, options in declared.items():
        for key, text in sorted(options.items()):
            flag = f"--{executor}-{key.replace('_', '-')}"
            if flag in taken:
                continue

            def store(ctx, param, value, key=key):
                if value is not None:
                    ctx.meta.setdefault("executor_options", {})[key] = value

            command.params.append(
                click.Option(
                    [flag], default=None, expose_value=False, callback=store, help=f"({executor} executor) {text}"
                )
            )
            taken.add(flag)


def explicit_defaults(group: click.Group) -> None:
    """Give every option without a default the value click uses for it anyway (flags False,
    repeatable options ``()``, others None): click 8.3+ keeps a marker object there, which the
    generated CLI reference printed as ``Sentinel.UNSET``. Required options keep it: click 8.3+
    enforces them only while the default is unset (``RequiredOption`` for those of ``run``)."""
    unset = getattr(click.core, "UNSET", None)
    for command in group.commands.values():
        if isinstance(command, click.Group):
            explicit_defaults(command)
        for param in command.params:
            if isinstance(param, click.Option) and unset is not None and param.default is unset and not param.required:
                param.default = False if param.is_bool_flag else (() if param.multiple else None)


explicit_defaults(cli)


def main() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    cli(prog_name="budgetbench")


if __name__ == "__main__":
    main()
