"""Typed event records: one dataclass per event kind, the single source of docs/events.md.

Every row the runner writes is built from one of these classes (``row()`` gives the JSON
object), so a field cannot be written without being documented. ``render_markdown()``
produces docs/events.md; a test fails when the page and the classes disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, NamedTuple

SCHEMA_VERSION = "4"
TERMINAL_EVENTS = ("result", "violation", "error", "admitted")
FINAL_EVENTS = ("result", "violation")  # a resumed full run keeps these; a prompts-only run also keeps `admitted`


class SchemaError(ValueError):
    """A row or run these classes cannot read; the message names the file (and line)."""


class CellKey(NamedTuple):
    """A cell's identity in a run: the rows of one key are the attempts of one cell."""

    task: str
    strategy: str
    budget: int
    repeat: int
    item_id: str

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> CellKey:
        """The key of a row read as JSON."""
        return cls(row["task"], row["strategy"], int(row["budget"]), int(row["repeat"]), str(row["item_id"]))


def doc(text: str, default: Any = MISSING, factory: Any = MISSING) -> Any:
    """A dataclass field with its documentation attached."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    if default is not MISSING:
        return field(default=default, metadata={"doc": text})
    return field(metadata={"doc": text})


@dataclass(kw_only=True)
class CellEvent:
    """Fields every cell event carries."""

    EVENT: ClassVar[str] = ""
    time: str | None = doc("UTC ISO timestamp when the row was written (set by the log)", None)
    task: str = doc("task name")
    strategy: str = doc("strategy (or memory system) name")
    budget: int = doc("the cell's budget: input tokens one call may present")
    repeat: int = doc("repeat index, from 0")
    item_id: str = doc("the item's id, exactly as the task gave it")
    category: str | None = doc("the item's category (question type)", None)
    run_key: str = doc(
        "hash of everything that defines the experiment (see Run identity); resume reuses only "
        "rows with the current key"
    )
    tokenizer: dict[str, Any] | None = doc("`{id, backend, exact}` of the tokenizer that counted", None)

    @property
    def key(self) -> CellKey:
        return CellKey(self.task, self.strategy, self.budget, self.repeat, self.item_id)

    def row(self) -> dict[str, Any]:
        return _row(self)


def _row(event: Any) -> dict[str, Any]:
    """The JSON object of ``event``, its fields in class order (``time`` only when set: the log sets it)."""
    out: dict[str, Any] = {"event": event.EVENT}
    for item in fields(event):
        value = getattr(event, item.name)
        if value is not None or item.name != "time":
            out[item.name] = value
    return out


EVIDENCE_DOC = (
    "evidence recall of this prompt: `{marked, kept, dropped}` (counts and ids of the evidence pieces "
    "the task marked with metadata `evidence`, see Evidence recall); null when the item has no marks or "
    "no prompt was built"
)


@dataclass(kw_only=True)
class PromptAudit(CellEvent):
    """Written for every prompt a strategy produced, before the budget decision."""

    EVENT: ClassVar[str] = "prompt_audit"
    call: int = doc(
        "index of the model call within the cell: the turn index, from 0, in an agent episode (one "
        "audit per turn); 0 for a single-call task",
        0,
    )
    prompt_hash: str = doc(
        "sha256 of the canonical chat messages (role and content) that were counted and would be sent"
    )
    prompt_tokens: int = doc("exact token count of the rendered canonical prompt, chat template included")
    tools_tokens: int | None = doc(
        "of `prompt_tokens`, the tool block: the count with the tool schemas the call sends (native tool "
        "calls) minus the count of the same messages without them, both as the served template renders "
        "them; null when the call sends no tool schemas (and in runs before schema_version 4)",
        None,
    )
    messages: list[dict[str, Any]] = doc("the canonical prompt, each `{role, content, metadata}`")
    metadata_dropped: list[str] = doc(
        "paths of message metadata that were not JSON-safe and were left out", factory=list
    )
    strategy_audit: dict[str, Any] = doc(
        "what the strategy reported (retrieval scores, chosen units, summary calls, budget fill), JSON-safe copy",
        factory=dict,
    )
    evidence: dict[str, Any] | None = doc(EVIDENCE_DOC, None)


@dataclass(kw_only=True)
class AuxCall(CellEvent):
    """One auxiliary model call a strategy made through the harness (summary, compression)."""

    EVENT: ClassVar[str] = "aux_call"
    purpose: str = doc("what the strategy said the call is for")
    sent: bool = doc("false when the gate refused the call (over budget): it never reached the server")
    prompt_hash: str = doc("sha256 of the canonical messages")
    prompt_tokens: int = doc("exact count of the canonical prompt")
    served_prompt_tokens: int | None = doc("the server's prompt count; null when not reported", None)
    completion_tokens: int | None = doc("the server's completion count; null when not reported", None)
    latency_s: float | None = doc("call time", None)
    cached: bool = doc("reply came from the response cache", False)
    messages: list[dict[str, Any]] = doc("the canonical messages", factory=list)
    completion: str | None = doc("the reply text", None)


@dataclass(kw_only=True)
class MeteredCall(CellEvent):
    """One request a plugin sent with its own SDK to the run's metering gateway (see
    [isolation](isolation.md#the-metering-gateway)): counted, attributed to the cell and phase."""

    EVENT: ClassVar[str] = "metered_call"
    phase: str = doc(
        "`write` (a memory system's ingest), `read` (its retrieval) or `aux` (any other call made while `apply` ran)"
    )
    endpoint: str = doc("`chat.completions`, `embeddings`, or the path of a request the gateway does not serve")
    kind: str = doc(
        "`call` (forwarded; `ok` says whether a reply came back), `violation` (an `aux` prompt over the budget: "
        "not sent), `invalid` (a request the gateway does not serve), `error` (the harness failed before sending)"
    )
    model: str | None = doc("the model name the plugin asked for (the run's model answered)", None)
    input_tokens: int | None = doc(
        "our exact count of what it sent (chat template included); null if not counted", None
    )
    served_prompt_tokens: int | None = doc("the server's prompt count; null when not reported", None)
    completion_tokens: int | None = doc("the server's completion count; null when not reported", None)
    latency_s: float = doc("time from the request's arrival to the reply", 0.0)
    ok: bool = doc("a reply came back", False)
    status: int = doc("the HTTP status the plugin got", 0)
    error: str | None = doc("why it failed or was refused", None)


@dataclass(kw_only=True)
class Warning(CellEvent):
    """Something was repaired on the way and the cell went on (e.g. a corrupt cache entry was dropped)."""

    EVENT: ClassVar[str] = "warning"
    kind: str = doc("`cache_corrupt` (a cache entry could not be read: dropped and asked again)")
    detail: str = doc("what happened")


@dataclass(kw_only=True)
class Terminal(CellEvent):
    """Fields of the terminal kinds (result, violation, error, and admitted in a prompts-only run)."""

    strategy_s: float | None = doc("time the strategy took to build the prompt", None)
    aux_calls: int = doc("auxiliary calls sent for this cell", 0)
    aux_prompt_tokens: int = doc("their prompt tokens (our count)", 0)
    aux_completion_tokens: int = doc("their completion tokens (as reported; unreported counts as absent)", 0)
    aux_latency_s: float = doc("their total latency", 0.0)
    metered: dict[str, dict[str, Any]] = doc(
        "calls a plugin made with its own SDK through the metering gateway, per phase (`write`, `read`, `aux`): "
        "`{calls, input_tokens, completion_tokens, latency_s}`; `completion_tokens` null when any reply gave none; "
        "`cpu_s` per phase: CPU seconds of the plugin's worker process and the processes it started; "
        "`outside`: per declared outside host `{calls, bytes_sent, bytes_received}` through the harness proxy; "
        "`undeclared`: connections refused to hosts the plugin did not declare (`network_hosts()`)",
        factory=dict,
    )
    evidence: dict[str, Any] | None = doc(EVIDENCE_DOC, None)

    def __post_init__(self) -> None:
        self.episode: dict[str, Any] | None = None  # an episodic task's rows only (EpisodeSummary): no field

    def row(self) -> dict[str, Any]:
        out = _row(self)
        if self.episode is not None:
            out["episode"] = self.episode
        return out


@dataclass(kw_only=True)
class Result(Terminal):
    """The prompt was admitted, sent, answered and graded."""

    EVENT: ClassVar[str] = "result"
    prediction: str = doc("the answer extracted from the completion")
    completion: str = doc("the raw model reply")
    answer: Any = doc("the gold answer (JSON-safe copy)")
    quality: float = doc("grader score in [0, 1]")
    verdict: dict[str, Any] = doc("the grader's detail (raw judge verdict, normalised strings), JSON-safe copy")
    grader: dict[str, Any] = doc("`{name, version}`")
    prompt_tokens: int = doc("our exact count of the rendered prompt")
    served_prompt_tokens: int | None = doc(
        "the server's `usage.prompt_tokens`; **null when the server gave none** (never 0 by default)"
    )
    served_cached_tokens: int | None = doc("cached prompt tokens the server reported, if any", None)
    served_count_matches: bool | None = doc("`served_prompt_tokens == prompt_tokens`; null when not reported")
    completion_tokens: int | None = doc("the server's completion tokens; null when not reported")
    utilisation: float = doc("`prompt_tokens / budget`")
    latency_s: float | None = doc("model call time (the successful attempt)")
    cost: float | None = doc("cost the backend reported (null when unknown)", None)
    attempts: int = doc("model call attempts (0 when served from the response cache)")
    cached: bool = doc("true when the reply came from the run's response cache")


@dataclass(kw_only=True)
class Violation(Terminal):
    """The budget was exceeded. Scored `quality: 0`."""

    EVENT: ClassVar[str] = "violation"
    phase: str = doc(
        "`prompt` (the answering prompt was over budget: not sent), `auxiliary` (a strategy's "
        "summary/compression prompt was over budget: not sent), or `served` (the server counted more "
        "prompt tokens than the budget: sent, completion kept for audit, scored 0), or "
        "`fabricated_tool_result` (an episode's prompt held a tool call or result that did not happen in it)"
    )
    prompt_tokens: int = doc("our exact count")
    served_prompt_tokens: int | None = doc("the server's count (phase `served`)", None)
    quality: float = doc("always 0", 0)
    cause: str | None = doc("which call, and the counts", None)
    completion: str | None = doc("the reply, kept for audit (phase `served`)", None)
    cached: bool | None = doc("phase `served`: the reply came from the response cache (no call was made)", None)
    plugin: str | None = doc("the strategy", None)


@dataclass(kw_only=True)
class Admitted(Terminal):
    """Prompts-only run (`run --prompts-only`): the prompt was built, counted and fitted the budget; it was not
    sent (no model is called), so there is no prediction and no quality."""

    EVENT: ClassVar[str] = "admitted"
    prompt_tokens: int = doc("our exact count of the rendered prompt")
    prompt_hash: str = doc("sha256 of the canonical prompt that would have been sent")
    utilisation: float = doc("`prompt_tokens / budget`")


@dataclass(kw_only=True)
class Error(Terminal):
    """Something failed; no prediction exists and none is invented."""

    EVENT: ClassVar[str] = "error"
    phase: str = doc(
        "`reset`, `strategy` (apply), `ingest`, `retrieve`, `counting`, `model`, `extract`, "
        "`grading`, `cell` (the cell's deadline passed), `executor` (the unit's remote worker "
        "was lost more often than the executor retries; a resume runs it again)"
    )
    cause: str = doc("the error, naming the plugin, its distribution and the item")
    plugin: str | None = doc("the plugin at fault, when known", None)
    distribution: str | None = doc("its distribution, when known", None)
    attempts: int | None = doc("model call attempts made, for `model` errors", None)
    prompt_tokens: int | None = doc("our count, when the prompt was counted", None)
    served_prompt_tokens: int | None = doc("the server's count, when a reply arrived", None)
    completion: str | None = doc("the reply, when one arrived before the failure", None)


@dataclass(kw_only=True)
class RefusedCall(CellEvent):
    """A call through a cell's `complete` after that cell ended. Refused (never sent) and written to
    `late_calls.jsonl` in the run directory, never to the cell's file (nothing follows a terminal row)."""

    EVENT: ClassVar[str] = "refused_call"
    purpose: str = doc("what the strategy said the call is for")
    reason: str = doc("why it was refused")


@dataclass(kw_only=True)
class EpisodeTurn(CellEvent):
    """One agent turn of an episodic task (see docs/episodes.md), written to `episodes.jsonl` in the run
    directory after the turn's reply was acted on; the cell's file has its `prompt_audit` (same `call`). A
    resumed episode starts again from turn 0, so the file may hold the turns of an unfinished attempt before
    the finished one: a cell's last run of turns from 0 is the one its terminal row summarises."""

    EVENT: ClassVar[str] = "episode_turn"
    turn: int = doc("the turn index, from 0 (the `call` of this turn's `prompt_audit`)")
    prompt_tokens: int = doc("our exact count of the turn's prompt")
    served_prompt_tokens: int | None = doc("the server's count of it; null when not reported")
    reply: str = doc("the agent's raw reply")
    done: bool = doc("true when the task ended the episode after this reply")
    tool_error: bool = doc("true when the reply's action failed (malformed, unknown tool, refused by the tool)")
    record: dict[str, Any] = doc("the task's own record of the step (action, tool output), JSON-safe copy")
    appended: list[dict[str, Any]] = doc(
        "the messages added to the history, `{role, content, metadata}`: the "
        "reply, then what answered it (tool result, the user's next message)"
    )
    user_calls: list[dict[str, Any]] = doc(
        "the simulated user's model calls of this turn, each `{prompt_tokens, "
        "served_prompt_tokens, completion_tokens, latency_s, cached, completion}`: "
        "logged here, never budgeted (turn 0 also has the user's opening calls)"
    )


@dataclass(kw_only=True)
class ItemRecord:
    """The content of one item the run used, written to `items.jsonl` in the run directory when the item is
    first used under a run_key. A resume that meets the same item id with other content stops, naming the
    item and the parts that changed: the data changed under the same run identity."""

    EVENT: ClassVar[str] = "item"
    time: str | None = doc("UTC ISO timestamp when the row was written (set by the log)", None)
    item_id: str = doc("the item's id")
    run_key: str = doc("the run_key the item was used under")
    digest: str = doc(
        "sha256 of the item in canonical form: id, system, history, query (what strategies see) and answer, "
        "category, metadata (the grading key)"
    )
    parts: dict[str, str] = doc("16 hex digits of the sha256 of each of those fields, to name what changed")

    def row(self) -> dict[str, Any]:
        return _row(self)


@dataclass(kw_only=True)
class EpisodeSummary:
    """`episode` on the terminal row (`result`, `violation`, `error`) of an episodic task: the outcome of the
    whole episode. Tasks with single calls have no `episode` field."""

    reward: float = doc("the task's reward in [0, 1] (also the row's `quality`); 0 for a violation or error", 0.0)
    end_reason: str | None = doc(
        "`done` (the task ended it), `max_turns` (the turn limit), `violation` (a "
        "prompt did not fit: the episode stopped at that turn) or `error`",
        None,
    )
    turns: int = doc("agent turns completed (replies acted on)", 0)
    calls: int = doc("agent model calls made (each one gated and audited)", 0)
    total_prompt_tokens: int = doc("sum of our counts over those calls", 0)
    peak_prompt_tokens: int = doc("the largest of them (the row's `prompt_tokens` on a result)", 0)
    tool_errors: int = doc("turns whose action was a tool error the agent saw", 0)
    served_counts_match: bool | None = doc(
        "every server-reported count equal to ours; null when the server reported none", None
    )
    user_calls: int = doc("simulated user model calls (not budgeted)", 0)
    user_prompt_tokens: int = doc("their prompt tokens (our count)", 0)
    user_completion_tokens: int = doc("their completion tokens", 0)
    outcome: dict[str, Any] | None = doc("the task's grade detail (JSON-safe copy); null unless graded", None)


CELL_EVENTS = (PromptAudit, AuxCall, MeteredCall, Warning, Result, Violation, Admitted, Error)
ALL_EVENTS = (*CELL_EVENTS, RefusedCall, EpisodeTurn, ItemRecord)
Event = CellEvent | ItemRecord
_CLASSES: dict[str, type[Event]] = {cls.EVENT: cls for cls in ALL_EVENTS}


def from_row(row: Any, where: str) -> Event:
    """The event a JSON row records, as its class; ``where`` (file and line) names it in the
    error for a row these classes do not describe: an unknown kind, an unknown or missing field."""
    if type(row) is not dict:
        raise SchemaError(f"{where}: a row is a JSON object, got {type(row).__name__}")
    kind = row.get("event")
    cls = _CLASSES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        known = ", ".join(sorted(_CLASSES))
        raise SchemaError(f"{where}: unknown event kind {kind!r} (schema_version {SCHEMA_VERSION} has {known})")
    given = {name: value for name, value in row.items() if name != "event"}
    episode = given.pop("episode", None) if issubclass(cls, Terminal) else None
    if episode is not None and (type(episode) is not dict or set(episode) - {f.name for f in fields(EpisodeSummary)}):
        raise SchemaError(f"{where}: {kind} row has an `episode` that is not an episode summary")
    names = {item.name for item in fields(cls)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise SchemaError(f"{where}: {kind} row has field(s) {unknown} that schema_version {SCHEMA_VERSION} lacks")
    missing = sorted(
        item.name
        for item in fields(cls)
        if item.name not in given and item.default is MISSING and item.default_factory is MISSING
    )
    if missing:
        raise SchemaError(f"{where}: {kind} row lacks its field(s) {missing}")
    event = cls(**given)
    if isinstance(event, Terminal):
        event.episode = episode
    return event


# -------------------------------------------------------------- older schema versions


def _unchanged(row: dict[str, Any]) -> dict[str, Any]:
    return row


# How a row of an older schema_version becomes a row of the next one: ``version -> (next, step)``.
# Version 3 added only the per-line `chain` (dropped on reading), `integrity.json` and `items.jsonl`,
# so a version 2 row is a version 3 row. Version 1 rows have no `run_key`, which no step can invent.
# Version 4 added `prompt_audit.tools_tokens` (null when absent, as in every version 3 run).
MIGRATIONS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "2": ("3", _unchanged),
    "3": ("4", _unchanged),
}


def migration(version: Any, where: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What turns a row of a run of ``version`` into a row of this schema; a run of a version
    these classes cannot read (unknown, too old, or newer) is refused, naming ``where``."""
    steps: list[Callable[[dict[str, Any]], dict[str, Any]]] = []
    at = str(version)
    while at != SCHEMA_VERSION:
        if at not in MIGRATIONS:
            newer = at.isdigit() and int(at) > int(SCHEMA_VERSION)
            raise SchemaError(
                f"{where}: schema_version {version!r} "
                + (
                    f"is newer than this budgetbench reads ({SCHEMA_VERSION}): upgrade budgetbench to read it"
                    if newer
                    else f"cannot be read (this budgetbench reads {', '.join([*MIGRATIONS, SCHEMA_VERSION])})"
                )
            )
        at, step = MIGRATIONS[at]
        steps.append(step)

    def upgrade(row: dict[str, Any]) -> dict[str, Any]:
        for step in steps:
            row = step(row)
        return row

    return upgrade


# ----------------------------------------------------------------- docs/events.md

_HEADER = f"""# Run directory and event schema (schema_version {SCHEMA_VERSION})

This page is generated from `budgetbench_core/events.py` (`python -m budgetbench_core.events >
docs/events.md`); a test fails when they disagree.

```
runs/<name>/manifest.json                                 what ran, with which versions, and the run identity
runs/<name>/cells/<task>/<strategy>/<budget>/r<k>.jsonl   one event per line
runs/<name>/retrievals/<system>/<item>.json               what a memory system returned (MAC'd, see Integrity)
runs/<name>/cache.sqlite                                  response cache (resume never pays twice; redacted; MAC'd)
runs/<name>/late_calls.jsonl                              calls refused because their cell had ended
runs/<name>/episodes.jsonl                                agent turns of episodic tasks (`episode_turn`)
runs/<name>/items.jsonl                                   the content digest of every item used (`item`)
runs/<name>/integrity.json                                run id, key fingerprint and the seal (see Integrity)
runs/<name>/.lock                                         held (flock) by the process writing the run
runs/<name>/report/                                       tables, plots, index.html
```

Names on disk (task, strategy, system and item ids) are injective: a name made only of
lower-case letters, digits, `_`, `.`, `-` (not starting with `.`, at most 64 characters) is
used as it is; any other name becomes a readable prefix, `~` and 12 hex digits of the
sha256 of the exact name (`user/42` -> `user_42~…`), so two ids never share a file.

Field names are a public schema. They change only with a `schema_version` bump in the manifest.
Version 2 added `run_key` on every row, `call` and `metadata_dropped` on `prompt_audit`, `sent`
and `prompt_hash` on `aux_call`, the `warning` kind, violation phase `served`, error phases
`reset`, `retrieve`, `extract`, `cell`, `distribution` on errors, `evidence` on `prompt_audit` and
terminal rows, and the `admitted` kind of prompts-only runs. Version 3 added the `chain` field on
every line, `integrity.json` and `items.jsonl`.

## Manifest

Every field of `manifest.json` is on [its own page](manifest.md), generated from
`budgetbench_core/run_manifest.py`. Its `schema_version` says how the rows are read: a run of an
older version is migrated row by row (`events.MIGRATIONS`), one of a newer or unknown version is
refused, and so is a row of an unknown kind or with an unknown field (naming the file and line).

## Secrets

Secrets are redacted before anything is truncated and before anything reaches disk (event rows,
manifest, retrievals, response cache, report): the value of every environment variable whose name
ends in `KEY`, `TOKEN`, `SECRET`, `PASSWORD` or `CREDENTIAL(S)` (and any 12-character piece of
it) becomes `<NAME redacted>`, and any `Authorization:`/`Bearer` value becomes `<redacted>`.

## Integrity

Every line of the cell files, `episodes.jsonl`, `late_calls.jsonl` and `items.jsonl` ends with
`"chain": {{"sha256": D, "hmac": M}}`: `D` is the SHA-256 of the file's bytes before the line and of
the line without this field, `M` an HMAC-SHA256 of `D` and the file's path under the run's own
key, kept outside the run directory (`$BUDGETBENCH_KEY_DIR`, else
`$XDG_STATE_HOME/budgetbench/keys/<run_id>`, else `~/.local/state/budgetbench/keys/<run_id>`,
mode 0600). `integrity.json` holds `run_id`, `key_id` (the key's public fingerprint) and
`sealed` (`at`, `files`: each file's `bytes` and `sha256` when the last invocation ended, and
their `hmac`). Each saved retrieval carries a `mac` field (an HMAC under the same key of its path
in the run and its canonical JSON) and each cache entry a `mac` column (of its key and its reply):
a retrieval that does not verify is refused, a cache entry that does not verify is never served.
`report`, `gate`, `compare`, `plan`, `merge`, a resume, and every plugin command that regrades or exports a run (through `read_run`) verify all of it first (see
docs/reliability.md); readers of the event API (`iter_events`, `final_rows`) drop the field.

## Run identity

`run_key` is a hash of: task and its options, the sha256 of every data file the task read
(`Task.data_files()`, plus any task option naming an existing file), strategies with their
parameters, budgets, repeats, limit, model and api base, tokenizer identity, grader (name,
version) and judge, seed, temperature, max output tokens, ingest-loss limit, and the
distribution versions of the core and the plugins used, and `prompts_only` when set (so a
full run never reuses a prompts-only row). `identity.json` in the run directory
keeps the fields of every key that wrote rows there. The items themselves are hashed too
(`items.jsonl`): a resume meeting an item whose content changed under the same run_key stops.

## Resume

Re-running the same command on the same `--out` directory resumes: cells whose last terminal
event is `result` or `violation` (`admitted` too, in a prompts-only run) **with the current
run_key** are kept and make no model call;
cells that ended in `error` are tried again. Rows with another run_key (with or without a
manifest) make the run stop before any call, naming the fields that differ (for a data file:
the file and both hashes). A torn last line is ignored by readers and cut off before the next
append. Duplicate budgets or strategies in one command are run once.
"""


def _type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("|", "\\|")


def render_markdown() -> str:
    """docs/events.md, from the dataclasses above."""
    lines = [_HEADER]
    common = {f.name for f in fields(CellEvent)}
    lines += [
        "## Common fields (every event but `item`)",
        "",
        "| field | type | meaning |",
        "|---|---|---|",
        "| `event` | str | the kind: " + ", ".join(f"`{c.EVENT}`" for c in ALL_EVENTS) + " |",
    ]
    lines += [f"| `{f.name}` | {_type_name(f.type)} | {f.metadata['doc']} |" for f in fields(CellEvent)]
    terminal = {f.name for f in fields(Terminal)} - common
    for cls in ALL_EVENTS:
        lines += ["", f"## `{cls.EVENT}`", "", (cls.__doc__ or "").strip().replace("\n    ", "\n"), ""]
        own = [f for f in fields(cls) if f.name not in common or not issubclass(cls, CellEvent)]
        if issubclass(cls, Terminal):
            own = [f for f in own if f.name not in terminal]
        lines += ["| field | type | meaning |", "|---|---|---|"]
        lines += [f"| `{f.name}` | {_type_name(f.type)} | {f.metadata['doc']} |" for f in own]
        if issubclass(cls, Terminal):
            lines.append(
                "| "
                + ", ".join(f"`{name}`" for name in (f.name for f in fields(Terminal)) if name in terminal)
                + " | | see Terminal fields |"
            )
    lines += [
        "",
        "## Terminal fields (result, violation, error, admitted)",
        "",
        "| field | type | meaning |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{f.name}` | {_type_name(f.type)} | {f.metadata['doc']} |" for f in fields(Terminal) if f.name in terminal
    ]
    lines.append("| `episode` | dict | only on an episodic task's rows: see Episode fields |")
    lines += [
        "",
        "## Episode fields (`episode` on terminal rows of an episodic task)",
        "",
        (EpisodeSummary.__doc__ or "").strip().replace("\n    ", "\n"),
        "",
        "| field | type | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{f.name}` | {_type_name(f.type)} | {f.metadata['doc']} |" for f in fields(EpisodeSummary)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
