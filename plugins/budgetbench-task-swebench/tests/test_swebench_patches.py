"""Diff parsing and the patch-similarity proxy, on the real gold patches of the shared data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from budgetbench_task_swebench.grader import PatchSimilarity
from budgetbench_task_swebench.patches import extract_patch, parse_patch, similarity, strip_prefix

from budgetbench_core import GradingContext, Item, Message

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT.parent / "shared" / "data" / "swebench" / "swebench_verified_mini.jsonl"
needs_data = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"shared data not found at {SAMPLE}")


def _gold():
    return [json.loads(line)["patch"] for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]


def _move(patch: str, new_root: str) -> str:
    """The same patch applied to a different file: every path moved under ``new_root``."""
    return re.sub(
        r"(^diff --git a/| b/|^--- a/|^\+\+\+ b/)", lambda m: m.group(1) + new_root + "/", patch, flags=re.MULTILINE
    )


@needs_data
def test_gold_patch_scores_one_against_itself_and_zero_when_empty_or_elsewhere():
    for gold in _gold():
        assert similarity(gold, gold) == (1.0, similarity(gold, gold)[1])
        assert similarity(gold, "")[0] == 0.0
        assert similarity(gold, "I could not find the bug.")[0] == 0.0
        moved = _move(gold, "elsewhere")
        assert parse_patch(moved)[0].new_path.startswith("elsewhere/")
        assert similarity(gold, moved)[0] == 0.0


@needs_data
def test_partial_patch_scores_between():
    gold = next(p for p in _gold() if len(parse_patch(p)) >= 2)
    first_file = gold[: gold.index("diff --git", 1)]
    quality, detail = similarity(gold, first_file)
    assert 0.0 < quality < 1.0 and 0.0 < detail["file_recall"] < 1.0 and 0.0 < detail["line_f1"] < 1.0


def test_defect_12_prefixes_are_removed_as_prefixes_never_as_character_sets():
    assert strip_prefix("b/build/a.py") == "build/a.py"
    assert strip_prefix("a/abc/b.py") == "abc/b.py"
    assert strip_prefix("build/a.py") == "build/a.py"
    patch = (
        "diff --git a/build/a.py b/build/a.py\n--- a/build/a.py\n+++ b/build/a.py\n@@ -1,2 +1,2 @@\n keep\n-old\n+new\n"
    )
    (change,) = parse_patch(patch)
    assert (change.old_path, change.new_path, change.status) == ("build/a.py", "build/a.py", "modified")
    nested = (
        "diff --git a/b/build/a.py b/b/build/a.py\n--- a/b/build/a.py\n+++ b/b/build/a.py\n"
        "@@ -1,2 +1,2 @@\n keep\n-old\n+new\n"
    )
    assert parse_patch(nested)[0].paths == {"b/build/a.py"}


def test_new_deleted_and_renamed_files():
    patch = (
        "diff --git a/bar/new.py b/bar/new.py\nnew file mode 100644\nindex 0000000..1111111\n"
        "--- /dev/null\n+++ b/bar/new.py\n@@ -0,0 +1,2 @@\n+def f():\n+    return 1\n"
        "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\nindex 2222222..0000000\n"
        "--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n"
        "diff --git a/old/name.py b/new/name.py\nsimilarity index 100%\nrename from old/name.py\nrename to new/name.py\n"
    )
    added, deleted, renamed = parse_patch(patch)
    assert (added.old_path, added.new_path, added.status) == (None, "bar/new.py", "added")
    assert (deleted.old_path, deleted.new_path, deleted.status) == ("gone.py", None, "deleted")
    assert (renamed.old_path, renamed.new_path, renamed.status) == ("old/name.py", "new/name.py", "renamed")
    assert added.added == ("def f():", "    return 1") and deleted.removed == ("x = 1",)
    quality, detail = similarity(patch, patch)
    assert quality == 1.0 and detail["gold_files"] == ["bar/new.py", "gone.py", "new/name.py", "old/name.py"]


def test_malformed_prediction_scores_zero_with_a_reason():
    gold = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
    quality, detail = similarity(gold, "--- a/x.py\n+++ b/x.py\n@@ -1,9 +1,9 @@\n-b\n+c\n")
    assert quality == 0.0 and detail["reason"].startswith("malformed diff")


def test_extract_patch_from_replies():
    diff = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert extract_patch(f"Here is the fix:\n```diff\n{diff}```\nDone.") == diff
    assert extract_patch(f"Sure.\n{diff}") == diff
    assert extract_patch("```python\nprint('no diff')\n```") == ""
    assert extract_patch("The diff --git command is useful.") == ""


def test_grader_weights_and_labels():
    gold = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
    item = Item(id="i", history=(), query=Message("user", "q"), answer=gold)
    context = GradingContext(judge=None, judge_model=None)
    same_file_other_lines = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-q\n+r\n"
    assert PatchSimilarity().grade(item, same_file_other_lines, context).quality == pytest.approx(0.4)
    verdict = PatchSimilarity(file_weight=0.7, line_weight=0.3).grade(item, same_file_other_lines, context)
    assert verdict.quality == pytest.approx(0.7) and verdict.detail["proxy"] is True
    assert PatchSimilarity().grade(item, gold, context).quality == 1.0
    assert PatchSimilarity.binary is False
    with pytest.raises(ValueError, match="sum to 1"):
        PatchSimilarity(file_weight=0.5, line_weight=0.6)
