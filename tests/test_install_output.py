"""``install.sh`` prints no setuptools notice box (issue 30: nine "Editable installation" boxes).

The filter is the ``PYTHONWARNINGS`` value on install.sh's editable-install line, read from the
script itself; pip installs one real distribution editable with it, as install.sh does, into a
prefix of the test's own (``--ignore-installed``: the venv's copy is not touched). The same install without the filter shows
the box, so the check can fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOX = "Editable installation"


def _install_filter() -> str:
    script = (ROOT / "install.sh").read_text(encoding="utf-8")
    found = re.search(r'PYTHONWARNINGS="\$\{PYTHONWARNINGS:\+\$PYTHONWARNINGS,\}([^"]+)"', script)
    assert found, "install.sh sets no PYTHONWARNINGS filter on its editable install"
    return found.group(1)


def _editable_install(tmp_path: Path, warnings: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    if warnings:
        env["PYTHONWARNINGS"] = warnings
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
        # --ignore-installed: without it pip first uninstalls the venv's own copy of the distribution
        + ["--ignore-installed", "--prefix", str(tmp_path), "-e", str(ROOT / "plugins" / "budgetbench-task-longbench")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.glob("lib/python*/site-packages/__editable__.budgetbench_task_longbench-*.pth"))
    return done.stdout + done.stderr


def test_install_sh_editable_install_prints_no_setuptools_notice_box(tmp_path):
    shown = _editable_install(tmp_path / "plain", "")
    assert BOX in shown and "*****" in shown, "setuptools no longer prints the box: this test checks nothing"
    quiet = _editable_install(tmp_path / "filtered", _install_filter())
    assert BOX not in quiet and "*****" not in quiet and "!!" not in quiet, quiet
    still = metadata.distribution("budgetbench-task-longbench")  # the venv's own install is untouched
    assert str(still.locate_file("")).startswith(sys.prefix), still.locate_file("")
