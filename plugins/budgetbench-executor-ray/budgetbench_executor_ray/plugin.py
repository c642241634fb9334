"""``--executor ray``: units run as Ray tasks; the driver alone writes the run directory.

Each unit (one strategy on one item) is one Ray task. A worker process builds the run's
strategies, tokenizer and backend once (from the spec the driver puts in the object store)
and keeps them for every unit it is given, and returns the unit's rows and replies; the
driver writes them to the event log and the response cache. A task whose worker or node
dies is retried by Ray (``max_retries``): nothing of it had been written, so a unit is never
half-recorded. A unit that still cannot finish becomes error rows (phase ``executor``) that a
resumed run retries.

The model is called from the driver's node, never from a worker: the worker counts, gates
and audits each prompt as in any run, then hands the call to one ``Caller`` actor pinned to
the driver's node. The actor makes the run's calls with the run's callers (one cache, one
request per prompt at a time, ``-j`` connections, retries, ``--timeout``), so a worker or
node lost mid-call loses no reply: the call goes on, its reply is kept, and the unit's rerun
gets it instead of asking the model again. The actor's backends read API keys from the
environment of the driver's node (the driver's own when the run starts the cluster); no key
is sent through Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, ClassVar

from budgetbench_core import CallReply, CallRequest, DriverCalls, Executor, Job, Unit, hookimpl

CALLS_AT_ONCE = 64  # actor threads: calls waiting for a connection or a reply hold one each


def _ray():
    import ray

    return ray


def _caller_class():
    ray = _ray()

    @ray.remote(num_cpus=0, max_restarts=0)
    class Caller:
        """The run's model calls for every worker, made on the driver's node (a threaded actor:
        one call per thread, ``-j`` of them sending at once)."""

        def __init__(self, spec: Any) -> None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            self.desk = spec.call_desk()

        def call(self, request: CallRequest) -> CallReply:
            return self.desk.call(request)

        def calls_made(self) -> int:
            return self.desk.calls_made()

    return Caller


class _ByActor(DriverCalls):
    """``DriverCalls`` through the run's ``Caller`` actor."""

    def __init__(self, caller: Any) -> None:
        self.caller = caller

    def call(self, request: CallRequest) -> CallReply:
        return _ray().get(self.caller.call.remote(request))

    def calls_made(self) -> int:
        return _ray().get(self.caller.calls_made.remote())


_WORKERS: dict[str, Any] = {}


def _run_unit(spec: Any, strategy: str, item: Any, todo: list, caller: Any) -> Any:
    """The Ray task: build (or reuse) this process's worker for the run, run one unit."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    worker = _WORKERS.get(spec.key)
    if worker is None:
        _WORKERS.clear()  # a long-lived worker process keeps only the current run's strategies
        worker = _WORKERS[spec.key] = spec.build()
    return worker.run(Unit(strategy, item, list(todo)), calls=_ByActor(caller))


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
                # a cluster of this machine only, new for the run (not the newest one already running
                # here, which "no address" would join): every connection on loopback
                ray.init(address="local", num_cpus=cpus, _node_ip_address="127.0.0.1", **common)
        try:
            self._execute(ray, job)
        finally:
            if started_here:
                ray.shutdown()

    def _execute(self, ray: Any, job: Job) -> None:
        retries = self.settings.get("retries", 3)
        # the model is called on the driver's node: a lost worker node loses no call
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        spec = ray.put(job.worker_spec())
        caller = _caller_class().options(scheduling_strategy=here, max_concurrency=CALLS_AT_ONCE).remote(spec)
        unit_cpus = self.settings.get("unit_cpus", 1.0)
        run_unit = ray.remote(num_cpus=unit_cpus, max_retries=retries, retry_exceptions=False)(_run_unit)
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
                    in_flight[run_unit.remote(spec, unit.strategy, ref, unit.todo, caller)] = unit
                if not in_flight:
                    break
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
            # the count, if the actor can still give it; if the actor is what failed, the error
            # raised is the run's own, not the lost count's
            with contextlib.suppress(ray.exceptions.RayError):
                job.record_desk_calls(_ByActor(caller).calls_made())
            raise
        job.record_desk_calls(_ByActor(caller).calls_made())  # every call the actor made, a lost unit's included


@hookimpl
def register_executors(register):
    register(RayExecutor)
