"""What a run is asked to do (``RunConfig``), what it reports at the end (``RunSummary``), and
the checks a configuration passes before anything starts. Imported by the CLI, the runner and
the engine alike, so none of them imports another for a type."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .controls import CONTROLS
from .failfast import DEFAULT_MAX_CONSECUTIVE

DEFAULT_BUDGETS = (2048, 4096, 8192, 16384, 32768)


class RunConfigError(ValueError):
    """The requested run cannot start; the message says what to change."""


ENV_PREFIX = "BUDGETBENCH_"
SETTING = "setting"  # the key of a RunConfig field's metadata that holds its Setting
KINDS = ("text", "int", "float", "flag", "choice", "path", "budgets", "names", "pairs", "strategy_pairs")


@dataclass(frozen=True)
class Setting:
    """One option of ``budgetbench run``: spelling, help and the form of its value, declared once.
    The click options, the keys ``--config`` accepts and the options table of docs/cli/run.md
    are all made from these, so none of them can disagree with another.

    ``kind``: ``text``, ``int``/``float`` (``minimum``: the smallest accepted), ``flag``,
    ``choice`` (``choices``), ``path``, ``budgets`` (tiers as text: ``"2k 4k"``), or a repeatable
    option: ``names``, ``pairs`` (``KEY=VALUE``) or ``strategy_pairs`` (``STRATEGY.KEY=VALUE``).
    ``default`` is what the command line gives when the option is absent (for a RunConfig field,
    filled in by ``settings`` from the field)."""

    flag: str
    help: str
    short: str | None = None
    kind: str = "text"
    minimum: int | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    required: bool = False
    name: str = ""  # the parameter (and RunConfig field) name; default: the flag's
    default: Any = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"setting {self.flag}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.name:
            object.__setattr__(self, "name", self.flag[2:].replace("-", "_"))

    @property
    def multiple(self) -> bool:
        return self.kind in ("names", "pairs", "strategy_pairs")

    @property
    def envvar(self) -> str:
        """``BUDGETBENCH_<LONG_NAME>``: the command line wins over it, it wins over ``--config``."""
        return ENV_PREFIX + self.flag[2:].replace("-", "_").upper()

    @property
    def keys(self) -> tuple[str, ...]:
        """The ``--config`` keys (dashes or underscores alike): the name and the long flag."""
        return tuple(dict.fromkeys((self.name, self.flag[2:].replace("-", "_"))))

    @property
    def shows_default(self) -> bool:
        return self.default is not None and self.kind != "flag" and not self.multiple


def setting(flag: str, help: str, *, default: Any = MISSING, default_factory: Any = MISSING, **spec: Any) -> Any:
    """A RunConfig field with its option: the field's default is the command line's too (a
    field without one, or with a factory, is an option whose absence the command resolves)."""
    return field(default=default, default_factory=default_factory, metadata={SETTING: Setting(flag, help, **spec)})


@dataclass
class RunConfig:
    task: str = setting("--task", "Task name (see `budgetbench list-plugins`).", short="-t", required=True)
    strategies: list[str] = setting(
        "--strategy", "Strategy name; repeat for several.", short="-s", kind="names", required=True
    )
    out: Path = setting(
        "--out", "Run directory; an existing one is resumed. Default: runs/<task>.", short="-o", kind="path"
    )
    budgets: list[int] = setting(
        "--budgets",
        "Budget tiers in input tokens, space or comma separated; 2k = 2048. Default: the tiers of "
        f"{' '.join(map(str, DEFAULT_BUDGETS))} that fit the model's context.",
        short="-b",
        kind="budgets",
        default_factory=lambda: list(DEFAULT_BUDGETS),
    )
    model: str = setting(
        "--model",
        "'local' (embedded SmolLM2), 'local:<gguf>', or a litellm model string.",
        short="-m",
        default="local",
    )
    api_base: str | None = setting(
        "--api-base",
        "Server address, e.g. http://127.0.0.1:8000/v1 for openai/<name> "
        "models (MLX, vLLM, llama.cpp) or http://host:11434 for Ollama.",
        default=None,
    )
    tokenizer: str | None = setting(
        "--tokenizer",
        "hf:<dir or id>, tiktoken:<encoding>, gguf:<file> or server. "
        "Default: the backend's exact tokenizer (local: the embedded server).",
        default=None,
    )
    grader: str | None = setting("--grader", "Grader name. Default: the task's.", default=None)
    judge_model: str | None = setting(
        "--judge-model", "Model for model-based graders (litellm string or 'local'). Default: --model.", default=None
    )
    task_options: dict[str, Any] = setting(
        "--task-option",
        "KEY=VALUE passed to the task; repeatable (see `budgetbench describe TASK`).",
        kind="pairs",
        default_factory=dict,
    )
    strategy_params: dict[str, dict[str, Any]] = setting(
        "--strategy-param",
        "STRATEGY.KEY=VALUE passed to a strategy; repeatable (see `budgetbench describe STRATEGY`).",
        kind="strategy_pairs",
        default_factory=dict,
    )
    limit: int | None = setting(
        "--limit",
        "At most this many items (a seeded selection). Default: all.",
        short="-n",
        kind="int",
        minimum=1,
        default=None,
    )
    repeats: int = setting(
        "--repeats", "Runs of every cell (seeds seed, seed+1, ...).", kind="int", minimum=1, default=1
    )
    seed: int = setting("--seed", "Seed of item selection, order and sampling.", kind="int", default=0)
    max_concurrency: int = setting(
        "--max-concurrency", "Cells (and model calls) in flight at once.", short="-j", kind="int", minimum=1, default=4
    )
    temperature: float = setting("--temperature", "Sampling temperature.", kind="float", default=0.0)
    max_output_tokens: int | None = setting(
        "--max-output-tokens",
        "Tokens the model may write per answer. Default: the task's.",
        kind="int",
        minimum=1,
        default=None,
    )
    retries: int = setting(
        "--retries",
        "Retries of a call after a transport error (connection, timeout, 429, 5xx); other errors are never retried.",
        kind="int",
        minimum=0,
        default=4,
    )
    timeout_s: float = setting("--timeout", "Seconds one model call may take.", kind="float", default=120.0)
    item_timeout_s: float = setting(
        "--item-timeout", "Seconds one strategy call may take.", kind="float", default=600.0
    )
    max_ingest_loss: float = setting(
        "--max-ingest-loss",
        "Fraction of sessions a memory system may fail to ingest before the item is an error.",
        kind="float",
        default=0.0,
    )
    # How units are scheduled, never what they compute: not part of the run identity.
    executor: str = setting(
        "--executor",
        "How units are scheduled: thread (worker threads here) or one a plugin registers "
        "(ray: --executor ray [--ray-address auto|host:port]). Rows are the same either way.",
        default="thread",
    )
    executor_options: dict[str, Any] = setting(
        "--executor-option",
        "KEY=VALUE passed to the executor; repeatable (also --<executor>-<key>, e.g. --ray-address).",
        kind="pairs",
        default_factory=dict,
    )
    shard: str | None = setting(  # see shards.py
        "--shard",
        "Run only shard I of N of the units (1 <= I <= N, the same partition on every machine); "
        "combine the shard directories with `budgetbench merge`.",
        metavar="I/N",
        default=None,
    )
    server_prompt_cache: bool = setting(
        "--server-prompt-cache",
        "Let a llama.cpp server (the embedded one too) reuse cached prompt prefixes: faster, but a greedy "
        "reply can then depend on what ran before, so a rerun may differ. Default: no reuse.",
        kind="flag",
        default=False,
    )
    prompts_only: bool = setting(
        "--prompts-only",
        "Build, gate, audit and score evidence recall for every cell without calling the model.",
        kind="flag",
        default=False,
    )
    max_consecutive_failures: int = setting(
        "--max-consecutive-failures",
        "Stop the run when this many calls in a row fail with the same transport "
        "error (retries included); a refused key stops it at the first.",
        kind="int",
        minimum=1,
        default=DEFAULT_MAX_CONSECUTIVE,
    )
    # recorded in the identity and shown in the report header
    isolation: str = setting(
        "--isolation",
        "Where strategies run: 'process' (confined worker processes, what a result needs) or "
        "'none' (in the harness's process: for debugging a plugin only; recorded in the run).",
        kind="choice",
        choices=("process", "none"),
        default="process",
    )
    worker_disk_mb: int = setting(
        "--worker-disk-mb",
        "Megabytes one strategy's worker may keep in its scratch folder, and write to any one file "
        "(its log included); past it the worker is ended and its cell is an error row.",
        kind="int",
        minimum=1,
        default=4096,
    )
    worker_processes: int = setting(
        "--worker-processes",
        "Processes one strategy's worker may have at once, itself included (as root the kernel sets no "
        "such limit); past it the worker is ended and its cell is an error row.",
        kind="int",
        minimum=1,
        default=64,
    )
    worker_memory_mb: int | None = setting(
        "--worker-memory-mb",
        "Megabytes each process of a strategy's worker may allocate, and the size of its /dev/shm of its "
        "own; past it the plugin gets MemoryError (or no space). Default: half the machine's memory.",
        kind="int",
        minimum=1,
        default=None,
    )
    controls: bool = setting(
        "--controls",
        "Also run the harness controls control:no_memory (system prompt and question only) and "
        "control:evidence_only (the gold evidence alone, fitted to the budget): reference lines, never ranked.",
        kind="flag",
        default=False,
    )
    price: str | None = setting(
        "--price",
        "Dollars per million input and output tokens for the report's cost ledger (default: litellm's "
        "cost map for the model; the embedded model has none).",
        metavar="IN/OUT",
        default=None,
    )
    notes: list[str] = setting(
        "--note",
        "A line shown first in the report's findings: why the run was made, what its numbers can and "
        "cannot say; repeat for several. Kept in the manifest, not part of the run identity.",
        kind="names",
        metavar="TEXT",
        default_factory=list,
    )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["out"] = str(self.out)
        return data


@dataclass
class RunSummary:
    run_dir: Path
    cells_total: int
    cells_skipped: int
    results: int
    violations: int
    errors: int
    model_calls: int
    wall_s: float
    admitted: int = 0  # prompts-only run: prompts that fitted (not sent)
    stopped: str | None = None  # why the run stopped early (failfast), None if it did not
    stopped_fatal: bool = False  # stopped by a refused key, unknown provider or model


def settings() -> tuple[Setting, ...]:
    """Every RunConfig field's Setting, in field order, with its name and command-line default."""
    found = []
    for f in fields(RunConfig):
        if SETTING not in f.metadata:
            raise TypeError(f"RunConfig.{f.name} has no Setting: declare it with setting(flag, help, ...)")
        spec: Setting = f.metadata[SETTING]
        plain = f.default is not MISSING and not spec.multiple
        default = f.default if plain else (() if spec.multiple and not spec.required else None)
        found.append(replace(spec, name=f.name, default=default))
    return tuple(found)


_VALUES = {
    "text": "TEXT",
    "int": "INTEGER",
    "float": "NUMBER",
    "flag": "",
    "path": "DIR",
    "budgets": "TIERS",
    "names": "NAME (repeatable)",
    "pairs": "KEY=VALUE (repeatable)",
    "strategy_pairs": "STRATEGY.KEY=VALUE (repeatable)",
}


OPTIONS_BEGIN = "<!-- options: generated from the Setting declarations by scripts/run_options_table.py -->"
OPTIONS_END = "<!-- end of the generated options -->"


def options_table(specs: tuple[Setting, ...]) -> str:
    """The options table of docs/cli/run.md, between ``OPTIONS_BEGIN`` and ``OPTIONS_END``
    (``tests/test_run_settings.py`` holds the page to it; ``scripts/run_options_table.py`` rewrites it)."""
    rows = ["| option | value | default | environment variable | what it sets |", "|---|---|---|---|---|"]
    for spec in specs:
        value = spec.metavar or (", ".join(spec.choices) if spec.kind == "choice" else _VALUES[spec.kind])
        if spec.minimum is not None:
            value += f" >= {spec.minimum}"
        if spec.required:
            default = "required"
        elif spec.shows_default:
            default = f"`{spec.default}`"
        else:
            default = "off" if spec.kind == "flag" else "-"
        cells = [
            ", ".join(f"`{name}`" for name in (spec.flag, spec.short) if name),
            f"`{value}`" if value else "",
            default,
            f"`{spec.envvar}`",
            spec.help.replace("<", "&lt;"),
        ]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def normalised(config: RunConfig) -> RunConfig:
    """``config`` with duplicate budgets and strategies removed (first occurrence kept): a
    cell is never run twice in one command."""
    controls = list(CONTROLS) if config.controls else []
    return replace(
        config,
        budgets=list(dict.fromkeys(int(b) for b in config.budgets)),
        strategies=list(dict.fromkeys([*config.strategies, *controls])),
    )


def refuse_credentials_in_urls(config: RunConfig) -> None:
    """A URL option carrying a user or password would be written to the manifest and identity:
    refused, with the way to pass a key instead."""
    urls = {"--api-base": config.api_base, **{f"--executor-option {k}": v for k, v in config.executor_options.items()}}
    for option, value in urls.items():
        if not isinstance(value, str) or "@" not in value:
            continue
        parts = urlsplit(value)
        if parts.username or parts.password:
            shown = parts._replace(
                netloc=f"<credentials>@{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"
            )
            raise RunConfigError(
                f"{option} {shown.geturl()}: the URL carries credentials, which would be written to the run's "
                f"manifest and identity; pass the key in the environment instead (OPENAI_API_KEY, or the "
                f"provider's *_API_KEY variable litellm reads) and give the URL without it"
            )
