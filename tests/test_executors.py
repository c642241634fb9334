"""Executors (``register_executors``) and streamed items, against the deterministic loopback server."""

from __future__ import annotations

import copyreg
import pickle
import types

import pytest

from budgetbench_core import Executor, Item, Message, RunConfig, Task, hookimpl, read_manifest, run
from budgetbench_core.engine.scheduling import window_size
from budgetbench_core.plugins import PluginError, PluginInfo, load_registry
from budgetbench_core.runner import RunConfigError
from budgetbench_core.testing import FaultServer, comparable_rows

SETTINGS = dict(
    task="synthetic-memory",
    strategies=["truncation", "recency"],
    budgets=[60, 400],
    task_options={"items": 6, "history_tokens": 500},
    seed=2,
    max_concurrency=2,
    retries=0,
    timeout_s=10.0,
    tokenizer="tiktoken:cl100k_base",
    model="openai/fault-model",
)


# Message metadata is a read-only mapping; Ray's serializer copes, the stdlib's needs telling.
def read_only(mapping: dict) -> types.MappingProxyType:
    return types.MappingProxyType(mapping)


copyreg.pickle(types.MappingProxyType, lambda proxy: (read_only, (dict(proxy),)))


def with_plugin(name: str, **hooks):
    registry = load_registry()
    registry.add_plugin(
        types.SimpleNamespace(**{k: hookimpl(v) for k, v in hooks.items()}), PluginInfo(name, f"dist-{name}", "0.0.1")
    )
    return registry


class Remote(Executor):
    """Every unit through the remote-worker path, in this process: the spec and each unit are
    pickled as a real remote executor would send them; only ``record`` writes."""

    name = "pickled"
    seen: list[tuple[str, str, int]] = []

    def execute(self, job):
        worker = pickle.loads(pickle.dumps(job.worker_spec())).build()
        for unit in job.units:
            outcome = worker.run(pickle.loads(pickle.dumps(unit)))
            self.seen.append((unit.strategy, unit.item.id, len(unit.todo)))
            job.record(unit, pickle.loads(pickle.dumps(outcome)))


@pytest.fixture(scope="module")
def server():
    with FaultServer() as server:
        yield server


@pytest.fixture(scope="module")
def threads(tmp_path_factory, server):
    out = tmp_path_factory.mktemp("threads") / "run"
    run(RunConfig(out=out, api_base=server.url, **SETTINGS))
    return comparable_rows(out)


def test_hook_register_executors(tmp_path, server, threads):
    registry = with_plugin("pickled", register_executors=lambda register: register(Remote))
    assert registry.get("executor", "pickled").plugin.distribution == "dist-pickled"
    assert registry.get("executor", "thread").plugin.distribution == "budgetbench"
    summary = run(
        RunConfig(out=tmp_path / "remote", api_base=server.url, executor="pickled", **SETTINGS), registry=registry
    )
    assert comparable_rows(tmp_path / "remote") == threads
    assert sorted(Remote.seen) == sorted(
        (s, f"synth-{i:05d}-{c}", 2)
        for s in SETTINGS["strategies"]
        for i, c in enumerate(
            ["single-session", "knowledge-update", "temporal", "preference", "abstention", "single-session"]
        )
    )
    assert summary.model_calls == read_manifest(tmp_path / "remote")["calls_made"] > 0
    assert read_manifest(tmp_path / "remote")["config"]["executor"] == "pickled"


def test_unknown_executor_and_unknown_option_are_refused(tmp_path, server):
    with pytest.raises(PluginError, match="unknown executor 'nope'; available: .*thread"):
        run(RunConfig(out=tmp_path / "a", api_base=server.url, executor="nope", **SETTINGS))
    with pytest.raises(RunConfigError, match="executor 'thread' has no option bogus"):
        run(RunConfig(out=tmp_path / "b", api_base=server.url, executor_options={"bogus": 1}, **SETTINGS))


class Counted(Task):
    """Items made on demand; counts what was built and how far loading ran ahead of finished cells."""

    name = "counted"
    default_grader = "exact-match"
    max_output_tokens = 8

    def __init__(self, items: int = 200, **options):
        super().__init__(items=items, **options)
        self.count = int(items)
        self.built: list[str] = []
        self.finished = 0
        self.ahead = 0

    def _item(self, index: int) -> Item:
        self.built.append(f"c{index}")
        self.ahead = max(self.ahead, len(self.built) - self.finished)
        return Item(
            id=f"c{index}",
            history=(Message("user", f"The word is Tulip{index}. " * 20),),
            query=Message("user", "Which word?"),
            answer=f"Tulip{index}",
            system=Message("system", "Be brief."),
        )

    def load(self, limit, seed):
        for index in range(self.count):
            yield self._item(index)

    def load_wanted(self, limit, seed, wanted):
        for index in range(self.count):
            if wanted(f"c{index}"):
                yield self._item(index)


def test_items_are_streamed_and_a_resume_builds_none_it_skips(tmp_path, server):
    task = Counted()
    registry = with_plugin("counted", register_tasks=lambda register: register(Counted))
    registry.get("task", "counted").obj = lambda **options: task
    config = RunConfig(
        task="counted",
        strategies=["truncation"],
        budgets=[300],
        out=tmp_path / "run",
        api_base=server.url,
        model="openai/fault-model",
        tokenizer="tiktoken:cl100k_base",
        max_concurrency=2,
        retries=0,
    )

    def progress(strategy, cells):
        task.finished += cells

    summary = run(config, registry=registry, progress=progress)
    assert summary.results == 200 and len(task.built) == 200
    bound = window_size(2) + 2 + 1  # the window, the units in flight, the one being read
    assert task.ahead <= bound, f"loading ran {task.ahead} items ahead of the finished cells (bound {bound})"
    # Resume: every cell is done, so no item beyond the first (read before the run identity is known) is built.
    task.built.clear()
    again = run(config, registry=registry)
    assert again.cells_skipped == 200 and again.model_calls == 0
    assert len(task.built) <= 1


def test_synthetic_memory_reads_ids_before_building_items():
    from budgetbench_core.builtin.synthetic_memory import SyntheticMemory

    task = SyntheticMemory(items=7, history_tokens=400)
    asked: list[str] = []
    picked = list(task.load_wanted(None, 3, lambda item_id: asked.append(item_id) or item_id.endswith("temporal")))
    assert asked == [item.id for item in task.load(None, 3)]
    assert [item.id for item in picked] == [i for i in asked if i.endswith("temporal")]
    assert picked[0] == next(i for i in task.load(None, 3) if i.id == picked[0].id)
