"""The cost ledger: every figure recomputed from the rows, every $ figure tokens x price.

One run against the loopback server with three arms: truncation (answer calls only),
summary_buffer (auxiliary calls through ``context.complete``) and a vendor layer whose own
OpenAI client calls the model through the metering gateway; ``--price 1.5/6``.
"""

from __future__ import annotations

import json
import types
from collections import defaultdict
from pathlib import Path

import pytest

from budgetbench_core import Message, RunConfig, hookimpl, run
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.report import write_report
from budgetbench_core.report.ledger import fmt_figure
from budgetbench_core.runlog import final_rows, iter_events, read_manifest
from budgetbench_core.testing import FaultServer, registry_with, tokenizer_for
from budgetbench_core.tokenizers import PromptCounter

PRICE = (1.5, 6.0)  # $ per million input, output tokens
ITEMS = 4


class VendorSdk(Truncation):
    """Calls its own model once per item with the SDK's defaults (the gateway, in its environment)."""

    name = "ledger-vendor-sdk"

    def apply(self, history, budget, context):
        import openai

        client = openai.OpenAI(max_retries=0, timeout=10)
        client.chat.completions.create(
            model="vendor", messages=[{"role": "user", "content": "Note: " + history[0].content[:200]}], max_tokens=4
        )
        return super().apply(history, budget, context)


PLUGIN = types.SimpleNamespace(register_strategies=hookimpl(lambda register: register(VendorSdk)))


@pytest.fixture(scope="module")
def priced_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ledger") / "run"
    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))
    served = lambda messages: counter.count([Message(m["role"], m["content"]) for m in messages])  # noqa: E731
    with FaultServer(count_prompt=served) as server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation", "summary_buffer", "ledger-vendor-sdk"],
                budgets=[300, 900],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": ITEMS, "history_tokens": 1200},
                price=f"{PRICE[0]}/{PRICE[1]}",
                max_concurrency=2,
                retries=0,
                timeout_s=30.0,
            ),
            registry=registry_with(PLUGIN, distribution="ledger-vendor"),
        )
    paths = write_report(out)
    return out, json.loads(paths["json"].read_text()), paths


def recomputed(out: Path) -> dict[tuple[str, int], dict[str, int]]:
    """Tokens per cell from the raw rows: terminal rows for answers, aux_call and metered_call events."""
    cells: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in final_rows(out).values():
        cell = cells[(row["strategy"], row["budget"])]
        if row["event"] in ("result", "violation"):
            cell["questions"] += 1
        if row["event"] == "result":
            cell["in"] += row["prompt_tokens"]
            cell["out"] += row["completion_tokens"]
    for event in iter_events(out):
        cell = cells[(event["strategy"], event["budget"])]
        if event["event"] == "aux_call" and event["sent"]:
            cell["in"] += event["prompt_tokens"]
            cell["out"] += event["completion_tokens"] or 0
            cell["aux"] += 1
        if event["event"] == "metered_call" and event["kind"] == "call" and event["ok"]:
            cell["in"] += event["input_tokens"]
            cell["out"] += event["completion_tokens"]
            cell["metered"] += 1
    return cells


def test_every_dollar_figure_is_tokens_times_the_price(priced_run):
    out, report, _ = priced_run
    manifest = read_manifest(out)
    assert manifest["price"]["source"] == "--price"
    expected = recomputed(out)
    ledger = {(r["strategy"], r["budget"]): r for r in report["ledger"]}
    assert set(ledger) == set(expected) and len(ledger) == 6
    for key, row in ledger.items():
        tokens = expected[key]
        assert (row["input_tokens"], row["output_tokens"]) == (tokens["in"], tokens["out"]), key
        assert row["questions"] == tokens["questions"] == ITEMS
        dollars = (tokens["in"] * PRICE[0] + tokens["out"] * PRICE[1]) / 1e6
        assert row["cost_usd"] == pytest.approx(dollars, rel=1e-12)
        assert row["cost_per_question_usd"] == pytest.approx(dollars / ITEMS, rel=1e-12)
        assert row["tokens_per_question"] == pytest.approx((tokens["in"] + tokens["out"]) / ITEMS)
        assert row["aux_calls"] == tokens["aux"] and row["metered_aux_calls"] == tokens["metered"]


def test_each_phase_lands_where_its_calls_were_made(priced_run):
    _, report, paths = priced_run
    by_strategy = defaultdict(list)
    for row in report["ledger"]:
        by_strategy[row["strategy"]].append(row)
    assert all(r["aux_calls"] == 0 and r["metered_aux_calls"] == 0 for r in by_strategy["truncation"])
    assert any(r["aux_calls"] > 0 for r in by_strategy["summary_buffer"])  # its summaries are auxiliary calls
    assert all(r["metered_aux_calls"] == ITEMS for r in by_strategy["ledger-vendor-sdk"])  # one per item and tier
    summary = {(r["strategy"], r["budget"]): r for r in report["summary"]}
    for row in report["ledger"]:  # the summary's cost columns are the ledger's
        assert summary[(row["strategy"], row["budget"])]["cost_per_question"] == row["cost_per_question_usd"]
    markdown = paths["md"].read_text()
    assert "## Cost ledger" in markdown and "Price (--price): input x 1.5 + output x 6" in markdown
    html = paths["html"].read_text()
    assert 'id="ledger"' in html and "score vs cost per question" in html
    for row in report["ledger"]:  # the HTML shows the ledger's own figures, formatted as the Markdown
        figures = f"<td>{fmt_figure(row['tokens_per_question'])}</td>"
        figures += f"<td>{fmt_figure(row['worker_cpu_s'])} ("
        assert figures in html and f"{fmt_figure(row['cost_per_question_usd'])} |" in markdown
        assert f"<td>{fmt_figure(row['cost_per_question_usd'])}</td></tr>" in html
    assert (out_dir(paths) / "score_vs_cost.png").stat().st_size > 10_000  # drawn against $ per question


def out_dir(paths) -> Path:
    return Path(paths["html"]).parent


def test_a_bad_price_is_refused_before_the_run(tmp_path):
    from budgetbench_core.runner import RunConfigError

    with pytest.raises(RunConfigError, match=r"--price '1\.5': expected IN/OUT"):
        run(RunConfig(task="synthetic-memory", strategies=["truncation"], budgets=[300], out=tmp_path, price="1.5"))
    assert not (tmp_path / "cells").exists()


def test_outside_services_show_in_markdown_and_html_as_the_ledger_sums_them():
    """Declared hosts with their calls and bytes, undeclared ones refused: the same rows in both outputs."""
    from budgetbench_core.report.html import _environment
    from budgetbench_core.report.ledger import ledger_markdown, ledger_table

    def row(item, hosts, undeclared):
        return {
            "event": "result",
            "item_id": item,
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "metered": {"outside": {"hosts": hosts}, "undeclared": {"hosts": undeclared}},
        }

    cells = {
        ("t", "vendor", 512): [
            row("a", {"api.vendor.test": {"calls": 2, "bytes_sent": 300, "bytes_received": 4000}}, {}),
            row("b", {"api.vendor.test": {"calls": 1, "bytes_sent": 120, "bytes_received": 900}}, {"evil.test": 3}),
        ]
    }
    (ledger,) = ledger_table(cells, None)
    assert ledger["outside"] == {"api.vendor.test": {"calls": 3, "bytes_sent": 420, "bytes_received": 4900}}
    assert ledger["undeclared_network"] == {"evil.test": 3} and ledger["outside_bytes"] == 5320
    markdown = "\n".join(ledger_markdown([ledger], None))
    assert "| t | vendor | 512 | api.vendor.test | 3 | 420 / 4900 | declared |" in markdown
    assert "| t | vendor | 512 | evil.test | 3 | — | **undeclared network use: refused** |" in markdown
    html = _environment().get_template("ledger.html.j2").render(ledger=[ledger], price=None, approximate=False)
    table = html.split('id="outside-hosts"')[1].split("</table>")[0]
    assert '<td class="text">api.vendor.test</td><td>3</td><td>420 / 4900</td>' in table
    assert '<td class="text">evil.test</td><td>3</td><td>—</td>' in table and "refused" in table
    assert 'id="break-even"' not in html  # no write cost: nothing to amortise
