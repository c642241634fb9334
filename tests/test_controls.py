"""The harness controls (issue 29): ``control:no_memory`` and ``control:evidence_only``.

``controls.control_prompt`` on real synthetic-memory items counted with tiktoken, then a real
run against a loopback server whose answers are right for a seeded set of items whatever the
prompt (and, on the other items, only when the prompt's history states the answer): the
report flags exactly the seeded items "answerable without memory", shows every strategy's
score without them, and marks the controls and never ranks them.

The run uses ``controls=True`` (``--controls``): the engine adds both controls and builds their
prompts with ``control_prompt`` from the full items, which no strategy is given.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest

from budgetbench_core import EVIDENCE_KEY, Item, Message, RunConfig, run
from budgetbench_core.builtin.synthetic_memory import SyntheticMemory
from budgetbench_core.controls import CONTROLS, EVIDENCE_ONLY, NO_MEMORY, control_prompt, is_evidence
from budgetbench_core.evidence import evidence_marks, evidence_outcome
from budgetbench_core.report import stats, write_report
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer, tokenizer_for
from budgetbench_core.tokenizers import PromptCounter

TASK_OPTIONS = {"items": 10, "history_tokens": 600}
BUDGETS = [160, 512]


@pytest.fixture(scope="module")
def items():
    return list(SyntheticMemory(**TASK_OPTIONS).load(None, 0))


@pytest.fixture(scope="module")
def counter():
    return PromptCounter(tokenizer_for("tiktoken:cl100k_base"))


def test_the_controls_are_named():
    assert CONTROLS == ("control:no_memory", "control:evidence_only")
    with pytest.raises(ValueError, match="unknown control 'control:oracle'"):
        control_prompt("control:oracle", next(iter(SyntheticMemory(**TASK_OPTIONS).load(1, 0))), 512, None)  # type: ignore[arg-type]


def test_no_memory_is_the_system_prompt_and_the_question(items, counter):
    for item in items:
        for budget in (8, 512):
            prompt = control_prompt(NO_MEMORY, item, budget, counter)
            assert prompt == [item.system, item.query] and prompt == item.frame([])


def test_evidence_only_keeps_every_marked_message_when_they_fit(items, counter):
    marked = [i for i in items if evidence_marks(i.history)]
    assert len(marked) == 8  # abstention items (2 of 10) mark nothing
    for item in items:
        prompt = control_prompt(EVIDENCE_ONLY, item, 100_000, counter)
        evidence = [m for m in item.history if is_evidence(m)]
        assert prompt == item.frame(evidence)  # in history order, whole messages
        outcome = evidence_outcome(evidence_marks(item.history), prompt)
        if outcome is None:
            assert prompt == item.frame([])
        else:
            assert outcome["dropped"] == [] and len(outcome["kept"]) == outcome["marked"]
        # nothing but evidence: the history is far larger than the prompt
        assert counter.count(prompt) < counter.count(item.frame(list(item.history)))


def more_marks(item: Item) -> Item:
    """The item with three more of its own history messages marked as evidence (the task marks
    one per item): the fitting is then a choice."""
    picks = {0, len(item.history) // 3, 2 * len(item.history) // 3}
    history = tuple(
        Message(m.role, m.content, {**m.metadata, EVIDENCE_KEY: True}) if i in picks and not is_evidence(m) else m
        for i, m in enumerate(item.history)
    )
    return Item(item.id, history, item.query, item.answer, item.system, item.category, item.metadata)


def test_evidence_only_fits_whole_messages_newest_first(items, counter):
    checked = 0
    for item in map(more_marks, items):
        evidence = [m for m in item.history if is_evidence(m)]
        assert len(evidence) >= 3
        base = counter.count(item.frame([]))
        newest_alone = counter.count(item.frame(evidence[-1:]))
        everything = counter.count(item.frame(evidence))
        for budget in range(newest_alone, everything, max(1, (everything - newest_alone) // 6)):
            prompt = control_prompt(EVIDENCE_ONLY, item, budget, counter)
            kept = prompt[1:-1]
            assert prompt[0] == item.system and prompt[-1] == item.query
            assert kept and kept[-1] is evidence[-1]  # the newest piece first
            assert all(m in evidence for m in kept) and counter.count(prompt) <= budget
            assert len(kept) < len(evidence)
            order = [evidence.index(m) for m in kept]
            assert order == sorted(order)  # history order
            for missing in (m for m in evidence if m not in kept):
                # skipped only because it did not fit beside the newer pieces kept before it was tried
                newer = [k for k in kept if evidence.index(k) > evidence.index(missing)]
                assert counter.count(item.frame([missing, *newer])) > budget
            checked += 1
        # Below the frame itself nothing fits: the bare frame, which the runner records as a violation.
        assert control_prompt(EVIDENCE_ONLY, item, base - 1, counter) == item.frame([])
        assert control_prompt(EVIDENCE_ONLY, item, everything, counter) == item.frame(evidence)
    assert checked >= 20


# --- a run: controls beside strategies, against a server that knows some answers -------------


SEEDED = sorted(random.Random(29).sample([i.id for i in SyntheticMemory(**TASK_OPTIONS).load(None, 0)], 3))


def reading_reply():
    """Right on the seeded items whatever the prompt; on the others, right only when a history
    message of the prompt (not the system prompt, not the question) contains the answer."""
    items = SyntheticMemory(**TASK_OPTIONS).load(None, 0)
    by_query = {i.query.content: i for i in items}

    def reply(messages):
        item = by_query.get(messages[-1]["content"])
        if item is None:
            return "no idea"
        history = messages[1:-1] if messages[0]["role"] == "system" else messages[:-1]
        if item.id in SEEDED or any(str(item.answer) in m["content"] for m in history):
            return str(item.answer)
        return "no idea"

    return reply


@pytest.fixture(scope="module")
def controls_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("controls") / "run"
    with FaultServer(reply=reading_reply()) as server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation", "recency"],
                controls=True,  # the engine adds both controls, built from the full items
                budgets=BUDGETS,
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options=TASK_OPTIONS,
                max_concurrency=2,
                retries=0,
                timeout_s=30.0,
            )
        )
    paths = write_report(out)
    return out, final_rows(out), json.loads(paths["json"].read_text()), paths


def quality(rows, strategy, budget) -> dict[str, float]:
    values: dict[str, list[float]] = defaultdict(list)
    for row in rows.values():
        if (row["strategy"], row["budget"]) == (strategy, budget) and row["event"] in ("result", "violation"):
            values[row["item_id"]].append(float(row["quality"]) if row["event"] == "result" else 0.0)
    return {i: sum(v) / len(v) for i, v in values.items()}


def test_no_memory_flags_exactly_the_items_the_server_answers_anyway(controls_run):
    _, rows, report, paths = controls_run
    assert {(f["budget"], f["items"]) for f in report["answerable"]} == {(b, " ".join(SEEDED)) for b in BUDGETS}
    assert all(f["answerable"] == 3 and f["control_items"] == 10 for f in report["answerable"])
    remaining = {(r["strategy"], r["budget"]): r for r in report["without_answerable"]}
    assert set(remaining) == {(s, b) for s in ("truncation", "recency", EVIDENCE_ONLY) for b in BUDGETS}
    for (strategy, budget), row in remaining.items():
        values = quality(rows, strategy, budget)
        rest = [v for i, v in sorted(values.items()) if i not in SEEDED]
        low, high = stats.wilson(int(sum(rest)), len(rest))
        assert row["score_all"] == pytest.approx(sum(values.values()) / len(values), abs=1e-12)
        assert row["score_remaining"] == pytest.approx(sum(rest) / len(rest), abs=1e-12)
        assert (row["score_remaining_low"], row["score_remaining_high"]) == pytest.approx((low, high), abs=1e-12)
        assert row["n_remaining"] == 7 and row["left_out"] == 3
    # Memory earns the rest: at the larger budget truncation reads answers, at the smaller fewer.
    assert remaining[("truncation", 512)]["score_remaining"] > remaining[("truncation", 160)]["score_remaining"]
    assert remaining[(EVIDENCE_ONLY, 160)]["score_remaining"] >= remaining[("truncation", 160)]["score_remaining"]
    markdown = paths["md"].read_text()
    assert "| synthetic-memory | 160 | 3 | 10 | " + " ".join(SEEDED) + " |" in markdown
    html = paths["html"].read_text()
    assert 'id="answerable"' in html and 'id="without-answerable"' in html
    assert any("answerable without memory" in f and " ".join(SEEDED) in f for f in report["findings"])


def test_controls_are_marked_and_never_ranked(controls_run):
    _, rows, report, paths = controls_run
    assert report["controls"] == sorted([NO_MEMORY, EVIDENCE_ONLY])
    assert {r["strategy"] for r in report["ranking"]} == {"truncation", "recency"}
    assert {c["strategy"] for c in report["curves"] if c["control"]} == {NO_MEMORY, EVIDENCE_ONLY}
    assert not any(NO_MEMORY in (r["strategy"], r["reference"].split("@")[0]) for r in report["paired"])
    assert not any(EVIDENCE_ONLY in (r["strategy"], r["reference"].split("@")[0]) for r in report["paired"])
    (grid,) = report["pivot"]
    assert set(grid["controls"]) == {NO_MEMORY, EVIDENCE_ONLY}
    assert not any(set(grid["best"][str(b)]["strategies"]) & set(CONTROLS) for b in BUDGETS)
    # evidence_only is the ceiling: at each budget its prompts keep every marked piece that fits
    for budget in BUDGETS:
        kept = [
            r for r in rows.values() if (r["strategy"], r["budget"]) == (EVIDENCE_ONLY, budget) and r.get("evidence")
        ]
        assert len(kept) == 8 and all(r["evidence"]["dropped"] == [] for r in kept)
    markdown = paths["md"].read_text()
    assert f"| {NO_MEMORY} (control, not ranked) |" in markdown and f"| {EVIDENCE_ONLY} (control) |" in markdown
