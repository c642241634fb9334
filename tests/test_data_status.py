"""`budgetbench data status` lists every registered dataset with where its files are or are
missing; `budgetbench data fetch tau-bench` says where tau2-bench lives and which upstream file
goes where; the tau-bench task reads the files exactly where they are said to go."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from budgetbench_core import Dataset
from budgetbench_core.plugins import get_registry
from budgetbench_core.testing import invoke_cli, registered, shared_data

DATASETS = get_registry().datasets()
TAU_COMMIT = "a2c024725189473d2d7cea3a5cfdbcc67478e41f"


@pytest.fixture
def data_root(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("BUDGETBENCH_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def place_tau_domain(root: Path, domain: str) -> list[Path]:
    """Copy one domain of the shared tau2-bench files to where the tau-bench dataset says."""
    source = DATASETS["tau-bench"]
    placed = []
    for remote, local in source.files.items():
        if remote.startswith(f"data/tau2/domains/{domain}/"):
            target = root / source.folder / local
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shared_data(f"taubench/{local}"), target)
            placed.append(target)
    return placed


def test_status_lists_every_registered_dataset_with_each_file_missing(data_root):
    result = invoke_cli("data", "status")
    assert result.exit_code == 0, result.output
    assert f"data folder: {data_root}" in result.output
    assert {"tau-bench", "locomo", "longmemeval"} <= set(DATASETS)
    for name, source in DATASETS.items():
        assert (
            f"{name} ({registered('dataset', name).plugin.distribution}): 0/{len(source.files)} files" in result.output
        )
        for local in source.files.values():
            assert re.search(rf"MISSING +{re.escape(str(data_root / source.folder / local))}\n", result.output)
        assert f"budgetbench data fetch {name}" in result.output
    assert "present" not in result.output.replace("none present", "")


def test_status_tells_present_from_missing_and_counts_bytes(data_root):
    placed = place_tau_domain(data_root, "mock")
    assert len(placed) == 4
    locomo = DATASETS["locomo"]
    (data_root / locomo.folder).mkdir(parents=True)
    shutil.copyfile(shared_data("locomo/locomo10.json"), data_root / locomo.folder / "locomo10.json")
    result = invoke_cli("data", "status", "--json")
    assert result.exit_code == 0, result.output
    report = {row["dataset"]: row for row in json.loads(result.output)["datasets"]}
    assert set(report) == set(DATASETS)
    tau = report["tau-bench"]
    assert tau["present"] == 4 and len(tau["files"]) == len(DATASETS["tau-bench"].files)
    by_path = {Path(f["path"]): f for f in tau["files"]}
    for path in placed:
        assert by_path[path]["present"] and by_path[path]["bytes"] == path.stat().st_size
    assert not by_path[data_root / "taubench" / "retail" / "db.json"]["present"]
    assert report["locomo"]["present"] == 1 and report["locomo"]["files"][0]["bytes"] == 2_805_274
    text = invoke_cli("data", "status").output
    assert "locomo (budgetbench-task-locomo): 1/1 files, complete" in text
    assert f"tau-bench (budgetbench-task-taubench): 4/{len(tau['files'])} files, partial" in text
    assert re.search(rf"present +281 B +{re.escape(str(data_root / 'taubench' / 'mock' / 'db.json'))}\n", text)


def test_status_of_another_folder(tmp_path, data_root):
    other = tmp_path / "elsewhere"
    place_tau_domain(other, "mock")
    result = invoke_cli("data", "status", "--dir", str(other), "--json")
    report = {row["dataset"]: row for row in json.loads(result.output)["datasets"]}
    assert report["tau-bench"]["folder"] == str(other / "taubench") and report["tau-bench"]["present"] == 4


def test_fetch_tau_bench_names_the_upstream_repository_and_each_files_place(data_root):
    result = invoke_cli("data", "fetch", "tau-bench")
    assert result.exit_code == 1, result.output
    out = result.output
    assert "https://github.com/sierra-research/tau2-bench" in out and TAU_COMMIT in out and "MIT" in out
    source = DATASETS["tau-bench"]
    assert f"Place these {len(source.files)} files here:" in out
    for domain in ("retail", "airline", "mock", "telecom"):
        assert (
            f"  {data_root / 'taubench' / domain / 'tasks.json'}\n      <- data/tau2/domains/{domain}/tasks.json" in out
        )
    assert (
        f"{data_root / 'taubench' / 'telecom' / 'user_db.toml'}\n      <- data/tau2/domains/telecom/user_db.toml" in out
    )
    assert (
        f"{data_root / 'taubench' / 'simulation_guidelines.md'}\n"
        "      <- data/tau2/user_simulator/simulation_guidelines.md" in out
    )
    assert not (data_root / "taubench").exists(), "nothing is downloaded or created"


def test_fetch_tau_bench_lists_only_what_is_missing_and_the_task_reads_what_is_placed(data_root):
    placed = place_tau_domain(data_root, "mock")
    result = invoke_cli("data", "fetch", "tau-bench")
    assert result.exit_code == 1
    for path in placed:
        assert f"present: {path}" in result.output and f"  {path}\n" not in result.output
    assert f"Place these {len(DATASETS['tau-bench'].files) - 4} files here:" in result.output
    # where the dataset says a file goes is where the task reads it (no path option)
    items = list(registered("task", "tau-bench").obj(domain="mock").load(None, 0))
    assert len(items) >= 1 and all(item.category == "mock" for item in items)
    with pytest.raises(Exception, match="data fetch tau-bench"):
        list(registered("task", "tau-bench").obj(domain="retail").load(None, 0))


def test_fetch_tau_bench_with_every_file_placed_succeeds(data_root):
    for domain in ("retail", "airline", "mock", "telecom"):
        place_tau_domain(data_root, domain)
    guidelines = data_root / "taubench" / "simulation_guidelines.md"
    shutil.copyfile(shared_data("taubench/simulation_guidelines.md"), guidelines)
    result = invoke_cli("data", "fetch", "tau-bench")
    assert result.exit_code == 0, result.output
    assert result.output.count("present: ") == len(DATASETS["tau-bench"].files)
    assert "complete" in invoke_cli("data", "status").output.split("tau-bench", 1)[1].splitlines()[0]


def test_a_dataset_may_keep_files_in_subfolders_but_never_outside_its_folder():
    assert Dataset("x", "a/b", "x", {"d/f.json": "retail/f.json"}).files == {"d/f.json": "retail/f.json"}
    for bad in ("../escape.json", "/abs/f.json", "a/../../f.json", "a\\f.json"):
        with pytest.raises(ValueError, match="leave the dataset's folder"):
            Dataset("x", "a/b", "x", {"f.json": bad})
