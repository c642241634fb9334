"""The run's plugin workers: per strategy, a pool that grows with the units that need one.

One worker holds one strategy instance (never two plugins in one process, so rival memory
layers cannot reach each other). A unit leases a worker of its strategy while it builds its
prompts (reset, then every budget tier, so per-item state survives between tiers) and gives
it back before its model calls; the next unit of that strategy, on any thread, resets and
reuses it. A worker is spawned when a strategy has none, or when a unit has waited
``GROW_AFTER_S`` for one to be given back, at most ``spawn_parallel`` (the cores) at a time
and ``max_workers`` (``-j``) per strategy: the number of processes follows the work being done
in them, not ``-j``. A worker is killed when it misses a deadline, exits, or the run ends.
Its environment is built here, not inherited: no API key, HOME and TMPDIR in its scratch
folder, the gateway's address for SDKs, and the harness's outside proxy (``proxy``) for the
hosts its plugin declares. Where Landlock is available a worker is confined twice, by policies
built here: before any plugin code runs (its import included: its own code, the paths its
parameters name, its scratch folder), then narrowed to what the created strategy declares.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..plugin_loading import installed_entry_points
from ..runlog import secret_variable
from .landlock import abi_version
from .metering import Metering
from .proxy import OutsideProxy
from .quotas import Quota
from .remote import RemoteStrategy, WorkerGone, WorkerProcess
from .wire import WireError

# What a worker inherits from the harness's environment: locale, paths and library switches,
# never a credential (a prefixed variable whose name says it holds one, ``HF_TOKEN``, is left out).
_INHERITED = ("PATH", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME", "BUDGETBENCH_LOAD_PLUGINS", "PYTHONHASHSEED",
              "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM")  # fmt: skip
_INHERITED_PREFIXES = ("LC_", "HF_", "TRANSFORMERS_", "SENTENCE_TRANSFORMERS_", "TORCH_")


def inherited_environment() -> dict[str, str]:
    """What a process running plugin code keeps of the harness's environment: locale, search
    path, thread counts, model-library settings; never a variable named like a secret."""
    return {
        k: v
        for k, v in os.environ.items()
        if k in _INHERITED or (k.startswith(_INHERITED_PREFIXES) and not secret_variable(k))
    }


GROW_AFTER_S = 0.2
"""A unit that has waited this long for an idle worker of its strategy starts another: a
short wait (units queueing briefly for a worker busy building a prompt) starts none."""

Source = dict[str, Any] | None
"""Where a worker finds its strategy: the module of one registered in the harness by code
(``strategy_source``); ``{"entry_points": [...]}``, the installed entry points to import (the
harness's index named them); None: by its entry point, looked up in an index of its own."""


def strategy_source(cls: Any, distribution: str, version: str) -> dict[str, Any]:
    """How a worker imports ``cls``: module and qualified name (and the module's file)."""
    qualname = getattr(cls, "__qualname__", "")
    if "<locals>" in qualname:
        raise PluginHostError(
            f"{qualname} is defined inside a function: a worker process cannot import it; define it at "
            f"module level (or run with --isolation none while debugging)"
        )
    module = sys.modules.get(cls.__module__)
    return {
        "module": cls.__module__,
        "qualname": qualname,
        "file": getattr(module, "__file__", None),
        "distribution": distribution,
        "version": version,
    }


def code_locations(source: Source) -> list[str]:
    """Where a worker's plugin code lives, found without running any of it (``find_spec`` of
    its top-level package, as the import system would): readable from the worker's first step."""
    if source and "module" in source:
        modules, found = [str(source["module"])], [str(source["file"])] if source.get("file") else []
    else:
        wanted = set((source or {}).get("entry_points") or [])
        modules, found = [ep.module for ep in installed_entry_points()[0] if not wanted or ep.name in wanted], []
    for module in modules:
        try:
            spec = importlib.util.find_spec(module.partition(".")[0])
        except (ImportError, ValueError):
            continue  # not importable by name: the worker loads it by its file, or names the failure
        if spec is not None and spec.submodule_search_locations:
            found += list(spec.submodule_search_locations)
        elif spec is not None and spec.origin and os.path.isabs(spec.origin):
            found.append(spec.origin)
    return sorted({os.path.realpath(p) for p in found})


def named_paths(params: Any) -> list[str]:
    """The existing absolute paths among a strategy's parameter values (a model folder the user
    passed): readable while the plugin starts, until it declares what it reads (``read_paths``)."""
    if isinstance(params, dict):
        return [p for value in params.values() for p in named_paths(value)]
    if isinstance(params, (list, tuple)):
        return [p for value in params for p in named_paths(value)]
    return (
        [os.path.realpath(params)]
        if isinstance(params, str) and os.path.isabs(params) and os.path.exists(params)
        else []
    )


def _overlap(path: Path, guarded: Path) -> bool:
    """Whether reading ``path`` would reach ``guarded`` (or ``path`` lies inside it)."""
    path, guarded = Path(os.path.realpath(path)), Path(os.path.realpath(guarded))
    return path == guarded or guarded.is_relative_to(path) or path.is_relative_to(guarded)


def _names(declared: str, guarded: str) -> bool:
    """Whether a ``network_hosts()`` entry (``host`` or ``host:port``) would let a worker reach
    ``guarded`` (``host:port``); ``localhost`` and loopback addresses are one host here."""

    def split(entry: str) -> tuple[str, str]:
        host, _, port = entry.lower().rpartition(":") if ":" in entry else (entry.lower(), "", "")
        return ("loopback" if host in ("localhost", "[::1]") or host.startswith("127.") else host), port

    (host, port), (g_host, g_port) = split(declared), split(guarded)
    return host == g_host and port in ("", g_port)


def sandbox_name() -> str:
    """What confines this machine's workers: ``landlock-abi-N``, or ``none`` without Landlock."""
    version = abi_version()
    return f"landlock-abi-{version}" if version > 0 else "none"


class PluginHostError(RuntimeError):
    """A worker could not be started or could not create its strategy."""


class PluginHost:
    """Spawns and owns the run's workers (see the module docstring)."""

    def __init__(
        self,
        tokenizer_info: dict[str, Any],
        scratch_root: Path,
        metering: Metering | None = None,
        confine: bool = True,
        max_workers: int = 1,
        quota: Quota | None = None,
    ) -> None:
        self.tokenizer_info = tokenizer_info
        self.quota = quota or Quota()  # what each worker may use of the machine (its guard holds it there)
        self.confine = confine and abi_version() > 0
        self.metering = metering  # the gateway a worker's own SDK calls go to (None: no model in this run)
        self.scratch_root = scratch_root  # the run's; each worker gets a folder of its own in it
        self.guarded: list[Path] = []  # no declared read path may hold these (the run directory, the task's data)
        self.declared_reads: dict[str, list[str]] = {}  # strategy -> the paths it declared (manifest)
        self.declared_hosts: dict[str, list[str]] = {}  # strategy -> the outside hosts it declared (manifest)
        # no declared host may name these ("host:port"): the model and judge servers, reached only
        # through the gateway, and the gateway and proxy themselves
        self.guarded_hosts: list[str] = []
        self.proxy = OutsideProxy()  # started with the first worker
        self.max_workers = max(1, max_workers)  # per strategy: one per unit that can run at once (-j)
        self.spawn_parallel = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a worker was given back, or a spawn ended
        self._idle: dict[str, list[RemoteStrategy]] = {}
        self._live: dict[str, int] = {}  # per strategy: workers idle, leased or starting
        self._starting: dict[str, int] = {}
        self._closed = False
        self._workers: list[WorkerProcess] = []
        self.spawned: dict[str, int] = {}  # per strategy: workers started in the run (manifest, benchmarks)
        self.shared_memory: dict[str, str] = {}  # per strategy: its workers' /dev/shm, "private" or why not (manifest)
        self._code: dict[str, list[str]] = {}  # per strategy: where its code lives (``code_locations``)

    def meter_with(self, metering: Metering) -> None:
        """Workers spawned from now on send their own SDK's calls to ``metering``'s gateway."""
        self.metering = metering

    @property
    def ports(self) -> list[int]:
        """The TCP ports a confined worker may connect to: the gateway's and the proxy's."""
        return [self.metering.port] if self.metering is not None else []

    def _environment(self, scratch: Path, token: str | None, proxy_token: str) -> dict[str, str]:
        env = inherited_environment()
        env.update(HOME=str(scratch), TMPDIR=str(scratch), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        if self.metering is not None and token is not None:
            env.update(self.metering.environment(token))
        env.update(self.proxy.environment(proxy_token))
        return env

    def lease(self, name: str, params: dict[str, Any], max_ingest_loss: float, source: Source) -> RemoteStrategy:
        """An idle worker of ``name`` (the caller resets it), or a new one when none is idle;
        ``give_back`` it when the unit's prompts are built, ``discard`` it after a failure."""
        since = time.monotonic()
        with self._changed:
            while True:
                if self._closed:
                    raise PluginHostError(f"strategy {name!r}: the run's plugin host is closed")
                idle = self._idle.setdefault(name, [])
                while idle:
                    strategy = idle.pop()
                    if strategy.worker.alive():
                        return strategy
                    strategy.close()  # it exited while idle: a new one takes its place
                    self._live[name] -= 1
                live, starting = self._live.get(name, 0), self._starting.get(name, 0)
                waited = time.monotonic() - since
                if live < self.max_workers and starting < self.spawn_parallel and (live == 0 or waited >= GROW_AFTER_S):
                    self._live[name], self._starting[name] = live + 1, starting + 1
                    break
                self._changed.wait(timeout=max(0.01, GROW_AFTER_S - waited))
        spawned = False
        try:
            strategy = self._spawn(name, params, max_ingest_loss, source)
            spawned = True
            return strategy
        finally:
            with self._changed:
                self._starting[name] -= 1
                if not spawned:
                    self._live[name] -= 1
                self._changed.notify_all()

    def give_back(self, strategy: RemoteStrategy) -> None:
        """The unit that leased ``strategy`` no longer needs it: the next unit may reset and use it."""
        with self._changed:
            if strategy.worker.alive() and not self._closed:
                self._idle.setdefault(strategy.name, []).append(strategy)
            else:
                strategy.close()
                self._live[strategy.name] -= 1
            self._changed.notify_all()

    def discard(self, strategy: RemoteStrategy) -> None:
        """Kill a leased worker (it missed its deadline, or failed): nothing it started can reach
        a server afterwards; the next unit gets another."""
        strategy.close()
        with self._changed:
            self._live[strategy.name] -= 1
            self._changed.notify_all()

    def new_strategy(self, name: str, params: dict[str, Any], max_ingest_loss: float, source: Source) -> RemoteStrategy:
        """An instance of ``name`` in a worker of its own, owned by the caller (``close`` it)."""
        return self._spawn(name, params, max_ingest_loss, source)

    def _spawn(self, name: str, params: dict[str, Any], max_ingest_loss: float, source: Source) -> RemoteStrategy:
        with self._lock:
            self.spawned[name] = self.spawned.get(name, 0) + 1
            scratch = self.scratch_root / f"{name}-{self.spawned[name]}"
        scratch.mkdir(parents=True)
        token = self.metering.new_token() if self.metering is not None else None
        with self._lock:
            self.proxy.start()
        proxy_token = self.proxy.register(name, [])  # what it may reach is known once it is created
        ports = [*self.ports, self.proxy.port]
        first = self._first_policy(name, params, source, scratch, ports) if self.confine else None
        worker = WorkerProcess(
            self._environment(scratch, token, proxy_token), scratch / "worker.log", scratch, self.quota
        )
        with self._lock:
            self._workers.append(worker)
        if first is not None:  # before any code of the plugin runs, its import included
            self._confined(worker, name, scratch, first)
        frame = {
            "op": "create",
            "name": name,
            "source": source,
            "params": params,
            "max_ingest_loss": max_ingest_loss,
            "scratch": str(scratch),
            "tokenizer": self.tokenizer_info,
        }
        created = self._ask(worker, name, scratch, frame)
        self.shared_memory[name] = str(worker.shared_memory)
        reads = created.get("read_paths") or []
        refused = [p for p in reads if self._reaches_evidence(p)]
        if refused:
            worker.kill()
            raise PluginHostError(
                f"strategy {name!r} declares it reads {refused[0]}, which holds (or is inside) the run directory or "
                f"the task's data: refused (read_paths() may name model folders, never the evidence)"
            )
        if reads:
            self.declared_reads[name] = sorted(set(self.declared_reads.get(name, [])) | set(reads))
        hosts = [str(h) for h in created.get("network_hosts") or []]
        harness = [*self.guarded_hosts, *(f"127.0.0.1:{port}" for port in [*self.ports, self.proxy.port])]
        named = [h for h in hosts if any(_names(h, guarded) for guarded in harness)]
        if named:
            worker.kill()
            raise PluginHostError(
                f"strategy {name!r} declares it reaches {named[0]}, which names the run's model or judge server or "
                f"the harness itself: refused (network_hosts() may name outside services; model calls go through "
                f"the metering gateway)"
            )
        self.proxy.guarded_ports = {int(h.rpartition(":")[2]) for h in harness if _names("127.0.0.1", h)}
        self.proxy.declare(proxy_token, hosts)
        if hosts:
            self.declared_hosts[name] = hosts
        if self.confine:  # narrowed for good: parameter paths it did not declare are no longer readable
            self._confined(worker, name, scratch, {"read": reads, "write": [str(scratch)], "ports": ports})
        return RemoteStrategy(name, worker, created, self.metering, token, self.proxy, proxy_token, max_ingest_loss)

    def _first_policy(self, name: str, params: dict[str, Any], source: Source, scratch: Path, ports: list[int]) -> dict:
        """What a worker may reach while its plugin is imported and created: its code, the paths
        its parameters name (never the run directory or the task's data), its scratch folder."""
        code = self._code.get(name)
        if code is None:  # found once per strategy: the installed metadata is scanned in this process
            code = self._code[name] = code_locations(source)
        held = [p for p in code if self._reaches_evidence(p)]
        if held:
            raise PluginHostError(
                f"strategy {name!r}: its code at {held[0]} holds (or is inside) the run directory or the task's data: "
                f"refused (a confined worker would read the evidence); keep runs and data outside plugin folders"
            )
        named = [p for p in named_paths(params) if not self._reaches_evidence(p)]
        return {"read": [*code, *named], "write": [str(scratch)], "ports": ports}

    def _reaches_evidence(self, path: str) -> bool:
        """Whether reading ``path`` would reach the run directory or the task's data."""
        return any(_overlap(Path(path), guarded) for guarded in self.guarded)

    def _confined(self, worker: WorkerProcess, name: str, scratch: Path, policy: dict[str, Any]) -> None:
        """Have the worker confine itself with ``policy`` (Landlock layers only ever narrow)."""
        confined = self._ask(worker, name, scratch, {"op": "confine", "policy": policy})
        applied: dict[str, Any] = confined["sandbox"] if isinstance(confined.get("sandbox"), dict) else {}
        if applied.get("sandbox") != sandbox_name():
            worker.kill()  # never a silent fallback: the run's identity says the workers are confined
            raise PluginHostError(f"strategy {name!r}: its worker could not be confined ({applied or 'no answer'})")

    @staticmethod
    def _ask(worker: WorkerProcess, name: str, scratch: Path, frame: dict[str, Any]) -> dict[str, Any]:
        """One setup exchange; a worker that fails or dies is killed and named."""
        try:
            reply = worker.exchange(frame)
        except WorkerGone as exc:
            log = _tail(scratch / "worker.log")
            worker.kill()  # its scratch folder, the log included, goes with it
            raise PluginHostError(f"strategy {name!r}: {exc}; its output: {log or '(none)'}") from None
        except WireError as exc:  # ours could not be sent: a parameter that is not plain data
            worker.kill()
            raise PluginHostError(f"strategy {name!r}: {exc}; give its parameters as plain data") from None
        if "failed" in reply:
            worker.kill()
            raise PluginHostError(str(reply["failed"].get("message")))
        done = reply.get("done")
        return done if isinstance(done, dict) else {}

    def close(self) -> None:
        with self._changed:
            self._closed = True
            workers, self._workers = self._workers, []
            self._idle.clear()
            self._changed.notify_all()
        for worker in workers:
            worker.kill()
        self.proxy.stop()


def _tail(log: Path, size: int = 2000) -> str:
    """The end of a worker's log, however long the plugin made it."""
    try:
        with open(log, "rb") as output:
            output.seek(max(0, output.seek(0, os.SEEK_END) - size))
            return output.read().decode(errors="replace")
    except OSError:
        return ""
