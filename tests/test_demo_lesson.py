"""The demo states its lesson, computed from its own rows: each strategy's evidence recall at the
smallest tier paired with truncation's over the same items, with the interval; and, when the
answered run scores near 0, why (the 135M model, not the prompts) and what to run instead."""

from __future__ import annotations

import re

import pytest

from budgetbench_core.demo import BASELINE, LOW_QUALITY, REAL_QUALITY, demo_configs, summary_lines
from budgetbench_core.report.evidence import item_evidence
from budgetbench_core.runlog import final_rows
from budgetbench_core.runner import run


def all_kept(rows: dict, strategy: str, budget: int) -> dict[str, float]:
    return item_evidence([r for k, r in rows.items() if k[1] == strategy and int(r["budget"]) == budget])[0]


def test_the_prompts_only_lesson_is_the_paired_evidence_recall_of_the_run(tmp_path):
    prompts = demo_configs(tmp_path, 16, 0, 2, [BASELINE, "checkpoint"])
    assert len(prompts) == 1
    run(prompts[0])
    lines = summary_lines(tmp_path)
    text = "\n".join(lines)
    assert "The lesson, paired over the same items at 512 tokens" in text
    rows = final_rows(tmp_path / "prompts")
    checkpoint, truncation = all_kept(rows, "checkpoint", 512), all_kept(rows, BASELINE, 512)
    shared = sorted(set(checkpoint) & set(truncation))
    assert shared
    line = next(line for line in lines if line.startswith("  checkpoint ") and " vs truncation " in line)
    cand, ref = (sum(values[i] for i in shared) / len(shared) for values in (checkpoint, truncation))
    assert line.startswith(f"  checkpoint {cand:.2f} vs truncation {ref:.2f} over {len(shared)} paired items: ")
    assert f"{cand - ref:+.2f}" in line and "newcombe" in line
    low = re.search(r"\[([+-]\d\.\d\d), [+-]\d\.\d\d\]", line)
    if low and float(low.group(1)) > 0:  # the interval excludes 0: called a result
        assert "keeps all the evidence for more items (a result)" in line
    else:
        assert "no ranking claim" in line
    assert (tmp_path / "LESSON.md").read_text().count("The lesson, paired") == 1
    assert lines[-1] == f"these lines: {tmp_path / 'LESSON.md'}"
    assert not any("Why quality is near 0" in line for line in lines)  # no answered run: nothing to explain


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_an_answered_run_near_zero_says_why_and_what_to_run_for_real_quality(tmp_path):
    prompts, answered = demo_configs(tmp_path, 4, 2, 2, [BASELINE])
    run(prompts)
    run(answered)
    lines = summary_lines(tmp_path)
    rows = [r for r in final_rows(tmp_path / "answered").values() if r["event"] in ("result", "violation")]
    quality = sum(float(r.get("quality") or 0) for r in rows) / len(rows)
    explained = any(line.startswith("Why quality is near 0") for line in lines)
    assert explained == (quality < LOW_QUALITY), lines
    if explained:
        assert "SmolLM2-135M" in "\n".join(lines) and f"  {REAL_QUALITY}" in lines
    # the answered run's own report says it first, in its findings (run --note)
    from budgetbench_core.report import write_report

    report = write_report(tmp_path / "answered")["md"].read_text(encoding="utf-8")
    findings = report.split("## Findings", 1)[1].split("\n## ", 1)[0]
    assert findings.lstrip().startswith("- Note: the embedded SmolLM2-135M cannot answer these questions")
