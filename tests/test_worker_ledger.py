"""The cost ledger's worker side: the plugin worker's own CPU seconds per cell and phase, a memory
system's write cost recorded once per item and amortised per question, and its break-even
against full context.

One run against the loopback server: truncation, full_context, and a memory system whose
ingest makes one call per session with its own OpenAI client (through the metering gateway,
phase ``write``) and spins the CPU for a known time in ingest and in retrieve (measured by the
plugin itself with ``time.process_time``, so what the ledger must show is a lower bound, not a
speed).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import types
from collections import defaultdict

import pytest

from budgetbench_core import MemorySystem, Message, Regime, RunConfig, hookimpl, run
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.host.metering import cpu_by_phase
from budgetbench_core.memory_systems import IngestReport, RetrievedItem
from budgetbench_core.report import write_report
from budgetbench_core.report.ledger import fmt_figure, ledger_markdown
from budgetbench_core.runlog import final_rows, iter_events
from budgetbench_core.testing import FaultServer, registry_with, tokenizer_for
from budgetbench_core.tokenizers import PromptCounter

ITEMS = 3
INGEST_CPU, RETRIEVE_CPU = 0.3, 0.15  # seconds of CPU the memory system spends, by its own clock
SMALL, LARGE = 300, 2000  # full context (600-token histories) fits only the large budget


_process_time = time.process_time  # kept: a lying plugin below replaces the module's


def spin(seconds: float) -> None:
    """Use ``seconds`` of this process's CPU time."""
    end = _process_time() + seconds
    while _process_time() < end:
        pass


class NotesMemory(MemorySystem):
    """Extracts one note per session with its own LLM client; retrieves the newest message only."""

    name = "cpu-notes-memory"
    regime = Regime.PERSISTENT_STATEFUL

    def reset(self):
        self.sessions = []

    def ingest(self, sessions, context):
        import openai

        client = openai.OpenAI(max_retries=0, timeout=10)
        for session in sessions:
            text = " ".join(m.content for m in session.messages)[:300]
            client.chat.completions.create(
                model="extractor", messages=[{"role": "user", "content": f"Extract facts: {text}"}], max_tokens=6
            )
        spin(INGEST_CPU)
        self.sessions = list(sessions)
        return IngestReport(len(sessions), len(sessions), [])

    def retrieve(self, query, context):
        spin(RETRIEVE_CPU)
        return [RetrievedItem(self.sessions[-1].messages[-1].content, score=1.0)]


class LyingMemory(MemorySystem):
    """Spends the same CPU as ``NotesMemory`` in ingest and retrieve, but stops its worker's clock
    after its first ingest (``time.process_time`` reads 0 from then on): by its own account, its
    worker spends nothing."""

    name = "cpu-lying-memory"
    regime = Regime.PERSISTENT_STATEFUL

    def reset(self):
        self.sessions = []

    def ingest(self, sessions, context):
        spin(INGEST_CPU)
        time.process_time = lambda: 0.0
        self.sessions = list(sessions)
        return IngestReport(len(sessions), len(sessions), [])

    def retrieve(self, query, context):
        spin(RETRIEVE_CPU)
        return [RetrievedItem(self.sessions[-1].messages[-1].content, score=1.0)]


CHILD_CPU = 0.3  # seconds a child process of the worker spins
SPIN = f"import time\nend = time.process_time() + {CHILD_CPU}\nwhile time.process_time() < end: pass"


class ChildWork(Truncation):
    """Does its work in another process, where the worker's own clock does not see it: a
    subprocess it waits for (``run``), one it leaves unreaped (``unreaped``), or a detached
    grandchild in a session of its own, adopted by the guard when its parent exits (``orphan``)."""

    name = "cpu-child-work"

    def __init__(self, how: str = "run") -> None:
        super().__init__(how=how)
        self.how = how

    def apply(self, history, budget, context):
        if self.how == "run":
            subprocess.run([sys.executable, "-c", SPIN], check=True)
        elif self.how == "unreaped":
            self.child = subprocess.Popen([sys.executable, "-c", SPIN])
            os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped (a zombie)
        else:
            marker = context.scratch_dir / f"done-{time.monotonic_ns()}"
            first = os.fork()
            if first == 0:
                os.setsid()
                if os.fork() == 0:
                    exec(SPIN)
                    marker.touch()
                os._exit(0)
            os.waitpid(first, 0)
            while not marker.exists():
                time.sleep(0.05)
            time.sleep(0.2)  # the guard reaps it at its next SIGCHLD
        return super().apply(history, budget, context)


PLUGIN = types.SimpleNamespace(
    register_strategies=hookimpl(lambda register: [register(cls) for cls in (NotesMemory, LyingMemory, ChildWork)])
)


def ledger_run(server, out, strategies: list[str], budgets: list[int], items: int, params=None) -> None:
    """One run of this file's plugins against ``server``, on synthetic-memory's 600-token histories."""
    run(
        RunConfig(
            task="synthetic-memory",
            strategies=strategies,
            budgets=budgets,
            out=out,
            api_base=server.url,
            model="openai/fault-model",
            tokenizer="tiktoken:cl100k_base",
            task_options={"items": items, "history_tokens": 600},
            max_concurrency=1,
            retries=0,
            timeout_s=30.0,
            strategy_params=params or {},
        ),
        registry=registry_with(PLUGIN, distribution="cpu-notes"),
    )


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("worker-ledger") / "run"
    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))
    served = lambda messages: counter.count([Message(m["role"], m["content"]) for m in messages])  # noqa: E731
    with FaultServer(count_prompt=served) as server:
        ledger_run(server, out, ["truncation", "full_context", "cpu-notes-memory"], [SMALL, LARGE], ITEMS)
    paths = write_report(out)
    rows = {key[1:]: row for key, row in final_rows(out).items()}
    ledger = {(r["strategy"], r["budget"]): r for r in json.loads(paths["json"].read_text())["ledger"]}
    return out, rows, ledger


def test_the_workers_own_cpu_seconds_are_recorded_per_cell_and_phase(memory_run):
    """Old code: the worker's CPU appeared nowhere (the terminal rows' ``metered`` had no ``cpu_s``)."""
    _, rows, ledger = memory_run
    memory = [r for key, r in rows.items() if key[0] == "cpu-notes-memory"]
    ingested = [r for r in memory if r["metered"].get("write", {}).get("calls")]
    assert len(ingested) == ITEMS  # one ingest per item, on whichever budget tier ran it first
    for row in ingested:
        assert row["metered"]["write"]["cpu_s"] >= INGEST_CPU
        assert row["metered"]["read"]["cpu_s"] >= RETRIEVE_CPU
    for row in memory:
        if row not in ingested:  # the other tier reused the item's memory: no ingest, no retrieve
            assert row["metered"].get("write", {}).get("cpu_s", 0) < INGEST_CPU
            assert row["metered"].get("read", {}).get("cpu_s", 0) < RETRIEVE_CPU
    truncation = [r for key, r in rows.items() if key[0] == "truncation"]
    assert all(r["metered"]["aux"]["cpu_s"] >= 0 for r in truncation)  # measured, if small
    cells = [ledger[("cpu-notes-memory", budget)] for budget in (SMALL, LARGE)]
    assert sum(c["worker_cpu_write_s"] for c in cells) >= ITEMS * INGEST_CPU
    assert sum(c["worker_cpu_read_s"] for c in cells) >= ITEMS * RETRIEVE_CPU
    for cell in cells:
        parts = [cell[f"worker_cpu_{label}_s"] for label in ("write", "read", "other")]
        assert cell["worker_cpu_s"] == pytest.approx(sum(p or 0 for p in parts), abs=1e-5)


def test_ingest_and_retrieve_keep_their_own_seconds_when_the_clocks_windows_differ_slightly():
    """Old code split the measured total in proportion: a harness reading 1 ms short of the
    worker's (its clock ran on after its last ``take``, before the harness read) charged a
    0.15 s retrieve 0.1497 s (a CI failure). The difference belongs to the rest of ``apply``."""
    reported = {"ingest": 0.3, "retrieve": 0.15, "apply": 0.002}
    split = cpu_by_phase(reported, measured=0.451)
    assert split["ingest"] == 0.3 and split["retrieve"] == 0.15
    assert split["apply"] == pytest.approx(0.001)
    assert cpu_by_phase(reported, measured=0.9)["apply"] == pytest.approx(0.45)  # the rest: not the worker's word
    lying = cpu_by_phase({"ingest": 5.0, "retrieve": 5.0}, measured=0.5)  # claims more than was spent
    assert sum(lying.values()) == pytest.approx(0.5) and lying["ingest"] == pytest.approx(0.25)


def test_a_worker_that_misreports_its_cpu_is_charged_what_the_harness_measured(tmp_path):
    """Old code: the ledger took the worker's own report, and this one reported (almost) nothing."""
    out = tmp_path / "run"
    with FaultServer() as server:
        ledger_run(server, out, ["cpu-lying-memory"], [SMALL], 2)
    rows = list(final_rows(out).values())
    assert len(rows) == 2
    for row in rows:
        spent = sum(phase.get("cpu_s") or 0 for phase in row["metered"].values())
        assert spent >= INGEST_CPU + RETRIEVE_CPU, row["metered"]


@pytest.mark.parametrize("how", ["run", "unreaped", "orphan"])
def test_cpu_a_plugin_spends_in_child_processes_is_charged_to_its_cells(tmp_path, how):
    """Old code read the worker's own clock only: work done in a subprocess, a multiprocessing
    pool or a detached daemon cost nothing in the ledger."""
    out = tmp_path / "run"
    with FaultServer() as server:
        ledger_run(server, out, ["cpu-child-work"], [SMALL], 2, {"cpu-child-work": {"how": how}})
    rows = list(final_rows(out).values())
    assert [r["event"] for r in rows] == ["result", "result"], rows
    for row in rows:
        assert row["metered"]["aux"]["cpu_s"] >= CHILD_CPU * 0.9, row["metered"]


def recomputed(out) -> dict[tuple[str, int], dict[str, float]]:
    """Per cell from the raw events: questions, write tokens per item, and every other token."""
    cells: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    writes: dict[str, float] = defaultdict(float)
    for row in final_rows(out).values():
        cell = cells[(row["strategy"], row["budget"])]
        cell["questions"] += row["event"] in ("result", "violation")
        if row["event"] == "result":
            cell["other"] += row["prompt_tokens"] + row["completion_tokens"]
    for event in iter_events(out):
        if event["event"] == "metered_call" and event["kind"] == "call" and event["ok"]:
            tokens = event["input_tokens"] + event["completion_tokens"]
            if event["phase"] == "write":
                writes[event["item_id"]] += tokens
            else:
                cells[(event["strategy"], event["budget"])]["other"] += tokens
        if event["event"] == "aux_call" and event["sent"]:
            cells[(event["strategy"], event["budget"])]["other"] += event["prompt_tokens"] + (
                event["completion_tokens"] or 0
            )
    for (strategy, _), cell in cells.items():
        if strategy == "cpu-notes-memory":
            cell["write"] = sum(writes.values())  # every item is asked in every cell
    return cells


def test_write_cost_is_recorded_once_per_item_and_amortised_per_question(memory_run):
    """Old code: the write tokens counted only in the tier that happened to ingest, and the
    other tier's questions looked free of them."""
    out, _, ledger = memory_run
    expected = recomputed(out)
    write_calls = sum(ledger[("cpu-notes-memory", b)]["metered_write_calls"] for b in (SMALL, LARGE))
    assert write_calls == sum(
        1 for e in iter_events(out) if e["event"] == "metered_call" and e["phase"] == "write" and e["ok"]
    )
    assert write_calls >= ITEMS  # recorded once per session of each item, in one tier only
    for key, row in ledger.items():
        figures = expected[key]
        assert row["questions"] == figures["questions"] == ITEMS
        assert row["write_share_per_question"] == pytest.approx(figures["write"] / ITEMS)
        assert row["tokens_per_question"] == pytest.approx((figures["other"] + figures["write"]) / ITEMS), key
    small, large = ledger[("cpu-notes-memory", SMALL)], ledger[("cpu-notes-memory", LARGE)]
    assert small["write_share_per_question"] == large["write_share_per_question"] > 0
    assert small["write_items"] == large["write_items"] == ITEMS


def test_break_even_against_full_context_where_full_context_fits(memory_run):
    out, rows, ledger = memory_run
    expected = recomputed(out)
    full = [r for key, r in rows.items() if key[0] == "full_context"]
    assert {r["event"] for r in full if r["budget"] == LARGE} == {"result"}
    assert {r["event"] for r in full if r["budget"] == SMALL} == {"violation"}
    large = ledger[("cpu-notes-memory", LARGE)]
    q_full = expected[("full_context", LARGE)]["other"] / ITEMS
    q_memory = expected[("cpu-notes-memory", LARGE)]["other"] / ITEMS
    write = expected[("cpu-notes-memory", LARGE)]["write"] / ITEMS
    assert q_memory < q_full
    assert large["break_even_questions"] == max(1, math.ceil(write / (q_full - q_memory)))
    assert large["break_even_items"] == ITEMS
    small = ledger[("cpu-notes-memory", SMALL)]
    assert small["break_even_questions"] is None and small["break_even_note"] == "full context fits no item"
    assert "break_even_items" not in ledger[("truncation", LARGE)]  # no write cost: nothing to amortise
    markdown = "\n".join(ledger_markdown(list(ledger.values()), None))
    assert "worker CPU s (write / read / other)" in markdown
    assert f"| cpu-notes-memory | {LARGE} | {ITEMS} | {large['break_even_questions']} |" in markdown


def table_cells(html: str, table_id: str) -> dict[tuple[str, int], list[str]]:
    """(strategy, budget) -> the texts of that row's cells in the HTML table ``table_id``."""
    body = html.split(f'id="{table_id}"')[1].split("</table>")[0]
    rows = {}
    for line in body.split("<tr>")[1:]:
        texts = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", line)]
        if texts:
            rows[(texts[1], int(texts[2]))] = texts
    return rows


def test_markdown_and_html_show_the_ledgers_own_figures(memory_run):
    """Old code: the report's ledger had no write share, worker CPU or break-even columns."""
    out, _, ledger = memory_run
    markdown = (out / "report" / "report.md").read_text()
    html = (out / "report" / "index.html").read_text()
    shown = table_cells(html, "ledger")
    assert set(shown) == set(ledger)
    for key, row in ledger.items():
        cpu = (
            f"{fmt_figure(row['worker_cpu_s'])} ("
            + " / ".join(fmt_figure(row[f"worker_cpu_{label}_s"]) for label in ("write", "read", "other"))
            + ")"
        )
        assert shown[key][9:12] == [
            fmt_figure(row["write_share_per_question"]),
            fmt_figure(row["tokens_per_question"]),
            cpu,
        ]
        md_row = f"| {fmt_figure(row['write_share_per_question'])} | {fmt_figure(row['tokens_per_question'])} | {cpu} |"
        assert f"| {key[0]} | {key[1]} | {row['questions']} |" in markdown and md_row in markdown, key
    memory = ledger[("cpu-notes-memory", LARGE)]
    assert memory["worker_cpu_write_s"] is not None and memory["write_share_per_question"] > 0
    even = table_cells(html, "break-even")
    assert set(even) == {("cpu-notes-memory", SMALL), ("cpu-notes-memory", LARGE)}
    for key, texts in even.items():
        assert texts[3:] == [
            str(ledger[key]["break_even_items"]),
            fmt_figure(ledger[key]["break_even_questions"]),
            ledger[key]["break_even_note"],
        ]
    assert f"| {ledger[('cpu-notes-memory', SMALL)]['break_even_note']} |" in markdown
    assert 'id="outside-hosts"' not in html  # no plugin reached an outside service
