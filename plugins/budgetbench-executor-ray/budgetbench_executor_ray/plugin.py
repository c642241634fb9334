"""``--executor ray``: units run as Ray tasks; the driver alone writes the run directory.

Each unit (one strategy on one item) is one Ray task. A worker process builds the run's
strategies, tokenizer and backend once (from the spec the driver puts in the object store)
and keeps them for every unit it is given, calls the model itself, and returns the unit's
rows and replies; the driver writes them to the event log and the response cache. A task
whose worker or node dies is retried by Ray (``max_retries``): nothing of it had been
written, so a unit is never half-recorded. A unit that still cannot finish becomes error
rows (phase ``executor``) that a resumed run retries.

Replies are shared across the cluster by a second actor: a worker asks it before any model
call and tells it every reply, and while one worker is getting a reply the others asking for
it wait, so a Ray run asks the model no more than a thread run does (a call in flight on a
worker that dies is asked again by the unit's retry). Both actors live on the driver's node.

Model connections are limited per model across the whole cluster by one small actor
holding ``-j`` leases per model. A holder renews its lease every few seconds while its call
runs; the lease of a worker that died expires within ``LEASE_TTL_S``, so a lost worker cannot
starve the others.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from typing import Any, ClassVar

from budgetbench_core import Executor, Job, SharedReplies, Unit, hookimpl

LEASE_TTL_S = 10.0  # a lease not renewed for this long is free again (its holder died)
RENEW_S = 2.0


def _ray():
    import ray

    return ray


def _limiter_class():
    ray = _ray()

    @ray.remote(num_cpus=0)
    class Limiter:
        """``capacity`` leases per model key; asyncio so waiting holders do not block releases."""

        def __init__(self, capacity: int) -> None:
            self.capacity = max(1, capacity)
            self.lease_s = LEASE_TTL_S
            self.leases: dict[str, dict[int, float]] = {}
            self.ids = itertools.count()
            self.changed = asyncio.Condition()
            self.peak: dict[str, int] = {}

        def _expire(self, key: str) -> dict[int, float]:
            held = self.leases.setdefault(key, {})
            moment = time.monotonic()
            for lease, expires in list(held.items()):
                if expires <= moment:
                    del held[lease]  # its holder died (or hung past every deadline)
            return held

        async def acquire(self, key: str) -> int:
            async with self.changed:
                while True:
                    held = self._expire(key)
                    if len(held) < self.capacity:
                        lease = next(self.ids)
                        held[lease] = time.monotonic() + self.lease_s
                        self.peak[key] = max(self.peak.get(key, 0), len(held))
                        return lease
                    soonest = min(held.values()) - time.monotonic()
                    try:
                        await asyncio.wait_for(self.changed.wait(), timeout=max(0.01, soonest))
                    except TimeoutError:
                        pass

        async def renew(self, key: str, lease: int) -> None:
            held = self.leases.get(key, {})
            if lease in held:
                held[lease] = time.monotonic() + self.lease_s

        async def release(self, key: str, lease: int) -> None:
            async with self.changed:
                self.leases.get(key, {}).pop(lease, None)
                self.changed.notify_all()

        async def peaks(self) -> dict[str, int]:
            return dict(self.peak)

    return Limiter


def _reply_store_class():
    ray = _ray()

    @ray.remote(num_cpus=0)
    class ReplyStore:
        """The run's replies for every worker; one ``claim`` of a key at a time gets None (it
        calls the model), the others wait for its ``put``. A claimant that never puts (its call
        failed, its worker died) is replaced after ``wait_s``."""

        def __init__(self, wait_s: float) -> None:
            self.wait_s = wait_s
            self.replies: dict[str, Any] = {}
            self.getting: dict[str, asyncio.Event] = {}

        async def claim(self, key: str) -> Any:
            while key not in self.replies:
                getting = self.getting.get(key)
                if getting is None:
                    self.getting[key] = asyncio.Event()
                    return None
                try:
                    await asyncio.wait_for(getting.wait(), timeout=self.wait_s)
                except TimeoutError:
                    if self.getting.get(key) is getting:
                        del self.getting[key]  # the next pass claims it for this caller
            return self.replies[key]

        async def put(self, key: str, completion: Any) -> None:
            self.replies[key] = completion
            getting = self.getting.pop(key, None)
            if getting is not None:
                getting.set()

    return ReplyStore


class _Replies(SharedReplies):
    """``SharedReplies`` through the run's ``ReplyStore`` actor."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def claim(self, key: str) -> Any:
        return _ray().get(self.store.claim.remote(key))

    def put(self, key: str, completion: Any) -> None:
        _ray().get(self.store.put.remote(key, completion))


class _Slot:
    """One lease of the cluster-wide limiter, held (and renewed) around one model call."""

    def __init__(self, limiter: Any, key: str) -> None:
        self.limiter = limiter
        self.key = key

    def __enter__(self) -> None:
        self.lease = _ray().get(self.limiter.acquire.remote(self.key))
        self.done = threading.Event()
        threading.Thread(target=self._renew, daemon=True, name="lease-renewal").start()

    def _renew(self) -> None:
        while not self.done.wait(RENEW_S):
            self.limiter.renew.remote(self.key, self.lease)

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.limiter.release.remote(self.key, self.lease)


_WORKERS: dict[str, Any] = {}


def _run_unit(spec: Any, strategy: str, item: Any, todo: list, limiter: Any, store: Any) -> Any:
    """The Ray task: build (or reuse) this process's worker for the run, run one unit."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    worker = _WORKERS.get(spec.key)
    if worker is None:
        _WORKERS.clear()  # a long-lived worker process keeps only the current run's strategies
        worker = _WORKERS[spec.key] = spec.build()
    return worker.run(Unit(strategy, item, list(todo)), slots=lambda key: _Slot(limiter, key), replies=_Replies(store))


class RayExecutor(Executor):
    """Units as Ray tasks on a local or remote cluster."""

    name = "ray"
    description = "Units as Ray tasks on a local or remote Ray cluster (budgetbench-executor-ray)"
    options: ClassVar[dict[str, str]] = {
        "address": "Ray cluster to join: 'auto' (the running one, or RAY_ADDRESS) or host:port. "
        "Default: start a local cluster for the run.",
        "cpus": "CPUs of the local cluster started for the run (default: all of this machine's).",
        "retries": "How often a unit whose worker or node died is run again (default 3).",
        "unit_cpus": "CPUs Ray reserves for one unit (default 1). Below 1 (0.25) several units share a CPU: "
        "for runs that wait on the model rather than compute in the strategy.",
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        checks = {"cpus": (int, 1), "retries": (int, 0), "unit_cpus": (float, 0.01)}
        for key, (kind, least) in checks.items():
            if options.get(key) is None:
                continue
            try:
                value = kind(options[key])
            except (TypeError, ValueError):
                value = None
            if value is None or value < least:
                raise ValueError(
                    f"--ray-{key.replace('_', '-')} must be a number of at least {least}, got {options[key]!r}"
                )
            self.settings[key] = value  # the command line gives text

    def execute(self, job: Job) -> None:
        ray = _ray()
        started_here = not ray.is_initialized()
        if started_here:
            address = self.settings.get("address")
            common = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": logging.WARNING,
                "configure_logging": True,
            }
            if address:
                ray.init(address=address, **common)
            else:
                cpus = self.settings.get("cpus")
                # a cluster of this machine only: every connection on loopback
                ray.init(num_cpus=cpus, _node_ip_address="127.0.0.1", **common)
        try:
            self._execute(ray, job)
        finally:
            if started_here:
                ray.shutdown()

    def _execute(self, ray: Any, job: Job) -> None:
        retries = self.settings.get("retries", 3)
        # the limiter and the replies live on the driver's node: a lost worker node takes neither
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        limiter = _limiter_class().options(scheduling_strategy=here).remote(job.max_concurrency)
        store = _reply_store_class().options(scheduling_strategy=here).remote(2 * job.timeout_s)
        unit_cpus = self.settings.get("unit_cpus", 1.0)
        run_unit = ray.remote(num_cpus=unit_cpus, max_retries=retries, retry_exceptions=False)(_run_unit)
        spec = ray.put(job.worker_spec())
        slots = ray.cluster_resources().get("CPU", 1) / unit_cpus
        window = max(2, int(2 * slots))  # units Ray can run at once, twice: none idles while the driver records
        in_flight: dict[Any, Unit] = {}
        items: dict[str, tuple[Any, int]] = {}  # item id -> (object ref, units in flight): one copy per item
        units = iter(job.units)
        exhausted = False
        try:
            while True:
                while not exhausted and not job.stop.is_set() and len(in_flight) < window:
                    unit = next(units, None)
                    if unit is None:
                        exhausted = True
                        break
                    ref, count = items.get(unit.item.id) or (ray.put(unit.item), 0)
                    items[unit.item.id] = (ref, count + 1)
                    in_flight[run_unit.remote(spec, unit.strategy, ref, unit.todo, limiter, store)] = unit
                if not in_flight:
                    return
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
                for done in ready:
                    unit = in_flight.pop(done)
                    ref, count = items[unit.item.id]
                    if count == 1:
                        del items[unit.item.id]
                    else:
                        items[unit.item.id] = (ref, count - 1)
                    try:
                        outcome = ray.get(done)
                    except ray.exceptions.RayTaskError as exc:
                        raise RuntimeError(
                            f"the Ray worker failed outside every contained plugin call on unit "
                            f"({unit.strategy!r}, {unit.item.id!r}): {exc}"
                        ) from exc
                    except ray.exceptions.RayError as exc:  # worker, node or object lost after every retry
                        job.record_lost(
                            unit,
                            f"Ray lost the worker running this unit {retries + 1} times: "
                            f"{type(exc).__name__}: {str(exc)[:300]}",
                        )
                        continue
                    job.record(unit, outcome)
                if job.stop.is_set() and not exhausted:
                    exhausted = True  # stop taking units; the ones in flight still finish and are recorded
        except BaseException:
            job.stop.set()
            for ref in in_flight:
                ray.cancel(ref, force=True)  # their rows are discarded: a resume runs them again
            raise


@hookimpl
def register_executors(register):
    register(RayExecutor)
