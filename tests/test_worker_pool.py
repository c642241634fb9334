"""The plugin host's workers are leased per unit, so their number follows the work, not -j.

A unit leases a worker of its strategy while it builds its prompts and gives it back before
its model calls; the next unit, on any thread, resets and reuses it. One worker per executor
thread (the old pool) would start -j processes whatever the work.
"""

from __future__ import annotations

import json
import threading

from budgetbench_core import RunConfig, run
from budgetbench_core.host.pool import GROW_AFTER_S, PluginHost
from budgetbench_core.plugins import Registry
from budgetbench_core.runlog import iter_events
from budgetbench_core.testing import FaultServer, tokenizer_for

SOURCE = {"entry_points": Registry.discover().entry_points_for("strategy", "truncation")}


def host_for(tmp_path, max_workers: int) -> PluginHost:
    return PluginHost(
        tokenizer_for("tiktoken:cl100k_base").info.to_dict(), tmp_path / "workers", max_workers=max_workers
    )


def lease(host: PluginHost):
    return host.lease("truncation", {}, 0.0, SOURCE)


def test_a_worker_given_back_serves_the_next_unit_on_another_thread(tmp_path):
    host = host_for(tmp_path, max_workers=4)
    try:
        first = lease(host)
        pid = first.worker.process.pid
        host.give_back(first)
        got = []
        thread = threading.Thread(target=lambda: got.append(lease(host)))
        thread.start()
        thread.join(30)
        assert got and got[0].worker.process.pid == pid
        assert host.spawned == {"truncation": 1}
    finally:
        host.close()


def test_no_more_workers_than_max_and_a_waiting_unit_gets_the_next_one_given_back(tmp_path):
    host = host_for(tmp_path, max_workers=2)
    try:
        first, second = lease(host), lease(host)  # the second waited GROW_AFTER_S, then started one
        assert first.worker.process.pid != second.worker.process.pid
        got = []
        waiting = threading.Thread(target=lambda: got.append(lease(host)))
        waiting.start()
        waiting.join(GROW_AFTER_S * 5)
        assert waiting.is_alive() and not got  # at the limit: it waits, it starts none
        host.give_back(first)
        waiting.join(30)
        assert got and got[0] is first
        assert host.spawned == {"truncation": 2}
    finally:
        host.close()


def test_a_discarded_or_dead_worker_is_replaced_and_never_handed_out(tmp_path):
    host = host_for(tmp_path, max_workers=1)
    try:
        first = lease(host)
        host.discard(first)  # missed its deadline: killed
        assert not first.worker.alive()
        second = lease(host)  # the limit counts live workers only
        assert second.worker.alive() and second is not first
        host.give_back(second)
        second.worker.process.kill()  # dies while idle
        second.worker.process.wait()
        third = lease(host)
        assert third.worker.alive() and third is not second
        assert host.spawned == {"truncation": 3}
    finally:
        host.close()


def run_against(server: FaultServer, tmp_path, items: int, budgets: list[int], concurrency: int):
    out = tmp_path / "run"
    summary = run(
        RunConfig(
            task="synthetic-memory",
            strategies=["truncation"],
            budgets=budgets,
            out=out,
            api_base=server.url,
            model="openai/fault-model",
            tokenizer="tiktoken:cl100k_base",
            task_options={"items": items, "history_tokens": 400},
            max_concurrency=concurrency,
            retries=0,
            timeout_s=30.0,
        )
    )
    return out, summary


def test_a_run_starts_fewer_workers_than_threads_when_units_mostly_wait_on_the_model(tmp_path):
    with FaultServer(latency_s=0.3) as server:
        out, summary = run_against(server, tmp_path, items=36, budgets=[200, 300], concurrency=12)
    assert summary.results == 72
    workers = json.loads((out / "manifest.json").read_text())["invocations"][-1]["plugin_workers"]
    # one per thread would be 12 (and one more for the manifest's description); building two
    # prompts takes milliseconds against 0.6 s of model calls per unit
    assert 1 <= workers["truncation"] <= 8, workers


def test_a_unit_builds_every_prompt_before_its_first_model_call(tmp_path):
    with FaultServer(latency_s=0.3) as server:
        out, summary = run_against(server, tmp_path, items=2, budgets=[200, 300, 400], concurrency=1)
    assert summary.results == 6
    times: dict[str, dict[str, list[str]]] = {}
    for row in iter_events(out):
        if row["event"] in ("prompt_audit", "result"):
            times.setdefault(row["item_id"], {}).setdefault(row["event"], []).append(row["time"])
    for item, kinds in times.items():
        assert len(kinds["prompt_audit"]) == 3 and len(kinds["result"]) == 3
        assert max(kinds["prompt_audit"]) < min(kinds["result"]), (item, kinds)
