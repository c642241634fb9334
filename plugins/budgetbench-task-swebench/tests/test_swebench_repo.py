"""Repository context from a real local clone: files at base_commit, mentioned first, then BM25."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from budgetbench_task_swebench.repo import mentioned
from budgetbench_task_swebench.task import SWEBenchVerified

from budgetbench_core import TaskDataError

FILES = {
    "calc/core.py": "def divide(a, b):\n    return a / b\n",
    "calc/units.py": "CONVERSIONS = {'km': 1000, 'mile': 1609.344}\n\n\ndef convert(value, unit):\n"
    "    return value * CONVERSIONS[unit]\n",
    "calc/parser.py": "import re\n\nTOKEN = re.compile(r'\\d+')\n\n\ndef tokens(text):\n    return TOKEN.findall(text)\n",
    "b/build/a.py": "BUILD_FLAGS = ['-O2']\n",
    "docs/guide.rst": "Using the calculator\n====================\n\nCall divide with two numbers.\n",
    "logo.png": "\x89PNG\x00\x01binary divide divide divide",
    "big.py": "# divide\n" + "x = 1\n" * 40,
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A real repository: the base commit, then a later commit that must not leak into the context."""
    cache = tmp_path_factory.mktemp("repos")
    repo = cache / "acme__calc"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "Test")
    for path, text in FILES.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(text.encode("latin-1"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "calc/core.py").write_text(
        "def divide(a, b):\n    if b == 0:\n        raise ZeroDivisionError\n    return a / b\n"
    )
    (repo / "calc/later.py").write_text("def divide_later():\n    pass\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "fix")
    return cache, repo, base


def _instances(tmp_path, base, **changes):
    row = {
        "repo": "acme/calc",
        "instance_id": "acme__calc-1",
        "base_commit": base,
        "patch": "diff --git a/calc/core.py b/calc/core.py\n--- a/calc/core.py\n+++ b/calc/core.py\n"
        "@@ -1,2 +1,4 @@\n def divide(a, b):\n+    if b == 0:\n+        raise ZeroDivisionError\n     return a / b\n",
        "problem_statement": "divide crashes when b is zero. The conversion in calc/units.py looks fine; "
        "see also calc.parser.tokens.",
        "hints_text": "Check how divide handles a zero divisor.",
        "FAIL_TO_PASS": '["test_divide_zero"]',
        "PASS_TO_PASS": "[]",
    }
    row.update(changes)
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return path


def test_files_at_base_commit_mentioned_first_then_lexical(tmp_path, clone):
    cache, repo, base = clone
    head = _git(repo, "rev-parse", "HEAD")
    task = SWEBenchVerified(path=str(_instances(tmp_path, base)), repo_cache=str(cache), max_files=4)
    (item,) = task.load(None, 0)
    files = item.metadata["context_files"]
    assert [f["path"] for f in files[:2]] == ["calc/units.py", "calc/parser.py"]
    assert {f["reason"] for f in files[:2]} == {"mentioned"}
    assert (
        files[2] == {"path": "calc/core.py", "reason": "lexical", "score": files[2]["score"]} and files[2]["score"] > 0
    )
    assert len(files) == 4 and "logo.png" not in [f["path"] for f in files]
    assert "calc/later.py" not in [f["path"] for f in files]  # added after base_commit
    core = next(m for m in item.history if m.metadata.get("path") == "calc/core.py")
    assert core.content.endswith(FILES["calc/core.py"]) and "ZeroDivisionError" not in core.content
    assert core.content.startswith(f"File calc/core.py, lines 1-2 of 2, at commit {base[:12]}:")
    # Oldest first: least relevant file ... most relevant file, hints, issue.
    kinds = [m.metadata["kind"] for m in item.history]
    assert kinds[-2:] == ["hints", "issue"] and set(kinds[:-2]) == {"file"}
    order = [m.metadata["path"] for m in item.history[:-2]]
    assert order[-1] == "calc/units.py" and order.index("calc/core.py") < order.index("calc/parser.py")
    # The clone is read, never touched.
    assert _git(repo, "rev-parse", "HEAD") == head and _git(repo, "status", "--porcelain") == ""
    notes = task.manifest_notes()["repository_files"]
    assert notes["included"] is True and notes["repo_cache"] == str(cache) and notes["max_files"] == 4


def test_long_files_become_line_pieces_of_one_session(tmp_path, clone):
    cache, _, base = clone
    task = SWEBenchVerified(
        path=str(_instances(tmp_path, base, problem_statement="big.py divides")),
        repo_cache=str(cache),
        file_chunk_lines=15,
        max_files=1,
    )
    (item,) = task.load(None, 0)
    pieces = [m for m in item.history if m.metadata.get("path") == "big.py"]
    assert [p.metadata["source_id"] for p in pieces] == ["big.py#L1-L15", "big.py#L16-L30", "big.py#L31-L41"]
    assert {p.metadata["session_id"] for p in pieces} == {"file:big.py"}
    body = "".join(p.content.split("\n", 1)[1] for p in pieces)
    assert body == FILES["big.py"]


def test_missing_clone_and_missing_commit_are_clear_errors(tmp_path, clone):
    cache, _, base = clone
    path = _instances(tmp_path, base, repo="acme/other")
    with pytest.raises(TaskDataError, match=r"no git clone of acme/other .*acme__other"):
        list(SWEBenchVerified(path=str(path), repo_cache=str(cache)).load(None, 0))
    path = _instances(tmp_path, "0" * 40)
    with pytest.raises(TaskDataError, match=r"instance acme__calc-1: .*commit 0{40} is not in this clone"):
        list(SWEBenchVerified(path=str(path), repo_cache=str(cache)).load(None, 0))


def test_mentions_need_a_unique_path():
    paths = ["pkg/forms.py", "pkg/admin/forms.py", "pkg/widgets/__init__.py", "setup.py", "b/build/a.py"]
    text = "forms.py breaks; admin/forms.py too; pkg.widgets.Select and setup.py. Also b/build/a.py."
    assert mentioned(text, paths) == ["pkg/admin/forms.py", "pkg/widgets/__init__.py", "setup.py", "b/build/a.py"]
