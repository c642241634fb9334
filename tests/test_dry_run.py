"""``run --dry-run``: the cells, answer calls, tokens and $ of a run, before any call is sent."""

from __future__ import annotations

import re

from budgetbench_core import final_rows
from budgetbench_core.testing import FaultServer, invoke_cli


def options(server, out):
    return [
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "truncation",
        "-s",
        "full_context",
        "-b",
        "300 2000",
        "-n",
        "3",
        "-m",
        "openai/fault-model",
        "--api-base",
        server.url,
        "--tokenizer",
        "tiktoken:cl100k_base",
        "--price",
        "2/10",
        "--task-option",
        "items=3",
        "--task-option",
        "history_tokens=600",
        "--no-preflight",
        "--display",
        "none",
        "-o",
        str(out),
    ]


def test_a_dry_run_sends_nothing_and_its_estimate_is_what_the_run_then_sends(tmp_path):
    out = tmp_path / "run"
    with FaultServer() as server:
        dry = invoke_cli(*options(server, out), "--dry-run")
        assert dry.exit_code == 0, dry.output
        assert server.requests == [] and not out.exists(), "a dry run calls nothing and writes nothing to --out"
        text = " ".join(dry.output.split())
        found = re.search(
            r"total: (\d+) answer calls, (\d+) sent \(the others answered by the reply cache\), ([\d,]+) input "
            r"tokens, at most ([\d,]+) output tokens, at most \$([\d.]+)",
            text,
        )
        assert found, dry.output
        calls, distinct, tokens, output_cap, dollars = (
            int(found[1]),
            int(found[2]),
            int(found[3].replace(",", "")),
            int(found[4].replace(",", "")),
            float(found[5]),
        )
        assert "priced at" in text
        assert dollars == round(tokens * 2e-6 + output_cap * 10e-6, 4)

        real = invoke_cli(*options(server, out))
        assert real.exit_code == 0, real.output
        sent = len(server.requests)
    results = [r for r in final_rows(out).values() if r["event"] == "result"]
    assert calls == len(results) and sent == distinct < calls  # full_context at 300 is over budget: never sent
    fresh = [r for r in results if not r["cached"]]
    assert len(fresh) == sent and sum(r["prompt_tokens"] for r in fresh) == tokens
    assert sum(r["completion_tokens"] or 0 for r in fresh) <= output_cap  # (this server reports none)
