"""A run of more than 1,000 model calls against a server that misbehaves on 20% of them.

The real runner and the real litellm backend talk to the fault-injecting loopback server
(budgetbench_core.testing.FaultServer). Every cell must end as exactly one result, violation or
error row; errors carry their cause and never a prediction; results carry exactly what
the server sent; 429s are retried no sooner than Retry-After; no prompt over the budget
ever reaches the server.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core import Message, RunConfig, run  # noqa: E402
from budgetbench_core.builtin.tokenizers import TiktokenTokenizer  # noqa: E402
from budgetbench_core.runlog import iter_events, read_manifest  # noqa: E402
from budgetbench_core.testing import FAULTS, NO_COMPLETION, USAGE_OFFSET, FaultServer, default_reply, messages_hash  # noqa: E402

ITEMS = 1000
BUDGETS = [40, 4096]  # 40 is below system prompt + question: every such cell is a violation
RETRIES = 2
RETRY_AFTER_S = 1.0
# ATTEMPTS_NOTE: the server sees at most as many requests as the runner made attempts (more
# would mean hidden retries); on a loaded machine a client may time out before the server
# has read its request, so the runner may count one attempt more than the server saw.


def tiktoken_count():
    tokenizer = TiktokenTokenizer("cl100k_base")
    return lambda messages: tokenizer.count([Message(m["role"], m["content"]) for m in messages])


@pytest.mark.slow
def test_thousand_calls_with_injected_faults(tmp_path):
    out = tmp_path / "run"
    with FaultServer(
        rate=0.2, seed=8, retry_after_s=RETRY_AFTER_S, hang_s=2.0, count_prompt=tiktoken_count()
    ) as server:
        summary = run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation"],
                budgets=BUDGETS,
                out=out,
                model="openai/fault-model",
                api_base=server.url,
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": ITEMS, "history_tokens": 200},
                retries=RETRIES,
                timeout_s=1.0,
                max_concurrency=16,
            )
        )
    requests = server.requests
    events = list(iter_events(out))
    terminal = [e for e in events if e["event"] in ("result", "violation", "error")]
    keys = Counter((e["strategy"], e["budget"], e["repeat"], e["item_id"]) for e in terminal)

    # Nothing lost, nothing duplicated.
    assert summary.cells_total == ITEMS * len(BUDGETS)
    assert len(keys) == ITEMS * len(BUDGETS)
    assert set(keys.values()) == {1}

    # The budget is enforced before the wire: nothing sent over 4096, the tiny tier never sent.
    assert all(r.prompt_tokens <= 4096 for r in requests)
    audits = {(e["budget"], e["item_id"]): e for e in events if e["event"] == "prompt_audit"}
    by_hash = server.by_hash()
    for row in terminal:
        if row["budget"] == 40:
            assert row["event"] == "violation" and row["quality"] == 0 and row["prompt_tokens"] > 40
            assert messages_hash(audits[(40, row["item_id"])]["messages"]) not in by_hash

    # Each 4096 cell matches what the server did with its prompt.
    outcomes = Counter()
    for row in terminal:
        if row["budget"] != 4096:
            continue
        messages = audits[(4096, row["item_id"])]["messages"]
        sent = by_hash[messages_hash(messages)]
        last = sent[-1]
        assert len(sent) <= RETRIES + 1
        if row["event"] == "result":
            assert last.fault in (None, "empty", "usage_mismatch")
            assert row["attempts"] >= len(sent), (row, sent)  # see ATTEMPTS_NOTE
            expected = "" if last.fault == "empty" else default_reply(messages)
            assert row["prediction"] == expected
            if expected == "":
                assert row["quality"] == 0
            assert row["served_count_matches"] is (last.fault != "usage_mismatch")
            shift = USAGE_OFFSET if last.fault == "usage_mismatch" else 0
            assert row["served_prompt_tokens"] == row["prompt_tokens"] + shift == last.prompt_tokens + shift
            outcomes["result"] += 1
        else:
            assert row["event"] == "error", row
            assert last.fault in NO_COMPLETION
            assert row["cause"] and row["phase"] == "model"
            assert "prediction" not in row and "quality" not in row  # never a graded placeholder
            assert row["attempts"] >= len(sent), (row, sent)
            if last.fault != "null_content":  # transport faults are retried until the retries run out
                assert row["attempts"] == RETRIES + 1
            outcomes["error:" + last.fault] += 1

    # 429s: the next attempt of the same prompt waited at least Retry-After.
    gaps = [b.time - a.time for chain in by_hash.values() for a, b in zip(chain, chain[1:]) if a.fault == "429"]
    assert gaps and min(gaps) >= RETRY_AFTER_S - 0.05

    faults = server.fault_counts()
    injected = sum(n for name, n in faults.items() if name != "ok")
    assert len(requests) >= 1000
    assert 0.15 <= injected / len(requests) <= 0.25
    assert set(FAULTS) <= set(faults)
    calls_made = read_manifest(out)["calls_made"]
    assert len(requests) <= calls_made <= len(requests) * 1.01
    figures = {
        "calls": len(requests),
        "calls_made": calls_made,
        "faults_injected": injected,
        "by_fault": dict(faults),
        "cells": summary.cells_total,
        "results": summary.results,
        "violations": summary.violations,
        "errors": summary.errors,
        "lost": ITEMS * len(BUDGETS) - len(keys),
        "min_429_gap_s": round(min(gaps), 3),
        "outcomes": dict(outcomes),
        "wall_s": round(summary.wall_s, 1),
    }
    print("fault-injection figures:", json.dumps(figures, sort_keys=True))
