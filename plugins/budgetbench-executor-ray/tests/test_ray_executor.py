"""The Ray executor on a local 2-CPU cluster (loopback, no dashboard) against a loopback server.

The server is the deterministic FaultServer (no faults), counted with tiktoken:cl100k_base,
so the thread executor, the Ray executor and three shards merged must give the same rows.
It also counts the requests it holds at once: ``-j`` is a limit for the whole cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, iter_events, read_manifest, run
from budgetbench_core.testing import FaultServer, comparable_rows, invoke_cli

ray = pytest.importorskip("ray")

SETTINGS = dict(
    task="synthetic-memory",
    strategies=["truncation", "recency"],
    budgets=[60, 400],
    task_options={"items": 8, "history_tokens": 600},
    seed=11,
    max_concurrency=1,
    retries=0,
    timeout_s=20.0,
    tokenizer="tiktoken:cl100k_base",
    model="openai/fault-model",
)
BUDGETBENCH = Path(sys.executable).with_name("budgetbench")


class CountingServer(FaultServer):
    """Also records the most requests it held at once."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.inflight = self.peak = 0
        self._count_lock = threading.Lock()

    def _handle(self, handler) -> None:
        with self._count_lock:
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
        try:
            super()._handle(handler)
        finally:
            with self._count_lock:
                self.inflight -= 1


def terminal_counts(run_dir: Path) -> Counter:
    return Counter(
        (e["strategy"], e["budget"], e["repeat"], e["item_id"])
        for e in iter_events(run_dir)
        if e["event"] in ("result", "violation", "error")
    )


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "threads"
    with CountingServer() as server:
        run(RunConfig(out=out, api_base=server.url, **{**SETTINGS, "max_concurrency": 2}))
    return comparable_rows(out)


@pytest.mark.slow
def test_thread_ray_and_three_shards_merged_give_the_same_rows(tmp_path, cluster, reference):
    assert len(reference) == 2 * 8 * 2
    with CountingServer(latency_s=0.05) as server:
        summary = run(RunConfig(out=tmp_path / "ray", api_base=server.url, executor="ray", **SETTINGS))
        peak = server.peak
        requests = len(server.requests)
    assert comparable_rows(tmp_path / "ray") == reference
    assert summary.results + summary.violations == len(reference) and summary.errors == 0
    assert peak == 1, "-j 1 holds across both Ray workers"
    manifest = read_manifest(tmp_path / "ray")
    assert manifest["config"]["executor"] == "ray" and manifest["calls_made"] == requests
    assert max(terminal_counts(tmp_path / "ray").values()) == 1
    with FaultServer() as server:
        shards = []
        for index in (1, 2, 3):
            shards.append(tmp_path / f"shard{index}")
            run(RunConfig(out=shards[-1], api_base=server.url, shard=f"{index}/3", executor="ray", **SETTINGS))
    merged = invoke_cli("merge", *map(str, shards), "--out", str(tmp_path / "merged"))  # the public way to merge
    assert merged.exit_code == 0, merged.output
    assert comparable_rows(tmp_path / "merged") == reference


@pytest.mark.slow
def test_a_lost_worker_unit_is_rerun_never_half_recorded(tmp_path, cluster, reference):
    """Kill the busy Ray worker processes (this test's own cluster) while their units wait on the server."""
    import psutil

    def command_line(process: psutil.Process) -> str:
        try:
            return " ".join(process.cmdline())
        except psutil.Error:  # it ended, or is a zombie, between listing and asking (Ray recycles workers)
            return ""

    def busy_workers() -> list[psutil.Process]:
        return [p for p in psutil.Process().children(recursive=True) if "_run_unit" in command_line(p)]

    killed: list[int] = []
    with CountingServer(latency_s=0.3) as server:
        done = threading.Event()

        def killer() -> None:
            while not done.is_set() and len(killed) < 2:
                if len(server.requests) >= 3 + 4 * len(killed):
                    for process in busy_workers()[:1]:
                        killed.append(process.pid)
                        process.send_signal(signal.SIGKILL)
                time.sleep(0.05)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            run(RunConfig(out=tmp_path / "ray", api_base=server.url, executor="ray", **SETTINGS))
        finally:
            done.set()
            thread.join()
    assert killed, "no busy worker was found to kill"
    assert comparable_rows(tmp_path / "ray") == reference
    assert max(terminal_counts(tmp_path / "ray").values()) == 1


@pytest.mark.slow
def test_driver_killed_mid_way_resumes_to_the_same_rows(tmp_path, reference):
    """SIGKILL the `budgetbench run --executor ray` process (its own local cluster goes with it)."""
    out = tmp_path / "killed"
    with FaultServer(latency_s=0.1) as server:
        command = [
            str(BUDGETBENCH),
            "run",
            "-t",
            SETTINGS["task"],
            "-b",
            "60 400",
            "-m",
            SETTINGS["model"],
            "--api-base",
            server.url,
            "--tokenizer",
            SETTINGS["tokenizer"],
            "--seed",
            str(SETTINGS["seed"]),
            "-j",
            "1",
            "--retries",
            "0",
            "--timeout",
            "20",
            "-o",
            str(out),
            "--no-report",
            "--no-preflight",
            "--display",
            "none",
            "--executor",
            "ray",
            "--ray-cpus",
            "2",
            "-s",
            "truncation",
            "-s",
            "recency",
            "--task-option",
            "items=8",
            "--task-option",
            "history_tokens=600",
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
        deadline = time.monotonic() + 240
        while len(server.requests) < 10 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        partial = terminal_counts(out)
        assert len(partial) < len(reference), "the kill came after the run had finished"
        resumed = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert comparable_rows(out) == reference
    assert max(terminal_counts(out).values()) == 1
    invocations = read_manifest(out)["invocations"]
    assert len(invocations) == 2 and invocations[0]["finished"] is None


@pytest.mark.slow
def test_a_run_starts_a_cluster_of_its_own_beside_one_already_running(tmp_path):
    """Old code called ``ray.init`` without an address, which joins the newest Ray instance on the
    machine (another run's, a test's): with ``--ray-cpus`` the run refused to start ("When
    connecting to an existing cluster, num_cpus and num_gpus must not be provided")."""
    from ray import cluster_utils

    other = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        out = tmp_path / "own"
        with FaultServer() as server:
            finished = subprocess.run(
                [
                    *(str(BUDGETBENCH), "run", "-t", SETTINGS["task"], "-s", "truncation", "-b", "400"),
                    *("-m", SETTINGS["model"], "--api-base", server.url, "--tokenizer", SETTINGS["tokenizer"]),
                    *("--task-option", "items=2", "--task-option", "history_tokens=600", "-o", str(out)),
                    *("--no-report", "--no-preflight", "--display", "none", "--executor", "ray", "--ray-cpus", "1"),
                ],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            )
        assert finished.returncode == 0, finished.stderr[-2000:]
        assert len(terminal_counts(out)) == 2
    finally:
        other.shutdown()


@pytest.mark.slow
def test_a_ray_run_asks_the_model_nothing_a_thread_run_does_not(tmp_path, cluster):
    """At a budget every strategy fits whole, the strategies send the same prompt for an item:
    a thread run asks it once (one cache), and so must the Ray workers (the shared replies)."""
    same = {**SETTINGS, "strategies": ["truncation", "recency", "full_context"], "budgets": [2000]}
    with CountingServer() as server:
        run(RunConfig(out=tmp_path / "threads", api_base=server.url, **{**same, "max_concurrency": 1}))
        thread_requests = Counter(r.body_hash for r in server.requests)
    assert max(thread_requests.values()) == 1 and sum(thread_requests.values()) == 8  # one prompt per item
    with CountingServer(latency_s=0.2) as server:
        summary = run(RunConfig(out=tmp_path / "ray", api_base=server.url, executor="ray", **same))
        ray_requests = Counter(r.body_hash for r in server.requests)
    assert ray_requests == thread_requests, "a reply one worker had was asked again by another"
    assert summary.results == 3 * 8 and summary.model_calls == 8
    assert comparable_rows(tmp_path / "ray") == comparable_rows(tmp_path / "threads")
