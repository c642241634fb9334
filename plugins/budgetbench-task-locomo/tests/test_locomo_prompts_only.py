"""``budgetbench run -t locomo --prompts-only`` through the CLI: rows, evidence recall, a per-category table.

No model is called (a loopback server that would answer stays unasked); prompts are counted
with tiktoken so the test needs no embedded server. truncation and checkpoint, the built-in
strategies, keep it fast; the docs page gives the same run with rag.
"""

import csv
import json

from budgetbench_core import final_rows
from budgetbench_core.testing import FaultServer, invoke_cli

CATEGORIES = {"multi-hop", "temporal", "open-domain", "single-hop"}


def test_prompts_only_run_gives_rows_evidence_recall_and_categories(locomo_file, tmp_path):
    out = tmp_path / "po"
    with FaultServer(rate=0.0) as server:
        result = invoke_cli(
            *("run", "-t", "locomo", "--task-option", f"path={locomo_file}", "-s", "truncation", "-s", "checkpoint"),
            *("-b", "512 1024", "--prompts-only", "-n", "8", "--model", "openai/fault-model"),
            *("--api-base", server.url, "--tokenizer", "tiktoken:cl100k_base", "--display", "none", "-o", str(out)),
        )
        assert result.exit_code == 0, result.output
        assert server.requests == []
    rows = final_rows(out)
    assert len(rows) == 2 * 2 * 8 and {r["event"] for r in rows.values()} == {"admitted"}
    assert {r["category"] for r in rows.values()} == CATEGORIES
    assert all(r["prompt_tokens"] <= r["budget"] for r in rows.values())
    assert all(
        r["evidence"]["marked"] == len(r["evidence"]["kept"]) + len(r["evidence"]["dropped"]) for r in rows.values()
    )
    # 17K-32K-token conversations: truncation keeps the newest turns, where none of these 8
    # questions' evidence is; checkpoint keeps some of it
    kept = {
        s: sum(len(r["evidence"]["kept"]) for r in rows.values() if r["strategy"] == s)
        for s in ("truncation", "checkpoint")
    }
    assert kept["truncation"] == 0 < kept["checkpoint"]
    manifest = json.loads((out / "manifest.json").read_text())
    notes = manifest["task"]
    assert notes["questions_selected"] == {
        "1 multi-hop": 2,
        "2 temporal": 2,
        "3 open-domain": 2,
        "4 single-hop": 2,
        "5 adversarial": 0,
    }
    assert notes["evidence"]["unresolved"] and manifest["calls_made"] == 0
    with open(out / "report" / "categories.csv", newline="", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    assert {(r["category"], r["strategy"], r["budget"]) for r in table} == {
        (c, s, b) for c in CATEGORIES for s in ("truncation", "checkpoint") for b in ("512", "1024")
    }
    assert all(r["evidence_all_n"] == "2" and r["evidence_all"] != "" for r in table)
