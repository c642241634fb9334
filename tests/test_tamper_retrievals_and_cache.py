"""Saved retrievals and cached replies prove themselves too: an edited one is refused or not served.

Both feed the rows a run writes (every tier and a resume reuse a retrieval; a resume or a
repeated prompt is served from the cache), so each carries an HMAC under the run's key. The
memory system and the hostile strategy below run in the harness's process (``--isolation
none``) against the loopback server, counted with ``tiktoken:cl100k_base``; keys live in a
per-module key store, as in tests/test_tamper.py.
"""

from __future__ import annotations

import copyreg
import json
import pickle
import shutil
import sqlite3
import types
from contextlib import closing
from pathlib import Path

import pytest

from budgetbench_core import (
    Executor,
    IngestReport,
    Item,
    MemoryStrategy,
    MemorySystem,
    Message,
    Regime,
    RetrievedItem,
    RunConfig,
    Task,
    hookimpl,
    plugins as plugin_module,
    run,
)
from budgetbench_core.cache import ResponseCache
from budgetbench_core.integrity import KEY_DIR_ENV, IntegrityError, key_of, verify_run
from budgetbench_core.merge import merge_runs
from budgetbench_core.plugins import PluginInfo, load_registry
from budgetbench_core.retrievals import read_retrieval, retrieval_files
from budgetbench_core.runlog import final_rows, iter_events
from budgetbench_core.testing import FaultServer, invoke_cli

EDITED = json.dumps({"text": "EDITED", "prompt_tokens": 1, "completion_tokens": 1, "latency_s": 0.0})
CACHE_TO_EDIT: list[Path] = []  # the cache the hostile strategy edits, set by its test


class Notes(MemorySystem):
    """Remembers every message of the item's sessions; returns them all."""

    name = "tamper-notes"

    def reset(self):
        self.notes = []

    def ingest(self, sessions, context):
        self.notes = [message.content for session in sessions for message in session.messages]
        return IngestReport(len(sessions), len(sessions))

    def retrieve(self, query, context):
        return [RetrievedItem(note, 1.0) for note in self.notes]


class Twins(Task):
    """Two items with the same prompt: the second is served the first's cached reply."""

    name, default_grader = "tamper-twins", "exact-match"

    def load(self, limit, seed):
        for item_id in ("twin-a", "twin-b"):
            yield Item(item_id, (), Message("user", "Where do I live?"), "Oslo", Message("system", "Answer briefly."))


class EditsTheCache(MemoryStrategy):
    """Rewrites every cached reply (to another valid completion) before its prompt is asked."""

    name, regime = "tamper-edits-cache", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        with closing(sqlite3.connect(CACHE_TO_EDIT[0])) as db, db:
            db.execute("UPDATE responses SET completion = ?", (EDITED,))
        return context.frame([])


class Pickled(Executor):
    """Every unit through the remote-worker path in this process (as tests/test_executors.py):
    the spec, each unit and each outcome pickled as a remote executor sends them."""

    name = "tamper-pickled"

    def execute(self, job):
        worker = pickle.loads(pickle.dumps(job.worker_spec())).build()
        for unit in job.units:
            job.record(unit, pickle.loads(pickle.dumps(worker.run(pickle.loads(pickle.dumps(unit))))))


def read_only(mapping: dict) -> types.MappingProxyType:
    return types.MappingProxyType(mapping)


copyreg.pickle(types.MappingProxyType, lambda proxy: (read_only, (dict(proxy),)))


@hookimpl
def register_executors(register):
    register(Pickled)


@hookimpl
def register_strategies(register):
    register(Notes)
    register(EditsTheCache)


@hookimpl
def register_tasks(register):
    register(Twins)


@pytest.fixture(scope="module")
def registry():
    registry = load_registry()
    module = types.ModuleType("tamper_cache_plugins")
    module.register_strategies = register_strategies
    module.register_tasks = register_tasks
    module.register_executors = register_executors
    registry.add_plugin(module, PluginInfo("tamper", "budgetbench-tamper-test", "0.0.1"))
    return registry


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_DIR_ENV, str(tmp_path_factory.mktemp("keys")))
        yield


def settings(out: Path, url: str, **changes) -> RunConfig:
    base = dict(
        isolation="none",
        task="synthetic-memory",
        strategies=["tamper-notes"],
        budgets=[400],
        task_options={"items": 2, "history_tokens": 300},
        model="openai/fault-model",
        tokenizer="tiktoken:cl100k_base",
        max_concurrency=1,
        retries=0,
        timeout_s=30.0,
        out=out,
        api_base=url,
    )
    return RunConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory, keys, registry) -> Path:
    out = tmp_path_factory.mktemp("memory") / "run"
    with FaultServer() as server:
        run(settings(out, server.url), registry=registry)
    assert len(retrieval_files(out)) == 2 and verify_run(out).ok
    return out


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def inject(path: Path) -> None:
    """Put the gold answer into the saved memories, keeping the file's MAC."""
    saved = json.loads(path.read_text())
    saved["ranked"][0]["text"] = "The user lives in INJECTED."
    path.write_text(json.dumps(saved, indent=1))


def entries(path: Path) -> list[tuple[str, str, str]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT key, completion, mac FROM responses ORDER BY key").fetchall()


# ----------------------------------------------------------------- saved retrievals


def test_a_resume_refuses_an_edited_retrieval_before_asking(tmp_path, keys, registry):
    """Old code: the resumed cells were built from the edited memories."""
    out = tmp_path / "run"
    with FaultServer(rate=1.0, faults=("500",)) as server:  # every call fails: the cells are tried again later
        first = run(settings(out, server.url), registry=registry)
        assert first.results == 0 and retrieval_files(out)
        edited = retrieval_files(out)[0]
        inject(edited)
        asked = len(server.requests)
        server.rate = 0.0
        with pytest.raises(IntegrityError, match=f"refusing to resume.*{edited}"):
            run(settings(out, server.url), registry=registry)
    assert len(server.requests) == asked


def test_report_refuses_an_edited_retrieval(tmp_path, memory_run):
    target = copy_of(memory_run, tmp_path)
    edited = retrieval_files(target)[1]
    inject(edited)
    result = invoke_cli("report", str(target), "--format", "json")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "does not verify" in text and edited.name in text, result.output
    with pytest.raises(IntegrityError, match="does not verify under this run's key"):
        read_retrieval(target, edited, key_of(target))


def test_a_retrieval_without_its_mac_or_copied_from_another_run_is_refused(tmp_path, keys, registry, memory_run):
    other = tmp_path / "other"
    with FaultServer() as server:
        run(settings(other, server.url), registry=registry)  # the same experiment: other key, same files
    target = copy_of(memory_run, tmp_path)
    copied, bare = retrieval_files(target)
    shutil.copyfile(other / copied.relative_to(target), copied)
    saved = json.loads(bare.read_text())
    del saved["mac"]
    bare.write_text(json.dumps(saved))
    problems = verify_run(target).problems
    assert any(str(copied) in p and "does not verify" in p for p in problems), problems
    assert any(str(bare) in p and "without a MAC" in p for p in problems), problems
    with FaultServer() as server, pytest.raises(IntegrityError, match=str(copied)):
        run(settings(target, server.url), registry=registry)


def test_retrievals_a_remote_worker_hands_back_are_maced_by_the_driver(tmp_path, keys, registry, monkeypatch):
    """A remote worker has no run key: the driver MACs its retrievals as it writes them."""
    monkeypatch.setattr(plugin_module, "get_registry", lambda: registry)  # the worker's node has these plugins too
    out = tmp_path / "run"
    with FaultServer() as server:
        summary = run(settings(out, server.url, executor="tamper-pickled"), registry=registry)
        assert summary.results == 2 and verify_run(out).ok
        for path in retrieval_files(out):
            assert read_retrieval(out, path, key_of(out))["ranked"]
        asked = len(server.requests)
        inject(retrieval_files(out)[0])
        with pytest.raises(IntegrityError, match="refusing to resume"):
            run(settings(out, server.url, executor="tamper-pickled"), registry=registry)
    assert len(server.requests) == asked


# ----------------------------------------------------------------- cached replies


def test_a_cache_entry_edited_during_a_run_is_not_served(tmp_path, keys, registry):
    """Old code: the second twin was served the edited reply, and the server asked once."""
    out = tmp_path / "run"
    CACHE_TO_EDIT[:] = [out / "cache.sqlite"]
    with FaultServer() as server:
        summary = run(
            settings(out, server.url, task="tamper-twins", task_options={}, strategies=["tamper-edits-cache"]),
            registry=registry,
        )
    assert summary.results == 2 and len(server.requests) == 2
    assert all(row["prediction"] != "EDITED" for row in final_rows(out).values())
    warnings = [e for e in iter_events(out) if e["event"] == "warning"]
    assert [w["kind"] for w in warnings] == ["cache_corrupt"], warnings
    assert "not MAC'd by this run" in warnings[0]["detail"] and "dropped, asked again" in warnings[0]["detail"]
    assert verify_run(out).ok  # the edited entry was dropped, the new reply MAC'd


def test_an_edited_cache_entry_is_not_served_when_the_cells_are_asked_again(tmp_path, keys, registry):
    """Old code: the edited (valid) reply was served and the server not asked again."""
    out = tmp_path / "run"
    with FaultServer() as server:
        config = settings(out, server.url, strategies=["truncation"], task_options={"items": 1, "history_tokens": 300})
        run(config, registry=registry)
        with closing(sqlite3.connect(out / "cache.sqlite")) as db, db:
            db.execute("UPDATE responses SET completion = ?", (EDITED,))
        for path in out.iterdir():  # as if the process died after the call, before any row
            if not path.name.startswith("cache.sqlite"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        again = run(config, registry=registry)
    assert again.results == 1 and len(server.requests) == 2
    assert [row["prediction"] for row in final_rows(out).values()] != ["EDITED"]
    assert [e["kind"] for e in iter_events(out) if e["event"] == "warning"] == ["cache_corrupt"]


def test_a_cache_entry_moved_under_another_key_is_not_served(tmp_path, memory_run):
    target = copy_of(memory_run, tmp_path)
    (first, _, _), (second, completion, mac) = entries(target / "cache.sqlite")
    with closing(sqlite3.connect(target / "cache.sqlite")) as db, db:
        db.execute("UPDATE responses SET completion = ?, mac = ? WHERE key = ?", (completion, mac, first))
    cache = ResponseCache(target / "cache.sqlite", key_of(target))
    try:
        served, warning = cache.lookup(first)
        assert served is None and warning is not None and "dropped, asked again" in warning
        assert cache.lookup(second)[0] is not None  # its own entry is still served
    finally:
        cache.close()


def test_an_old_cache_without_macs_opens_and_its_entries_are_misses(tmp_path):
    path = tmp_path / "cache.sqlite"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, completion TEXT NOT NULL)")
        db.execute("INSERT INTO responses VALUES ('k', ?)", (EDITED,))
    cache = ResponseCache(path, b"k" * 32)
    try:
        served, warning = cache.lookup("k")
        assert served is None and warning is not None and "dropped, asked again" in warning
        assert cache.lookup("k") == (None, None)  # dropped: asked again, then stored with its MAC
    finally:
        cache.close()


# ----------------------------------------------------------------- merge


def test_merge_verifies_each_shard_and_macs_again_under_the_merged_key(tmp_path, keys, registry):
    shards = [tmp_path / f"shard{i}" for i in (1, 2)]
    with FaultServer() as server:
        for index, out in enumerate(shards, start=1):
            run(
                settings(out, server.url, shard=f"{index}/2", task_options={"items": 4, "history_tokens": 300}),
                registry=registry,
            )
    merged = tmp_path / "merged"
    summary = merge_runs(shards, merged)
    assert summary.cache_entries == 4 and verify_run(merged).ok
    key = key_of(merged)
    assert len(retrieval_files(merged)) == 4
    for path in retrieval_files(merged):
        read_retrieval(merged, path, key)
    cache = ResponseCache(merged / "cache.sqlite", key)
    try:
        assert all(cache.lookup(entry)[0] is not None for entry, _, _ in entries(merged / "cache.sqlite"))
    finally:
        cache.close()
    inject(retrieval_files(shards[0])[0])
    with pytest.raises(ValueError, match="refusing to merge.*does not verify"):
        merge_runs(shards, tmp_path / "merged-again")
