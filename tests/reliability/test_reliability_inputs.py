"""Bad inputs: broken dataset files, wrong field types, empty histories, budgets below the
system prompt plus question, unknown names, undecodable bytes.

Every installed task that reads a dataset file (``--task-option path=...``) is fed the
same broken files; each must fail with a ``TaskDataError`` that names the file, never an
unrelated exception or a silently shortened item list. The truncated and wrong-typed
files are made from the real data in ``../shared/data`` where it is present.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core import Item, Message, RunConfig, Task, TaskDataError, hookimpl, run  # noqa: E402
from budgetbench_core.cli import cli  # noqa: E402
from budgetbench_core.plugins import PluginInfo, get_registry, load_registry  # noqa: E402
from budgetbench_core.runlog import final_rows  # noqa: E402
from budgetbench_core.testing import FaultServer  # noqa: E402

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
REAL_FILES = {  # task -> the official file it reads, when present
    "longmemeval": DATA / "longmemeval" / "longmemeval_oracle.json",
    "longbench-v2": DATA / "longbench_v2" / "longbench_v2_short_sample.json",
    "swebench-verified": DATA / "swebench" / "swebench_verified_mini.jsonl",
}
LOCAL_STRATEGIES = ["truncation", "recency", "checkpoint", "full_context"]
RUN = dict(model="openai/fault-model", tokenizer="tiktoken:cl100k_base", retries=0, timeout_s=10.0, max_concurrency=2)


def file_tasks() -> list[str]:
    """Installed tasks that read a file given as ``path`` (a missing path is a TaskDataError)."""
    registry = get_registry()
    names = []
    for name in registry.names("task"):
        try:
            task = registry.get("task", name).obj(path="/nonexistent/budgetbench-reliability.json")
            list(task.load(limit=1, seed=0))
        except TaskDataError:
            names.append(name)
        except Exception:
            names.append(name)  # it reads the path, just not cleanly: the tests below will say so
    return names


def _wrong_types(value):
    """The same record with every field of the wrong JSON type."""
    if isinstance(value, dict):
        return {key: _wrong_types_leaf(v) for key, v in value.items()}
    return _wrong_types_leaf(value)


def _wrong_types_leaf(value):
    if isinstance(value, str):
        return {"not": "a string"}
    if isinstance(value, list):
        return "not a list"
    if isinstance(value, dict):
        return ["not", "an", "object"]
    return {"not": "a number"}


def broken_files(task: str, folder: Path) -> dict[str, Path]:
    """Name -> file, each broken in one way."""
    files = {
        "empty": b"",
        "truncated-json": b'[{"question_id": "q1", "question": "Where did I',
        "truncated-jsonl": b'{"instance_id": "a__b-1", "problem_statement": "x"}\n{"instance_id": "a__b-2", "prob',
        "not-utf8": b"\xff\xfe\x00[\x00{\x00",
        "latin1-inside-json": '[{"question_id": "q1", "question": "caf\u00e9?"}]'.encode("latin-1"),
        "not-records": b'{"data": "a dict where records were expected"}',
        "list-of-numbers": b"[1, 2, 3]",
        "nulls": b"[null, null]",
    }
    real = REAL_FILES.get(task)
    if real is not None and real.is_file():
        raw = real.read_bytes()
        files["real-truncated"] = raw[: len(raw) * 2 // 5]
        if real.suffix == ".jsonl":
            first = json.loads(raw.split(b"\n", 1)[0])
            files["real-wrong-types"] = (json.dumps(_wrong_types(first)) + "\n").encode()
        else:
            first = json.loads(raw)[0]
            files["real-wrong-types"] = json.dumps([_wrong_types(first)]).encode()
    paths = {}
    for name, data in files.items():
        path = folder / f"{task}-{name}{real.suffix if real else '.json'}"
        path.write_bytes(data)
        paths[name] = path
    return paths


def test_broken_dataset_files_give_task_data_errors_naming_the_file(tmp_path):
    registry = get_registry()
    tasks = file_tasks()
    if not tasks:
        pytest.skip("no installed task reads a dataset file")
    problems = []
    for task in tasks:
        for name, path in broken_files(task, tmp_path).items():
            try:
                items = list(registry.get("task", task).obj(path=str(path)).load(limit=None, seed=0))
            except TaskDataError as exc:
                if path.name not in str(exc):
                    problems.append(f"{task} {name}: TaskDataError does not name the file: {exc}")
                continue
            except Exception as exc:
                problems.append(f"{task} {name}: {type(exc).__name__} instead of TaskDataError: {str(exc)[:200]}")
                continue
            if items:
                problems.append(f"{task} {name}: accepted, {len(items)} items")
                continue
            try:  # no items at all: the runner refuses to start
                run(
                    RunConfig(
                        task=task,
                        strategies=["truncation"],
                        budgets=[500],
                        out=tmp_path / f"{task}-{name}",
                        task_options={"path": str(path)},
                        api_base="http://127.0.0.1:9/v1",
                        **RUN,
                    )
                )
                problems.append(f"{task} {name}: a run with no items started")
            except TaskDataError as exc:
                if path.name not in str(exc):
                    problems.append(f"{task} {name}: TaskDataError does not name the file: {exc}")
    assert problems == []


class EmptyHistories(Task):
    """Items with nothing to remember, a blank query, no system prompt."""

    name, default_grader = "reliability-empty-histories", "exact-match"

    def load(self, limit, seed):
        yield Item("no-history", (), Message("user", "What is my name?"), "unknown", Message("system", "Be brief."))
        yield Item("no-system", (), Message("user", "Anything?"), "unknown")
        yield Item("blank-query", (Message("user", ""),), Message("user", ""), "unknown", Message("system", "s"))


class SmuggledBytes(Task):
    """A loader that decoded with surrogateescape instead of failing on bad bytes."""

    name, default_grader = "reliability-smuggled-bytes", "exact-match"

    def load(self, limit, seed):
        text = b"caf\xe9 ol\xe9".decode("utf-8", "surrogateescape")
        yield Item("bad-bytes", (Message("user", text),), Message("user", "Where?"), "x")


@hookimpl
def register_tasks(register):
    register(EmptyHistories)
    register(SmuggledBytes)


def registry_with_test_tasks():
    registry = load_registry()
    module = types.ModuleType("reliability_input_tasks")
    module.register_tasks = register_tasks
    registry.add_plugin(module, PluginInfo("reliability-inputs", "budgetbench-reliability-inputs", "0"))
    return registry


def test_empty_histories_and_blank_queries_run(tmp_path):
    with FaultServer() as server:
        summary = run(
            RunConfig(
                task="reliability-empty-histories",
                strategies=LOCAL_STRATEGIES,
                budgets=[64, 500],
                out=tmp_path / "run",
                api_base=server.url,
                **RUN,
            ),
            registry=registry_with_test_tasks(),
        )
    rows = final_rows(tmp_path / "run")
    assert len(rows) == summary.cells_total == 3 * len(LOCAL_STRATEGIES) * 2
    assert {r["event"] for r in rows.values()} == {"result"}, [r.get("cause") for r in rows.values()]


def test_budget_below_system_prompt_and_question_is_a_violation(tmp_path):
    # Nothing is served: an address where no server listens proves no call is attempted.
    summary = run(
        RunConfig(
            task="synthetic-memory",
            strategies=LOCAL_STRATEGIES,
            budgets=[1, 20],
            out=tmp_path / "run",
            api_base="http://127.0.0.1:9/v1",
            task_options={"items": 5, "history_tokens": 300},
            **RUN,
        )
    )
    rows = final_rows(tmp_path / "run")
    assert summary.violations == len(rows) == 5 * len(LOCAL_STRATEGIES) * 2 and summary.model_calls == 0
    for row in rows.values():
        assert row["event"] == "violation" and row["phase"] == "prompt" and row["quality"] == 0
        assert row["prompt_tokens"] > row["budget"]


def test_undecodable_bytes_are_refused_naming_item_and_field(tmp_path):
    with pytest.raises(TaskDataError, match=r"item 'bad-bytes': history\[0\]\.content is not valid UTF-8"):
        run(
            RunConfig(
                task="reliability-smuggled-bytes",
                strategies=["truncation"],
                budgets=[500],
                out=tmp_path / "run",
                api_base="http://127.0.0.1:9/v1",
                **RUN,
            ),
            registry=registry_with_test_tasks(),
        )


@pytest.mark.parametrize("flag, name, kind", [("-s", "no-such-strategy", "strategy"), ("-t", "no-such-task", "task")])
def test_unknown_names_list_the_available_ones(tmp_path, flag, name, kind):
    arguments = {"-s": "truncation", "-t": "synthetic-memory", flag: name}
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "-t",
            arguments["-t"],
            "-s",
            arguments["-s"],
            "-o",
            str(tmp_path / "run"),
            "-m",
            "openai/x",
            "--api-base",
            "http://127.0.0.1:9/v1",
            "--tokenizer",
            "tiktoken:cl100k_base",
        ],
    )
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert f"unknown {kind} {name!r}; available:" in output
    assert ("truncation" if kind == "strategy" else "synthetic-memory") in output
    assert not (tmp_path / "run").exists()
