"""The trust boundary: the harness never trusts the plugin it measures (issue 13).

One test per guarantee. Hostile plugins are registered on a real registry next to the
built-ins; the server is the loopback fault server, reached through the real litellm
backend and counted with ``tiktoken:cl100k_base``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import types
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core import (
    Grader,
    IngestReport,
    Item,
    MemoryStrategy,
    MemorySystem,
    Message,
    PromptCounter,
    Regime,
    RetrievedItem,
    RunConfig,
    Task,
    conformance as kit_module,
    events as event_records,
    hookimpl,
    run,
    sandbox,
)
from budgetbench_core.builtin.tokenizers import TiktokenTokenizer
from budgetbench_core.cache import CacheError
from budgetbench_core.engine import pipeline
from budgetbench_core.memory_systems import MemorySystemStrategy
from budgetbench_core.plugins import PluginInfo, load_registry
from budgetbench_core.runlog import cell_files, final_rows, iter_events, read_events, safe_name
from budgetbench_core.runner import RunConfigError
from budgetbench_core.testing import FaultServer, messages_hash

ROOT = Path(__file__).resolve().parents[2]
DIST = "budgetbench-trust-test"
RELEASE = threading.Event()  # lets hanging plugin threads end when the tests are over
PAD = " PADDING-NEVER-SENT" * 400
KEY = "sk-trust-PLANTED-9c41e07d2b6f4a13"
# In the harness's process (--isolation none): these check the containment that mode still
# needs (views, deadlines, late calls, blame); tests/test_isolation.py checks worker processes.
BASE = dict(
    isolation="none",
    task="synthetic-memory",
    model="openai/fault-model",
    tokenizer="tiktoken:cl100k_base",
    task_options={"items": 3, "history_tokens": 400},
    max_concurrency=2,
    retries=0,
    timeout_s=30.0,
)


def _tiktoken_count():
    tokenizer = TiktokenTokenizer("cl100k_base")
    return lambda messages: tokenizer.count([Message(m["role"], m["content"]) for m in messages])


# ----------------------------------------------------------------- hostile plugins


class LyingMessage(Message):
    """Counted as its content; its own to_chat would send 2,000 more tokens."""

    def to_chat(self):
        return {"role": self.role, "content": self.content + PAD}

    def to_dict(self):
        return {"role": self.role, "content": self.content + PAD}


class ToChatLies(MemoryStrategy):
    name, regime = "trust-to-chat", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        item = context.item
        head = [LyingMessage(item.system.role, item.system.content)] if item.system else []
        return [*head, LyingMessage(item.query.role, item.query.content)]


class RaisesSystemExit(MemoryStrategy):
    name, regime = "trust-system-exit", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        raise SystemExit(0)


class RaisesKeyboardInterrupt(MemoryStrategy):
    name, regime = "trust-keyboard-interrupt", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        raise KeyboardInterrupt


def _cyclic() -> dict:
    loop: dict = {"note": "keeps itself"}
    loop["self"] = loop
    return loop


class CycleMetadata(MemoryStrategy):
    name, regime = "trust-cycle", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        context.audit["loop"] = _cyclic()
        return context.frame([Message("user", "a note with a cyclic metadata value", {"loop": _cyclic()})])


class HangsInReset(MemoryStrategy):
    name, regime = "trust-hung-reset", Regime.LOCAL_ONLY

    def reset(self):
        RELEASE.wait(60)

    def apply(self, history, budget, context):
        return context.frame([])


LATE = {"calls": [], "done": threading.Event()}


class CompletesAfterTimeout(MemoryStrategy):
    """Outlives the cell's deadline, then tries an auxiliary call through the closed channel."""

    name, regime = "trust-late-complete", Regime.AUXILIARY_MODEL

    def apply(self, history, budget, context):
        RELEASE.wait(3.0)  # past item_timeout_s (1 s)
        try:
            context.complete([Message("user", "LATE-CALL-MARKER summarise this")], 8, "late")
            LATE["calls"].append("sent")
        except BaseException as exc:  # noqa: BLE001
            LATE["calls"].append(type(exc).__name__)
        finally:
            LATE["done"].set()
        return context.frame([])


def _kitchen_questions() -> list[str]:
    from budgetbench_core.builtin.synthetic_memory import SyntheticMemory

    return [item.query.content for item in SyntheticMemory(items=14, history_tokens=400).load(None, 0)]


KITCHEN_QUESTIONS = _kitchen_questions()  # a view's id is opaque: an item is known by its question


class Kitchen(MemoryStrategy):
    """Every hostile behaviour at once, chosen per cell from the item and budget."""

    name, regime = "trust-hostile", Regime.AUXILIARY_MODEL

    def reset(self):
        self.calls = 0

    def apply(self, history, budget, context):
        behaviour = KITCHEN_QUESTIONS.index(context.item.query.content) % 7  # the item's position
        if behaviour == 0:
            raise SystemExit(3)
        if behaviour == 1:
            raise KeyboardInterrupt
        if behaviour == 2:  # lies to the wire and pads past the budget
            return [LyingMessage("user", "x " * budget * 2), *context.frame([])]
        if behaviour == 3:  # cyclic metadata and over budget
            return context.frame([Message("user", "pad " * budget * 2, {"loop": _cyclic()})])
        if behaviour == 4:
            object.__setattr__(history[0], "content", "overwritten")
            return context.frame(list(history))
        if behaviour == 5:  # a summary call over the budget, uncaught
            context.complete([Message("user", "summarise " * budget * 2)], 8, "summary")
        return {"not": "a prompt"}


class EchoIds(MemorySystem):
    """A memory system that stores each item's first message and returns it: shows which item's
    memories a prompt got (its view's id is opaque)."""

    name = "trust-echo-ids"

    def reset(self):
        self.stored = []

    def ingest(self, sessions, context):
        self.stored = [f"memory of {sessions[0].messages[0].content}"]
        return IngestReport(len(sessions), len(sessions))

    def retrieve(self, query, context):
        return [RetrievedItem(text, 1.0) for text in self.stored]


class DataFileTask(Task):
    """Reads one JSON file of questions and declares it."""

    name, default_grader = "trust-data-file", "exact-match"

    def __init__(self, path: str, **options):
        super().__init__(path=path, **options)
        self.path = path

    def load(self, limit, seed):
        records = json.loads(self.read_data_file(self.path).read_text(encoding="utf-8"))
        for record in records:
            yield Item(
                record["id"],
                (Message("user", f"My name is {record['answer']}."),),
                Message("user", "What is my name?"),
                record["answer"],
                Message("system", "Answer briefly."),
            )


class CollidingIds(Task):
    name, default_grader = "trust-colliding-ids", "exact-match"

    def load(self, limit, seed):
        for item_id in ("user/42", "user_42", "User_42"):
            yield Item(
                item_id,
                (Message("user", f"hello from {item_id}", {"session_id": "s1"}),),
                Message("user", "Who am I?"),
                item_id,
                Message("system", "Answer briefly."),
            )


class IngestExits(MemorySystem):
    name = "trust-ingest-exits"

    def ingest(self, sessions, context):
        raise SystemExit(2)

    def retrieve(self, query, context):
        return []


class RetrieveHangs(MemorySystem):
    name = "trust-retrieve-hangs"

    def ingest(self, sessions, context):
        return IngestReport(len(sessions), len(sessions))

    def retrieve(self, query, context):
        RELEASE.wait(60)
        return []


class ExtractInterrupts(Task):
    """A task whose answer extraction raises KeyboardInterrupt."""

    name, default_grader = "trust-extract-interrupts", "exact-match"

    def load(self, limit, seed):
        yield Item("only", (), Message("user", "Who is Amara?"), "Amara", Message("system", "Answer briefly."))

    def extract_prediction(self, item, completion):
        raise KeyboardInterrupt


class GraderExits(Grader):
    name, version = "trust-grader-exits", "1"

    def grade(self, item, prediction, context):
        raise SystemExit("grader gave up")


class EditsMetadataThroughGc(MemoryStrategy):
    """Reaches the dict behind a message's read-only metadata and rewrites a value in place."""

    name, regime = "trust-gc-metadata", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        import gc

        hidden = next(r for r in gc.get_referents(history[0].metadata) if type(r) is dict)
        hidden["session_id"] = "rewritten"
        return context.frame(list(history)[-1:])


STRATEGIES = (
    EditsMetadataThroughGc,
    ToChatLies,
    RaisesSystemExit,
    RaisesKeyboardInterrupt,
    CycleMetadata,
    HangsInReset,
    CompletesAfterTimeout,
    Kitchen,
    EchoIds,
    IngestExits,
    RetrieveHangs,
)


@hookimpl
def register_strategies(register):
    for strategy in STRATEGIES:
        register(strategy)


@hookimpl
def register_tasks(register):
    register(DataFileTask)
    register(CollidingIds)
    register(ExtractInterrupts)


@hookimpl
def register_graders(register):
    register(GraderExits)


@pytest.fixture(scope="module")
def registry():
    registry = load_registry()
    module = types.ModuleType("trust_reliability_plugins")
    module.register_strategies = register_strategies
    module.register_tasks = register_tasks
    module.register_graders = register_graders
    registry.add_plugin(module, PluginInfo("trust", DIST, "0.0.1"))
    yield registry
    RELEASE.set()


def _no_event_after_terminal(out: Path) -> None:
    """Within each cell file, every event of an item precedes (or is) that item's terminal row."""
    for path in cell_files(out):
        closed: set[str] = set()
        for event in read_events(path):
            assert event["item_id"] not in closed, (path, event)
            if event["event"] in ("result", "violation", "error"):
                closed.add(event["item_id"])


# ----------------------------------------------------------------- 1. what is counted is what is sent


def test_a_to_chat_override_never_reaches_the_wire(tmp_path, registry):
    """Old code: counted the content, sent to_chat (2,000+ tokens more), recorded an admitted result."""
    with FaultServer(count_prompt=_tiktoken_count()) as server:
        summary = run(
            RunConfig(strategies=["trust-to-chat"], budgets=[300], out=tmp_path / "run", api_base=server.url, **BASE),
            registry=registry,
        )
    assert summary.results == 3 and server.requests
    rows = final_rows(tmp_path / "run")
    audits = {e["item_id"]: e for e in iter_events(tmp_path / "run") if e["event"] == "prompt_audit"}
    for row in rows.values():
        assert row["served_prompt_tokens"] == row["prompt_tokens"] <= 300
        assert messages_hash(audits[row["item_id"]]["messages"]) in {r.body_hash for r in server.requests}
    assert all(r.prompt_tokens <= 300 for r in server.requests)


def test_served_count_over_the_budget_is_a_violation(tmp_path, registry):
    """The server counts 17 more than we do: at a budget between the two, the row is a violation."""
    settings = {**BASE, "task_options": {"items": 1, "history_tokens": 300}}
    with FaultServer(rate=1.0, faults=("usage_mismatch",), count_prompt=_tiktoken_count()) as server:
        probe = run(
            RunConfig(
                strategies=["full_context"], budgets=[4000], out=tmp_path / "probe", api_base=server.url, **settings
            ),
            registry=registry,
        )
        (ours,) = [r["prompt_tokens"] for r in final_rows(tmp_path / "probe").values()]
        budget = ours + 5  # the prompt fits our count; the server's is 17 more
        run(
            RunConfig(
                strategies=["full_context"], budgets=[budget], out=tmp_path / "run", api_base=server.url, **settings
            ),
            registry=registry,
        )
    assert probe.results == 1
    rows = list(final_rows(tmp_path / "run").values())
    assert {(r["event"], r["phase"]) for r in rows} == {("violation", "served")}
    for row in rows:
        assert (
            row["quality"] == 0 and row["completion"] and row["served_prompt_tokens"] > budget >= row["prompt_tokens"]
        )


# ----------------------------------------------------------------- 2. run identity


def test_every_row_carries_the_run_key_and_resume_reuses_it(tmp_path, registry):
    with FaultServer() as server:
        settings = dict(strategies=["truncation"], budgets=[300], out=tmp_path / "run", api_base=server.url, **BASE)
        run(RunConfig(**settings), registry=registry)
        again = run(RunConfig(**settings), registry=registry)
    keys = {e["run_key"] for e in iter_events(tmp_path / "run")}
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert keys == {manifest["run_key"]} and len(manifest["run_key"]) == 16
    assert again.model_calls == 0 and again.cells_skipped == again.cells_total


def test_resume_without_manifest_and_another_seed_is_refused(tmp_path, registry):
    """Old code: with manifest.json deleted, the rows were relabelled as the new experiment."""
    with FaultServer() as server:
        settings = dict(strategies=["truncation"], budgets=[300], out=tmp_path / "run", api_base=server.url, **BASE)
        run(RunConfig(**settings), registry=registry)
        (tmp_path / "run" / "manifest.json").unlink()
        with pytest.raises(RunConfigError, match=r"differ in: seed: 0 -> 1"):
            run(RunConfig(**{**settings, "seed": 1}), registry=registry)
        with pytest.raises(RunConfigError, match=r'model: "openai/fault-model" -> "openai/other-model"'):
            run(RunConfig(**{**settings, "model": "openai/other-model"}), registry=registry)
    assert len(final_rows(tmp_path / "run")) == 3  # nothing was added


def test_a_changed_strategy_parameter_is_refused(tmp_path, registry):
    with FaultServer() as server:
        settings = dict(strategies=["recency"], budgets=[300], out=tmp_path / "run", api_base=server.url, **BASE)
        run(RunConfig(**settings), registry=registry)
        with pytest.raises(RunConfigError, match=r"strategies: .*recency.*\{\}.*keep_last"):
            run(RunConfig(**settings, strategy_params={"recency": {"keep_last": 2}}), registry=registry)


def test_a_changed_data_file_is_refused_naming_the_file_and_both_hashes(tmp_path, registry):
    import hashlib

    data = tmp_path / "questions.json"
    data.write_text(json.dumps([{"id": "q1", "answer": "Amara"}, {"id": "q2", "answer": "Bruno"}]))
    before = hashlib.sha256(data.read_bytes()).hexdigest()
    with FaultServer() as server:
        settings = dict(
            BASE,
            task="trust-data-file",
            task_options={"path": str(data)},
            strategies=["truncation"],
            budgets=[300],
            out=tmp_path / "run",
            api_base=server.url,
        )
        run(RunConfig(**settings), registry=registry)
        data.write_text(json.dumps([{"id": "q1", "answer": "Chiara"}, {"id": "q2", "answer": "Bruno"}]))
        after = hashlib.sha256(data.read_bytes()).hexdigest()
        with pytest.raises(RunConfigError) as refused:
            run(RunConfig(**settings), registry=registry)
    message = str(refused.value)
    assert f"data file {data.resolve()}: sha256 {before} -> {after}" in message
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["data_files"] == {str(data.resolve()): before}


def test_declared_data_files_of_the_dataset_tasks(tmp_path):
    """synthetic-memory reads nothing; the file tasks declare the file they read."""
    from budgetbench_core.plugins import get_registry

    shared = ROOT.parent / "shared" / "data"
    files = {
        "longmemeval": ("path", shared / "longmemeval" / "longmemeval_oracle.json", {"split": "oracle"}),
        "longbench-v2": ("path", shared / "longbench_v2" / "longbench_v2_short_sample.json", {}),
        "swebench-verified": ("path", shared / "swebench" / "swebench_verified_mini.jsonl", {}),
    }
    registry = get_registry()
    synthetic = registry.get("task", "synthetic-memory").obj(items=2, history_tokens=300)
    list(synthetic.load(None, 0))
    assert synthetic.data_files() == []
    checked = 0
    for name, (option, path, extra) in files.items():
        if name not in registry.names("task") or not path.exists():
            continue
        task = registry.get("task", name).obj(**{option: str(path)}, **extra)
        next(iter(task.load(1, 0)))
        assert [p.resolve() for p in task.data_files()] == [path.resolve()], name
        checked += 1
    assert checked >= 1


def test_duplicate_budgets_and_strategies_run_once(tmp_path, registry):
    with FaultServer() as server:
        summary = run(
            RunConfig(
                strategies=["truncation", "truncation"],
                budgets=[300, 300, 500],
                out=tmp_path / "run",
                api_base=server.url,
                **BASE,
            ),
            registry=registry,
        )
    terminal = [e for e in iter_events(tmp_path / "run") if e["event"] in ("result", "violation", "error")]
    assert summary.cells_total == len(terminal) == 3 * 2
    assert len(server.requests) == 6


# ----------------------------------------------------------------- 3. containment and deadlines


@pytest.mark.parametrize(
    "strategy, words", [("trust-system-exit", "SystemExit"), ("trust-keyboard-interrupt", "KeyboardInterrupt")]
)
def test_base_exceptions_inside_apply_become_error_rows(tmp_path, registry, strategy, words):
    """Old code: SystemExit inside apply ended the run (exit code 0) with no row."""
    with FaultServer() as server:
        summary = run(
            RunConfig(
                strategies=[strategy, "truncation"], budgets=[300], out=tmp_path / "run", api_base=server.url, **BASE
            ),
            registry=registry,
        )
    rows = final_rows(tmp_path / "run")
    assert summary.errors == 3 and summary.results == 3 and len(rows) == 6
    for key, row in rows.items():
        if key[1] == strategy:
            assert (row["event"], row["phase"], row["plugin"], row["distribution"]) == (
                "error",
                "strategy",
                strategy,
                DIST,
            )
            assert words in row["cause"]


@pytest.mark.parametrize(
    "settings, phase, plugin",
    [
        ({"strategies": ["trust-ingest-exits"]}, "ingest", "trust-ingest-exits"),
        ({"strategies": ["trust-retrieve-hangs"], "item_timeout_s": 1.0}, "retrieve", "trust-retrieve-hangs"),
        (
            {"strategies": ["truncation"], "task": "trust-extract-interrupts", "task_options": {}},
            "extract",
            "trust-extract-interrupts",
        ),
        ({"strategies": ["truncation"], "grader": "trust-grader-exits"}, "grading", "trust-grader-exits"),
    ],
)
@pytest.mark.parametrize("isolation", ["none", "process"])
def test_every_plugin_phase_is_contained(tmp_path, registry, settings, phase, plugin, isolation):
    """ingest, retrieve, extract_prediction and grading: a BaseException or a hang is an error row
    naming the plugin, its distribution and the phase, never the end of the run (in the
    harness's process, and with the strategy in its worker)."""
    with FaultServer() as server:
        summary = run(
            RunConfig(
                **{
                    **BASE,
                    "budgets": [300, 500],
                    "out": tmp_path / "run",
                    "api_base": server.url,
                    "isolation": isolation,
                    **settings,
                }
            ),
            registry=registry,
        )
    rows = list(final_rows(tmp_path / "run").values())
    assert rows and summary.errors == len(rows) == summary.cells_total
    for row in rows:
        assert (row["event"], row["phase"], row["plugin"], row["distribution"]) == ("error", phase, plugin, DIST), row
        assert "prediction" not in row or row.get("prediction") is None


def test_cyclic_metadata_is_dropped_not_fatal(tmp_path, registry):
    """Old code: a metadata value with a reference cycle aborted the whole run."""
    with FaultServer() as server:
        summary = run(
            RunConfig(strategies=["trust-cycle"], budgets=[300], out=tmp_path / "run", api_base=server.url, **BASE),
            registry=registry,
        )
    assert summary.results == 3
    audits = [e for e in iter_events(tmp_path / "run") if e["event"] == "prompt_audit"]
    assert all(any("loop.self (cycle)" in path for path in a["metadata_dropped"]) for a in audits)
    assert all(a["strategy_audit"]["loop"]["note"] == "keeps itself" for a in audits)


class _Hostile:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def _with_nested():
    nested = {"tags": ["a", "b"], "who": {"name": "x"}}
    history = (Message("user", "one", {"session_id": "s1", **nested}), Message("assistant", "two", {"n": 1.5}))
    return Item("i", history, Message("user", "q?"), "ans", system=Message("system", "sys", {"k": "v"}))


def _hidden(message):
    return next(r for r in __import__("gc").get_referents(message.metadata) if type(r) is dict)


MUTATIONS = {
    "content": lambda v: object.__setattr__(v.history[0], "content", "changed"),
    "content, same text": lambda v: object.__setattr__(v.history[0], "content", "".join(["o", "ne"])),
    "role": lambda v: object.__setattr__(v.history[1], "role", "user"),
    "metadata object": lambda v: object.__setattr__(v.history[0], "metadata", {"session_id": "s1"}),
    "added field": lambda v: object.__setattr__(v.history[0], "extra", 1),
    "class": lambda v: object.__setattr__(v.history[0], "__class__", LyingMessage),
    "history swapped": lambda v: object.__setattr__(v, "history", tuple(list(v.history))),
    "query swapped": lambda v: object.__setattr__(v, "query", Message("user", "q?")),
    "system metadata": lambda v: _hidden(v.system).update(k="w"),
    "flat value, same text": lambda v: _hidden(v.history[0]).update(session_id="".join(["s", "1"])),
    "flat value, always equal": lambda v: _hidden(v.history[0]).update(session_id=_Hostile()),
    "key added": lambda v: _hidden(v.history[1]).update(m=2),
    "key removed and put back": lambda v: (
        _hidden(v.history[0]).update(session_id=_hidden(v.history[0]).pop("session_id"))
        or _hidden(v.history[0]).update(tags=_hidden(v.history[0]).pop("tags"))
    ),
    "nested list appended": lambda v: v.history[0].metadata["tags"].append("c"),
    "nested dict edited": lambda v: v.history[0].metadata["who"].update(name="y"),
    "nested hostile object": lambda v: v.history[0].metadata["tags"].__setitem__(0, _Hostile()),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_view_check_catches_every_kind_of_mutation(mutation):
    """The per-cell check compares identities, not a fingerprint: each edit a hostile strategy
    can make to its view (messages, flat or nested metadata, swapped objects) is still caught,
    and the runner's own item never changes."""
    item = _with_nested()
    view = sandbox.PrivateView(item)
    assert view.intact() and (view.item.history, view.item.query, view.item.system) == (
        item.history,
        item.query,
        item.system,
    )
    assert view.item.history[0] is not item.history[0]
    MUTATIONS[mutation](view.item)
    assert not view.intact()
    assert item == _with_nested() and [dict(m.metadata) for m in item.history] == [
        dict(m.metadata) for m in _with_nested().history
    ]


def test_a_strategy_editing_metadata_behind_its_proxy_is_an_error(tmp_path, registry):
    with FaultServer() as server:
        summary = run(
            RunConfig(
                strategies=["trust-gc-metadata", "truncation"],
                budgets=[300],
                out=tmp_path / "run",
                api_base=server.url,
                **BASE,
            ),
            registry=registry,
        )
    rows = final_rows(tmp_path / "run")
    edited = [r for k, r in rows.items() if k[1] == "trust-gc-metadata"]
    assert len(edited) == 3 and summary.results == 3  # truncation, on the same items, is untouched
    assert all(("error", "strategy") == (r["event"], r["phase"]) and "mutated" in r["cause"] for r in edited)


def _stages(first, second, second_deadline=5.0):
    strategy, tokenizer = sandbox.PluginRef("strategy", "s", "dist-s"), sandbox.PluginRef("tokenizer", "t", "dist-t")
    return sandbox.contained_stages(
        sandbox.Stage("strategy", strategy, first, sandbox.Deadline(5.0)),
        sandbox.Stage("counting", tokenizer, second, second_deadline),
    )


def _hang(_):
    RELEASE.wait(60)


def _raise(error):
    def raising(_):
        raise error

    return raising


def test_chained_plugin_calls_keep_their_own_blame_and_deadlines():
    """Two plugin calls on one handoff: a failure or a hang in either names its own plugin and
    phase, the second's deadline runs from its own start, and whatever the first raises
    (another phase's PhaseError, a forged PluginFailure) is still the first's."""
    import time

    assert _stages(lambda _: 2, lambda value: value * 3) == 6
    with pytest.raises(sandbox.StageFailure) as caught:
        _stages(lambda _: 1, _raise(ValueError("bad count")))
    assert caught.value.stage == 1 and caught.value.failure.plugin.name == "t"
    assert caught.value.failure.cause == "tokenizer 't' (dist-t) failed in counting: ValueError: bad count"
    with pytest.raises(sandbox.StageFailure) as caught:
        _stages(lambda _: time.sleep(0.6), _hang, second_deadline=0.5)  # the first took longer than the second may
    assert caught.value.stage == 1 and caught.value.failure.timed_out
    assert "tokenizer 't' (dist-t) did not return within 0.5 s (counting)" == caught.value.failure.cause
    forged = sandbox.PluginFailure("counting", sandbox.PluginRef("tokenizer", "t"), "blame the tokenizer")
    for error in (sandbox.PhaseError("counting", KeyError("x")), forged, SystemExit(3)):
        with pytest.raises(sandbox.StageFailure) as caught:
            _stages(_raise(error), lambda value: value)
        assert caught.value.stage == 0
    with pytest.raises(sandbox.StageFailure) as caught:
        sandbox.contained_stages(sandbox.Stage("strategy", sandbox.PluginRef("strategy", "s"), _hang, 0.3))
    assert caught.value.stage == 0 and caught.value.failure.timed_out


class _Plain(MemoryStrategy):
    name, regime = "plain", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        return context.frame([])


class _ResetsInMixin:
    def reset(self):
        RELEASE.wait(60)


class _MixinFirst(_ResetsInMixin, _Plain):
    pass


class _LooksUp(_Plain):
    def __getattribute__(self, name):
        return object.__getattribute__(self, name)


class _PretendMeta(type(MemoryStrategy)):
    def __eq__(cls, other):
        return True

    __hash__ = type.__hash__


class _Pretends(_ResetsInMixin, metaclass=_PretendMeta):
    def apply(self, history, budget, context):
        return context.frame([])


def _with_own_reset():
    strategy = _Plain()
    strategy.reset = lambda: RELEASE.wait(60)
    return strategy


@pytest.mark.parametrize(
    ("make", "skipped"),
    [
        (_Plain, True),
        (type("Subclass", (_Plain,), {}), True),
        (HangsInReset, False),
        (_MixinFirst, False),
        (_LooksUp, False),
        (_Pretends, False),
        (_with_own_reset, False),
        (lambda: MemorySystemStrategy(EchoIds()), False),
    ],
)
def test_only_the_base_no_op_reset_skips_its_worker(make, skipped):
    """A strategy that inherits ``MemoryStrategy.reset`` (nothing to do) is not handed to a
    worker for it; any other reset, however it is reached, is still contained."""
    from budgetbench_core.runner import resets_nothing

    assert resets_nothing(make()) is skipped


def test_a_hung_reset_is_timed_out(tmp_path, registry):
    with FaultServer() as server:
        summary = run(
            RunConfig(
                strategies=["trust-hung-reset", "truncation"],
                budgets=[300, 500],
                out=tmp_path / "run",
                api_base=server.url,
                item_timeout_s=1.0,
                **BASE,
            ),
            registry=registry,
        )
    rows = final_rows(tmp_path / "run")
    hung = [r for k, r in rows.items() if k[1] == "trust-hung-reset"]
    assert len(hung) == 6 and summary.results == 6
    assert all((r["event"], r["phase"], r["plugin"]) == ("error", "reset", "trust-hung-reset") for r in hung)
    assert all("did not return within 1 s" in r["cause"] for r in hung)


def test_complete_after_the_cell_ended_is_refused_and_never_sent(tmp_path, registry):
    """Old code: calls made after a cell's timeout still reached the server."""
    LATE["calls"].clear()
    LATE["done"].clear()
    with FaultServer() as server:
        run(
            RunConfig(
                strategies=["trust-late-complete"],
                budgets=[300],
                out=tmp_path / "run",
                api_base=server.url,
                item_timeout_s=1.0,
                **{**BASE, "task_options": {"items": 1, "history_tokens": 300}},
            ),
            registry=registry,
        )
        assert LATE["done"].wait(30)
    (row,) = final_rows(tmp_path / "run").values()
    assert (row["event"], row["phase"]) == ("error", "strategy") and "did not return within 1 s" in row["cause"]
    assert LATE["calls"] == ["CellClosed"]
    assert server.requests == []  # the late call never reached the server
    late = [json.loads(line) for line in (tmp_path / "run" / "late_calls.jsonl").read_text().splitlines()]
    assert [(e["event"], e["purpose"]) for e in late] == [("refused_call", "late")]
    _no_event_after_terminal(tmp_path / "run")


def test_a_server_that_trickles_bytes_is_cut_at_the_total_deadline(tmp_path, registry):
    """Each byte arrives well within the 1 s per-read timeout; the whole reply takes ~10 s.
    Old code: the call waited for it and recorded a result."""
    with FaultServer(rate=1.0, faults=("trickle",), trickle_s=0.04) as server:
        run(
            RunConfig(
                strategies=["truncation"],
                budgets=[300],
                out=tmp_path / "run",
                api_base=server.url,
                **{**BASE, "timeout_s": 1.0, "task_options": {"items": 1, "history_tokens": 300}},
            ),
            registry=registry,
        )
    (row,) = final_rows(tmp_path / "run").values()
    assert (row["event"], row["phase"]) == ("error", "model")
    assert "total deadline of 1 s" in row["cause"] and server.requests


# ----------------------------------------------------------------- 4. names on disk


@pytest.mark.parametrize(
    "text",
    [
        'headers: {"Authorization": "Bearer sk-abcdefgh12345678"} ü',
        "AUTHORIZATION= token sk-abcdefgh12345678 \u4e2d",
        "authorİzation: sk-abcdefgh12345678",
        "AUTHORıZATION: sk-abcdefgh12345678 \u4e2d",
        "see BeArEr sk-abcdefgh12345678 in the log \U0001f600",
    ],
)
def test_redaction_finds_the_header_words_in_any_case_and_script(text):
    """The words are looked for in the lowered UTF-8 bytes (fast); the dotted and dotless i,
    which the pattern also matches, take the str path."""
    from budgetbench_core.runlog import redact

    assert "sk-abcdefgh12345678" not in redact(text) and "<redacted>" in redact(text)


def test_every_piece_of_a_key_is_redacted_wherever_it_starts(monkeypatch):
    """The piece search is skipped when no aligned half-piece block occurs: every window of the
    key, at every offset, must still be found."""
    from budgetbench_core.runlog import redact

    monkeypatch.setenv("TRUST_PIECES_API_KEY", KEY)
    for start in range(len(KEY) - 12 + 1):
        piece = KEY[start : start + 12]
        assert piece not in redact(f"quoted back: ...{piece}... in an error")


def test_an_event_line_joined_from_remembered_messages_is_the_whole_serialisation():
    """Prompt audits are serialised per message, remembered across tiers: the text must be what
    ``json.dumps`` of the whole row gives, for values that compare equal but print apart too."""
    from budgetbench_core.runlog import _event_json

    def message(value):
        return {"role": "user", "content": "same \u00e9 \u2028" + PAD * 2, "metadata": {"v": value}}  # long

    rows = [
        {"time": "t", "event": "prompt_audit", "messages": [message(v)], "strategy_audit": {"n": [1]}, "evidence": None}
        for v in (1, True, 1.0, -0.0, 0.0, None, "1", [1], {"a": 1})
    ]
    rows += [
        {"messages": [{"content": PAD * 2, "role": "user"}, {"role": "user", "content": PAD * 2}]},
        {"time": 1, "messages": [{"role": "user", "content": "x", "metadata": {}}], "x": {"y": float("nan")}},
        {"time": 1, "messages": []},
        {"time": 1, "messages": ["not a dict"]},
    ]
    for _ in range(2):  # the second pass reads what the first remembered
        for row in rows:
            assert _event_json(row) == json.dumps(row, ensure_ascii=False, default=str)


def test_a_prompt_joined_from_remembered_messages_is_the_whole_serialisation():
    """The request body, cache key and prompt hash come from ``chat_json``, which joins a long
    prompt from remembered messages: it must be ``json.dumps`` of the whole chat form, also for
    messages alike in text but sent apart (a tool call, a tool call id, another role)."""
    from budgetbench_core.gate import chat_json

    text = "same \u00e9 \u2028 \ud83e\udde0" + PAD * 2  # long enough to be remembered
    calls = '[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]'
    variants = [
        Message("user", text),
        Message("assistant", text),
        Message("assistant", text, {"tool_calls": calls}),
        Message("assistant", text, {"tool_calls": calls.replace("c1", "c2")}),
        Message("assistant", text, {"tool_calls": ""}),
        Message("tool", text, {"tool_call_id": "c1"}),
        Message("tool", text, {"tool_call_id": "c2"}),
        Message("tool", text),
        Message("system", text, {"session_id": "s"}),
    ]
    for _ in range(2):  # the second pass reads what the first remembered
        for first in variants:
            for second in variants:
                prompt = (first, second, Message("user", "q?"))
                assert chat_json(prompt) == json.dumps([m.to_chat() for m in prompt], ensure_ascii=False)


def test_names_on_disk_are_injective():
    names = ["user/42", "user_42", "User_42", "user 42", "a" * 200, "a" * 199 + "b", ".", "..", "", "x~1", "ü", "u"]
    mapped = [safe_name(n) for n in names]
    assert len(set(mapped)) == len(names)
    assert len({m.lower() for m in mapped}) == len(names)  # case-insensitive file systems too
    assert all("/" not in m and m not in (".", "..") and len(m) <= 64 for m in mapped)
    assert safe_name("synth-00001-temporal") == "synth-00001-temporal"  # plain ids stay readable


def test_colliding_ids_get_their_own_retrievals_and_pages(tmp_path, registry):
    """Old code: user/42 and user_42 shared one retrievals file; one item got the other's memories."""
    with FaultServer() as server:
        run(
            RunConfig(
                **{**BASE, "task": "trust-colliding-ids", "task_options": {}},
                strategies=["trust-echo-ids"],
                budgets=[300],
                out=tmp_path / "run",
                api_base=server.url,
            ),
            registry=registry,
        )
    audits = [e for e in iter_events(tmp_path / "run") if e["event"] == "prompt_audit"]
    assert len(audits) == 3
    for audit in audits:
        memories = audit["messages"][1]["content"]
        assert f"memory of hello from {audit['item_id']}\n" in memories + "\n"
    assert len(list((tmp_path / "run" / "retrievals").rglob("*.json"))) == 3
    from budgetbench_core.report.html import item_page_name

    assert len({item_page_name(i) for i in ("user/42", "user_42", "User_42")}) == 3


# ----------------------------------------------------------------- 5. measured or null


def test_missing_usage_is_null_and_reported_apart(tmp_path, registry):
    """Old code: a reply without a usage block was recorded as served_prompt_tokens: 0."""
    with FaultServer(rate=1.0, faults=("no_usage",)) as server:
        run(
            RunConfig(strategies=["truncation"], budgets=[300], out=tmp_path / "run", api_base=server.url, **BASE),
            registry=registry,
        )
    rows = list(final_rows(tmp_path / "run").values())
    assert len(rows) == 3
    assert all(
        r["event"] == "result"
        and r["served_prompt_tokens"] is None
        and r["served_count_matches"] is None
        and r["completion_tokens"] is None
        for r in rows
    )
    from budgetbench_core.report.data import load_run

    data = load_run(tmp_path / "run")
    assert data.served_unreported() == 3 and data.served_mismatches() == []
    from budgetbench_core.report import write_report

    write_report(tmp_path / "run")
    pages = "".join(
        p.read_text(encoding="utf-8") for p in (tmp_path / "run" / "report").glob("*.*") if p.suffix in (".md", ".html")
    )
    assert "not reported by the server on 3 result rows (counted apart from mismatches)" in pages
    assert "not reported" in (tmp_path / "run" / "report" / "index.html").read_text(encoding="utf-8")


# ----------------------------------------------------------------- 6. secrets


def _files_with(folder: Path, needle: str) -> list[str]:
    done = subprocess.run(["grep", "-rl", "--binary-files=text", needle, str(folder)], capture_output=True, text=True)
    return done.stdout.split()


class _LongErrorServer:
    """A prompt's first request gets a 500 whose message quotes the key after some text, the
    n-th such error with 300 + 20 n characters, so one error puts the key across a
    500-character cut whatever the client's own prefix; a second request gets a 200 reply that
    quotes the key."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler

        from budgetbench_core.loopback import _QuietServer

        seen = Counter()
        errors = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen[body] += 1
                key = self.headers.get("Authorization", "")
                if seen[body] == 1:
                    errors.append(body)
                    padding = "x" * (300 + 20 * len(errors))
                    status, payload = 500, {"error": {"message": f"{padding} you sent {key}", "type": "server"}}
                else:
                    payload = {
                        "id": "c",
                        "object": "chat.completion",
                        "created": 1,
                        "model": "m",
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": f"Amara. By the way: {key}"},
                            }
                        ],
                        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
                    }
                    status = 200
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_planted_key_echoed_in_a_reply_and_a_long_error_never_reaches_disk(tmp_path, registry, monkeypatch):
    """Old code: the cache kept the 200 reply unredacted, and a long error was cut (500 characters)
    before it was redacted, leaving part of the key."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = _LongErrorServer()
    try:
        settings = dict(
            strategies=["truncation"],
            budgets=[300, 400],
            out=tmp_path / "run",
            api_base=server.url,
            **{**BASE, "retries": 0, "task_options": {"items": 6, "history_tokens": 300}},
        )
        first = run(RunConfig(**settings), registry=registry)  # every first request: the long error
        second = run(RunConfig(**settings), registry=registry)  # retried: the 200 reply quoting the key
    finally:
        server.close()
    assert first.errors > 0 and second.results > 0  # both the long errors and the replies quoting the key
    for piece in (KEY, KEY[:12], KEY[-12:], KEY[10:22]):
        assert _files_with(tmp_path / "run", piece) == [], piece


# ----------------------------------------------------------------- 7. cache integrity


def test_a_corrupt_cache_entry_is_a_miss_with_a_warning(tmp_path, registry):
    import shutil

    with FaultServer() as server:
        settings = dict(
            strategies=["truncation"],
            budgets=[300],
            out=tmp_path / "run",
            api_base=server.url,
            **{**BASE, "task_options": {"items": 1, "history_tokens": 300}},
        )
        run(RunConfig(**settings), registry=registry)
        with sqlite3.connect(tmp_path / "run" / "cache.sqlite") as db:
            db.execute("UPDATE responses SET completion = '{\"text\": 42'")
        for path in (tmp_path / "run").iterdir():  # as if the process died after the call, before any row
            if not path.name.startswith("cache.sqlite"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        again = run(RunConfig(**settings), registry=registry)
    assert again.results == 1 and again.model_calls == 1 and len(server.requests) == 2
    warnings = [e for e in iter_events(tmp_path / "run") if e["event"] == "warning"]
    assert [w["kind"] for w in warnings] == ["cache_corrupt"] and "dropped, asked again" in warnings[0]["detail"]


def test_an_unreadable_cache_file_is_a_clear_error(tmp_path, registry):
    out = tmp_path / "run"
    out.mkdir()
    (out / "cache.sqlite").write_bytes(b"this is not a database" * 100)
    with (
        FaultServer() as server,
        pytest.raises(
            CacheError,
            match=r"cache.sqlite: the response cache cannot be "
            r"read .* move it away",
        ),
    ):
        run(
            RunConfig(strategies=["truncation"], budgets=[300], out=out, api_base=server.url, **BASE), registry=registry
        )


# ----------------------------------------------------------------- 8. one gate, one sandbox, typed events


def test_the_kit_uses_the_runners_gate_and_validation(tmp_path, registry):
    """A prompt the kit passes is one the runner admits: the kit runs the engine's own step."""
    assert kit_module.build_prompt is pipeline.build_prompt
    counter = PromptCounter(TiktokenTokenizer("cl100k_base"))
    kit = kit_module.ConformanceKit(counter, budgets=(256,))
    results = {r.check: r for r in kit.run_checks(ToChatLies)}
    assert results["valid-output"].status == "pass" and results["budget"].status == "pass"
    results = {r.check: r for r in kit.run_checks(CycleMetadata)}
    assert results["valid-output"].status == "pass"
    results = {r.check: r for r in kit.run_checks(RaisesSystemExit)}  # contained like the runner: not fatal
    assert results["valid-output"].status == "fail" and "SystemExit" in results["valid-output"].detail


def test_events_doc_is_generated_from_the_dataclasses_and_rows_follow_them(tmp_path, registry):
    assert (ROOT / "docs" / "events.md").read_text(encoding="utf-8") == event_records.render_markdown()
    with FaultServer() as server:
        run(
            RunConfig(
                strategies=["truncation", "summary_buffer", "trust-system-exit"],
                budgets=[200, 600],
                out=tmp_path / "run",
                api_base=server.url,
                **BASE,
            ),
            registry=registry,
        )
    by_kind = {
        cls.EVENT: {f.name for f in event_records.fields(cls)} | {"event", "time"} for cls in event_records.ALL_EVENTS
    }
    seen = Counter()
    for event in iter_events(tmp_path / "run"):
        assert set(event) == by_kind[event["event"]], event["event"]
        seen[event["event"]] += 1
    assert {"prompt_audit", "result", "error", "aux_call"} <= set(seen)


# ----------------------------------------------------------------- all at once


def test_every_hostile_behaviour_at_once(tmp_path, registry, monkeypatch):
    """One hostile strategy beside truncation, 20% server faults, a planted key: truncation's rows
    are complete and identical to a clean run; every hostile cell is an error or violation naming
    the plugin; the key is nowhere under the run directory."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    settings = dict(
        BASE,
        task_options={"items": 14, "history_tokens": 400},
        retries=6,
        timeout_s=2.0,
        max_concurrency=4,
        item_timeout_s=5.0,
    )
    compared = ("event", "prediction", "quality", "prompt_tokens", "served_prompt_tokens")
    with FaultServer(count_prompt=_tiktoken_count()) as server:
        run(
            RunConfig(
                strategies=["truncation"], budgets=[200, 600], out=tmp_path / "clean", api_base=server.url, **settings
            ),
            registry=registry,
        )
    faults = ("500", "429", "close", "truncated", "trickle")  # transport faults: retried, so rows match
    with FaultServer(
        rate=0.2,
        faults=faults,
        seed=5,
        retry_after_s=0.1,
        trickle_s=0.03,
        echo_auth_in_errors=True,
        count_prompt=_tiktoken_count(),
    ) as server:
        summary = run(
            RunConfig(
                strategies=["truncation", "trust-hostile"],
                budgets=[200, 600],
                out=tmp_path / "run",
                api_base=server.url,
                **settings,
            ),
            registry=registry,
        )
    rows = final_rows(tmp_path / "run")
    assert summary.cells_total == len(rows) == 14 * 2 * 2
    clean = final_rows(tmp_path / "clean")
    truncation = {k: r for k, r in rows.items() if k[1] == "truncation"}
    assert truncation.keys() == clean.keys()
    for key, row in clean.items():
        got = truncation[key]
        assert {f: got.get(f) for f in compared} == {f: row.get(f) for f in compared}, key
    hostile = [r for k, r in rows.items() if k[1] == "trust-hostile"]
    assert len(hostile) == 28
    for row in hostile:
        assert row["event"] in ("error", "violation") and row.get("plugin") == "trust-hostile", row
    assert {r["phase"] for r in hostile} >= {"strategy", "prompt", "auxiliary"}
    assert sum(1 for r in server.requests if r.fault) > 0
    _no_event_after_terminal(tmp_path / "run")
    for piece in (KEY, KEY[:12], KEY[-12:]):
        assert _files_with(tmp_path / "run", piece) == [], piece
