"""`budgetbench new-plugin`: the rendered plugin installs, is listed, passes its own tests and check-plugin."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from budgetbench_core.cli import cli

BIN = Path(sys.executable).parent


def render(kind: str, name: str, directory: Path) -> Path:
    result = CliRunner().invoke(cli, ["new-plugin", kind, name, "--dir", str(directory)])
    assert result.exit_code == 0, result.output
    return Path(result.output.split("created ", 1)[1].splitlines()[0])


@pytest.mark.parametrize("kind", ["strategy", "memory-system"])
def test_rendered_files_are_a_complete_distribution(tmp_path, kind):
    target = render(kind, "my-plugin", tmp_path)
    prefix = "strategy" if kind == "strategy" else "memory"
    assert target.name == f"budgetbench-{prefix}-my-plugin"
    project = tomllib.loads((target / "pyproject.toml").read_text())
    module = f"budgetbench_{prefix}_my_plugin"
    assert project["project"]["entry-points"]["budgetbench"] == {f"{prefix}-my-plugin": module}
    assert project["project"]["dependencies"] == ["budgetbench>=0.1,<0.2"]
    for source in target.rglob("*.py"):
        py_compile.compile(str(source), doraise=True)
    text = (target / module / "__init__.py").read_text()
    assert "class MyPlugin(" in text and 'name = "my-plugin"' in text
    assert ("MemorySystem" in text) == (kind == "memory-system")
    assert "budgetbench_kit.assert_conforms(MyPlugin)" in (target / "tests" / f"test_{module}.py").read_text()
    assert not list(target.rglob("*.j2"))


def test_bad_name_and_existing_folder_are_refused(tmp_path):
    bad = CliRunner().invoke(cli, ["new-plugin", "strategy", "My Plugin", "--dir", str(tmp_path)])
    assert bad.exit_code != 0 and "lower-case" in bad.output
    render("strategy", "twice", tmp_path)
    again = CliRunner().invoke(cli, ["new-plugin", "strategy", "twice", "--dir", str(tmp_path)])
    assert again.exit_code == 2 and "already exists" in again.output


def run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["strategy", "memory-system"])
def test_new_plugin_end_to_end(tmp_path, kind):
    """Render, pip install (editable, no deps), list-plugins --json, its own pytest, check-plugin; uninstall."""
    name = f"tplcheck-{os.getpid()}"
    target = render(kind, name, tmp_path)
    distribution = target.name
    installed = run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", str(target)],
        tmp_path,
    )
    assert installed.returncode == 0, installed.stderr
    try:
        listed = run([str(BIN / "budgetbench"), "list-plugins", "--json"], tmp_path)
        assert listed.returncode == 0, listed.stderr
        rows = [r for r in json.loads(listed.stdout) if r["name"] == name]
        assert len(rows) == 1, rows
        assert rows[0]["kind"] == "strategy" and rows[0]["distribution"] == distribution
        assert rows[0]["contract"] == kind

        tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(target / "tests")], target)
        assert tests.returncode == 0, tests.stdout + tests.stderr
        assert "2 passed" in tests.stdout

        checked = run([str(BIN / "budgetbench"), "check-plugin", name], tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "PASS" in checked.stdout and "FAIL" not in checked.stdout
        if kind == "memory-system":
            assert "ingest-failures" in checked.stdout
    finally:
        removed = run([sys.executable, "-m", "pip", "uninstall", "--quiet", "-y", distribution], tmp_path)
        assert removed.returncode == 0, removed.stderr
