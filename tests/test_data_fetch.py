"""`budgetbench data fetch`: offline it says exactly which file goes where, and the tasks read it there; a
dataset pinned to a GitHub commit is downloaded at that commit and refused when its SHA-256 differs."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from budgetbench_core import Dataset
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


@pytest.mark.parametrize("dataset", sorted(name for name, d in DATASETS.items() if not d.manual and not d.commit))
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


PINNED = sorted(name for name, d in DATASETS.items() if d.commit)


def mirror_of(tmp_path: Path, source, content: dict[str, bytes]) -> str:
    """A folder laid out as the upstream repository (what a clone at the pinned commit holds), as a file:// URL."""
    root = tmp_path / "mirror"
    for remote, data in content.items():
        (root / remote).parent.mkdir(parents=True, exist_ok=True)
        (root / remote).write_bytes(data)
    return root.as_uri()


def test_locomo_is_pinned_to_the_official_release():
    """The pin and the digest are those of data/locomo10.json at snap-research/LoCoMo 3eb6f2c (git blob d95b872)."""
    locomo = DATASETS["locomo"]
    assert locomo.repo == "snap-research/LoCoMo" and locomo.commit.startswith("3eb6f2c")
    assert locomo.url("data/locomo10.json") == (
        f"https://raw.githubusercontent.com/snap-research/LoCoMo/{locomo.commit}/data/locomo10.json"
    )
    assert "CC BY-NC 4.0" in locomo.licence
    shared = SHARED / "locomo" / "locomo10.json"
    if shared.is_file():
        assert hashlib.sha256(shared.read_bytes()).hexdigest() == locomo.sha256["data/locomo10.json"]


@pytest.mark.parametrize("dataset", PINNED)
def test_pinned_offline_says_which_file_goes_where_with_its_digest(offline, dataset):
    source = DATASETS[dataset]
    result = fetch(dataset)
    assert result.exit_code == 1, result.output
    out = result.output
    assert f"https://github.com/{source.repo} at commit {source.commit}" in out
    assert f"licence: {source.licence}" in out and "nothing downloaded" in out
    for remote, local in source.files.items():
        assert f"  {offline / source.folder / local}\n      <- {remote}  sha256 {source.sha256[remote]}" in out
    assert f"raw.githubusercontent.com/{source.repo}/{source.commit}/" in out and "--task-option path=" in out
    assert not (offline / source.folder).exists(), "offline fetch must not create anything"


def test_a_wrong_file_is_refused_and_nothing_is_kept(offline, tmp_path):
    source = DATASETS["locomo"]
    mirror = mirror_of(tmp_path, source, {"data/locomo10.json": b"[]"})
    result = fetch("locomo", "--from", mirror)
    assert result.exit_code == 1, result.output
    assert f"licence: {source.licence}" in result.output
    assert (
        f"its sha256 {hashlib.sha256(b'[]').hexdigest()} is not the pinned {source.sha256['data/locomo10.json']}"
        in (result.output)
    )
    assert not (offline / "locomo" / "locomo10.json").exists()
    assert not (offline / "locomo" / "locomo10.json.part").exists()
    assert not (offline / "locomo" / "SHA256SUMS").exists()


def test_an_unreachable_source_says_where_to_put_the_file(offline, tmp_path):
    """A server that is not there (a closed loopback port) is a clear failure, then the placement help."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = fetch("locomo", "--from", f"http://127.0.0.1:{port}")
    assert result.exit_code == 1, result.output
    assert f"could not download http://127.0.0.1:{port}/data/locomo10.json" in result.output
    assert f"  {offline / 'locomo' / 'locomo10.json'}\n      <- data/locomo10.json" in result.output


def test_the_official_file_from_a_local_copy_is_checked_kept_and_read(offline, tmp_path):
    shared = SHARED / "locomo" / "locomo10.json"
    if not shared.is_file():
        pytest.skip(f"shared data absent: {shared}")
    source = DATASETS["locomo"]
    mirror = mirror_of(tmp_path, source, {"data/locomo10.json": shared.read_bytes()})
    result = fetch("locomo", "--from", mirror)
    assert result.exit_code == 0, result.output
    target = offline / "locomo" / "locomo10.json"
    digest = source.sha256["data/locomo10.json"]
    assert f"fetched: {target} sha256={digest} (checked)" in result.output
    assert target.read_bytes() == shared.read_bytes()
    sums = (offline / "locomo" / "SHA256SUMS").read_text()
    assert sums == f"{digest}  locomo10.json  # snap-research/LoCoMo@{source.commit}/data/locomo10.json\n"
    again = fetch("locomo")
    assert again.exit_code == 0 and f"present: {target} (sha256 matches snap-research/LoCoMo@3eb6f2c)" in again.output
    target.write_bytes(b"[]")
    changed = fetch("locomo")
    assert changed.exit_code == 0 and "sha256 differs from snap-research/LoCoMo@3eb6f2c" in changed.output


def test_from_is_refused_for_a_hub_dataset(offline, tmp_path):
    result = fetch("longmemeval", "--from", tmp_path.as_uri())
    assert result.exit_code == 2 and "not pinned to a GitHub commit" in result.output


def test_a_pinned_dataset_needs_a_full_commit_and_every_digest():
    digest = "0" * 64
    assert Dataset("x", "o/r", "x", {"f.json": "f.json"}, commit="a" * 40, sha256={"f.json": digest}).commit
    with pytest.raises(ValueError, match="40-hex-digit"):
        Dataset("x", "o/r", "x", {"f.json": "f.json"}, commit="main", sha256={"f.json": digest})
    with pytest.raises(ValueError, match=r"digest of every file \(missing: g.json\)"):
        Dataset("x", "o/r", "x", {"f.json": "f.json", "g.json": "g.json"}, commit="a" * 40, sha256={"f.json": digest})
    with pytest.raises(ValueError, match="sha256 needs commit"):
        Dataset("x", "o/r", "x", {"f.json": "f.json"}, sha256={"f.json": digest})
