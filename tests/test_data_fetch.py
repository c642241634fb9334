"""`budgetbench data fetch`: offline it says exactly which file goes where, and the tasks read it there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from budgetbench_core.cli import cli
from budgetbench_core.plugins import get_registry

DATASETS = get_registry().datasets()  # registered by the task plugins (register_datasets), not named by the core

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("BUDGETBENCH_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def fetch(*args: str):
    return CliRunner().invoke(cli, ["data", "fetch", *args])


@pytest.mark.parametrize("dataset", sorted(name for name, d in DATASETS.items() if not d.manual))
def test_offline_names_every_file_and_where_it_goes(offline, dataset):
    result = fetch(dataset)
    assert result.exit_code == 1
    source = DATASETS[dataset]
    for remote, local in source.files.items():
        assert str(offline / source.folder / local) in result.output
        assert f"https://huggingface.co/datasets/{source.repo}/resolve/main/{remote}" in result.output
    assert "HF_HUB_OFFLINE" in result.output and "--task-option path=" in result.output
    assert not (offline / source.folder).exists(), "offline fetch must not create anything"


@pytest.mark.parametrize("dataset", sorted(name for name, d in DATASETS.items() if d.manual))
def test_a_manual_dataset_says_where_to_get_it_and_downloads_nothing(monkeypatch, tmp_path, dataset):
    """Online too: a dataset whose files are placed by hand (LoCoMo: CC BY-NC) is never downloaded."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("BUDGETBENCH_DATA_DIR", str(tmp_path / "data"))
    source = DATASETS[dataset]
    result = fetch(dataset)
    assert result.exit_code == 1 and source.manual in result.output
    for local in source.files.values():
        assert str(tmp_path / "data" / source.folder / local) in result.output
    assert "--task-option path=" in result.output and not (tmp_path / "data").exists()


def test_dir_option_and_how_to_point_tasks_at_it(offline, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    result = fetch("longbench-v2", "--dir", str(elsewhere))
    assert result.exit_code == 1
    assert str(elsewhere / "longbench_v2" / "data.json") in result.output
    assert f"BUDGETBENCH_DATA_DIR={elsewhere}" in result.output


def test_present_files_are_not_fetched_again(offline):
    folder = offline / "longmemeval"
    folder.mkdir(parents=True)
    (folder / "longmemeval_oracle.json").write_text("[]")
    result = fetch("longmemeval", "--file", "longmemeval_oracle.json")
    assert result.exit_code == 0, result.output
    assert f"present: {folder / 'longmemeval_oracle.json'}" in result.output
    partial = fetch("longmemeval")
    assert partial.exit_code == 1
    assert "present:" in partial.output and str(folder / "longmemeval_s.json") in partial.output


def test_unknown_file_is_refused(offline):
    result = fetch("longmemeval", "--file", "longmemeval_x.json")
    assert result.exit_code == 2 and "longmemeval_oracle.json" in result.output


@pytest.mark.parametrize(
    "dataset, task, shared_file, local",
    [
        ("longbench-v2", "longbench-v2", "longbench_v2/longbench_v2_short_sample.json", "data.json"),
        ("longmemeval", "longmemeval", "longmemeval/longmemeval_oracle.json", "longmemeval_s.json"),
        ("locomo", "locomo", "locomo/locomo10.json", "locomo10.json"),
    ],
)
def test_task_reads_the_file_where_fetch_says(offline, dataset, task, shared_file, local):
    """Place the official file where the offline message says, and the task loads it with no path option."""
    if not (SHARED / shared_file).is_file():
        pytest.skip(f"shared data absent: {SHARED / shared_file}")
    registry = get_registry()
    if task not in registry.entries["task"]:
        pytest.skip(f"task plugin {task!r} not installed")
    source = DATASETS[dataset]
    message = fetch(dataset).output
    target = offline / source.folder / local
    assert str(target) in message
    target.parent.mkdir(parents=True)
    shutil.copyfile(SHARED / shared_file, target)
    items = list(registry.get("task", task).obj().load(1, 0))
    assert len(items) == 1 and items[0].query.content
