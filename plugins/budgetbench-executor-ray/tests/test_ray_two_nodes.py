"""The Ray executor on a two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), the
plugin host running in the Ray workers (``isolation='process'``, as any run), against the
deterministic loopback server: the same rows and the same requests as the thread run, also when
the worker node is removed while one of its units waits for a model call (the call is made on the
driver's node, so its reply is kept and the unit's rerun gets it).

Before the node is removed, an actor holds the head node's CPU: every unit then runs on the worker
node, so a request the server holds is always that node's. The node is removed while the server
holds one, and the actor lets the head's CPU go, where the lost unit runs again.

Every node listens on the machine's own non-loopback address (Ray's default, and where
``ray.init(address=...)`` connects: it rewrites ``127.0.0.1`` to that address). A head started on
``127.0.0.1`` cannot be joined from a driver (the driver dials the rewritten address and times out
reaching the GCS), so the cluster is not started that way.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from budgetbench_core import RunConfig, iter_events, read_manifest, run
from budgetbench_core.testing import FaultServer, comparable_rows

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

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
NODE = dict(num_cpus=1, object_store_memory=80 * 1024 * 1024)


class InFlightServer(FaultServer):
    """Also knows how many requests it holds at this moment."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.inflight = 0
        self._count_lock = threading.Lock()

    def _handle(self, handler) -> None:
        with self._count_lock:
            self.inflight += 1
        try:
            super()._handle(handler)
        finally:
            with self._count_lock:
                self.inflight -= 1


def hold_the_cpu_of(node_id: str):
    """An actor holding the one CPU of ``node_id`` until it is killed."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    ray.get(holder.ready.remote())
    return holder


def terminal_counts(run_dir) -> Counter:
    return Counter(
        (e["strategy"], e["budget"], e["repeat"], e["item_id"])
        for e in iter_events(run_dir)
        if e["event"] in ("result", "violation", "error")
    )


def busy_units(node) -> list:
    """The worker processes of ``node`` (a Cluster node) running a unit."""
    import psutil

    def command_line(process: psutil.Process) -> str:
        try:
            return " ".join(process.cmdline())
        except psutil.Error:  # it ended, or is a zombie, between listing and asking
            return ""

    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    return [p for p in raylet.children(recursive=True) if "_run_unit" in command_line(p)]


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    started = time.monotonic()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        worker = cluster.add_node(**NODE)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        cluster.wait_for_nodes()
        print(f"cluster start: {time.monotonic() - started:.1f} s")
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def threads(tmp_path_factory):
    out = tmp_path_factory.mktemp("threads") / "run"
    with FaultServer() as server:
        started = time.monotonic()
        run(RunConfig(out=out, api_base=server.url, **SETTINGS))
        print(f"threads: {time.monotonic() - started:.1f} s")
        asked = Counter(r.body_hash for r in server.requests)
    return comparable_rows(out), asked


@pytest.mark.slow
def test_two_nodes_give_the_thread_rows_and_calls_also_after_the_worker_node_is_removed(tmp_path, two_nodes, threads):
    cluster, worker = two_nodes
    reference, thread_asked = threads
    assert len(reference) == 2 * 8 * 2 and max(thread_asked.values()) == 1
    head_id = ray.get_runtime_context().get_node_id()
    assert head_id == cluster.head_node.node_id != worker.node_id  # the driver (and the run's actor) on the head
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2

    # both nodes, nothing removed: the thread run's rows and its requests, each asked once
    with FaultServer(latency_s=0.05) as server:
        started = time.monotonic()
        summary = run(RunConfig(out=tmp_path / "both", api_base=server.url, executor="ray", **SETTINGS))
        print(f"two nodes: {time.monotonic() - started:.1f} s")  # figures for docs/scaling.md (pytest -s)
        asked = Counter(r.body_hash for r in server.requests)
    assert comparable_rows(tmp_path / "both") == reference
    assert summary.errors == 0 and max(terminal_counts(tmp_path / "both").values()) == 1
    assert asked == thread_asked
    assert read_manifest(tmp_path / "both")["calls_made"] == sum(asked.values())

    # the worker node removed while a unit of it waits for a reply (its raylet and workers killed)
    removed: dict[str, object] = {}
    holder = hold_the_cpu_of(head_id)  # every unit on the worker node until it is removed
    with InFlightServer(latency_s=1.0) as server:  # a reply takes long enough to remove the node meanwhile
        done = threading.Event()

        def remove_when_busy() -> None:
            while not done.is_set():
                held = server.inflight  # requests the server holds now (-j 1: one at most), the worker node's
                if len(server.requests) >= 6 and held and busy_units(worker):
                    removed["in_flight"] = held
                    removed["requests_before"] = len(server.requests)
                    try:
                        cluster.remove_node(worker, allow_graceful=False)
                        removed["at_s"] = time.monotonic() - started
                    finally:
                        ray.kill(holder)  # the head's CPU, where the lost unit runs again
                    return
                time.sleep(0.02)

        remover = threading.Thread(target=remove_when_busy, daemon=True)
        started = time.monotonic()
        remover.start()
        try:
            summary = run(RunConfig(out=tmp_path / "removed", api_base=server.url, executor="ray", **SETTINGS))
        finally:
            done.set()
            remover.join()
        print(f"node removed at {removed.get('at_s', 0):.1f} s; run {time.monotonic() - started:.1f} s")
        asked = Counter(r.body_hash for r in server.requests)
    assert removed, "the worker node never ran a unit"
    assert removed["requests_before"] < sum(thread_asked.values()), "removed after the last request"
    assert removed["in_flight"] == 1, removed  # a call was in flight when the node went
    assert [n["Alive"] for n in ray.nodes() if n["NodeID"] == worker.node_id] == [False]
    assert comparable_rows(tmp_path / "removed") == reference  # nothing lost
    assert summary.errors == 0 and max(terminal_counts(tmp_path / "removed").values()) == 1  # nothing twice
    totals = (sum(asked.values()), sum(thread_asked.values()))
    assert asked == thread_asked, f"{totals[0]} requests where threads made {totals[1]}"  # no extra model call
    # counted where the calls were made: the lost unit's calls too (old code: one short)
    assert read_manifest(tmp_path / "removed")["calls_made"] == totals[0]
