"""The run's plugin workers: spawned on first use, one per executor thread and strategy.

One worker holds one strategy instance (never two plugins in one process, so rival memory
layers cannot reach each other), is reused for every unit its thread runs of that strategy
(per-item state survives between budget tiers, as in-process), and is killed when it misses
a deadline, exits, or the run ends. Its environment is built here, not inherited: no API
key, HOME and TMPDIR in its scratch folder, the gateway's address for SDKs, and the
harness's outside proxy (``proxy``) for the hosts its plugin declares.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from .landlock import abi_version
from .metering import Metering
from .proxy import OutsideProxy
from .remote import RemoteStrategy, WorkerGone, WorkerProcess

# What a worker inherits from the harness's environment: locale, paths and library switches,
# never a credential.
_INHERITED = ("PATH", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME", "BUDGETBENCH_LOAD_PLUGINS", "PYTHONHASHSEED",
              "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM")  # fmt: skip
_INHERITED_PREFIXES = ("LC_", "HF_", "TRANSFORMERS_", "SENTENCE_TRANSFORMERS_", "TORCH_")


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
        self, tokenizer_info: dict[str, Any], scratch_root: Path, metering: Metering | None = None, confine: bool = True
    ) -> None:
        self.tokenizer_info = tokenizer_info
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
        self._local = threading.local()
        self._lock = threading.Lock()
        self._workers: list[WorkerProcess] = []
        self._count = 0

    def meter_with(self, metering: Metering) -> None:
        """Workers spawned from now on send their own SDK's calls to ``metering``'s gateway."""
        self.metering = metering

    @property
    def ports(self) -> list[int]:
        """The TCP ports a confined worker may connect to: the gateway's and the proxy's."""
        return [self.metering.port] if self.metering is not None else []

    def _environment(self, scratch: Path, token: str | None, proxy_token: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in _INHERITED or k.startswith(_INHERITED_PREFIXES)}
        env.update(HOME=str(scratch), TMPDIR=str(scratch), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        if self.metering is not None and token is not None:
            env.update(self.metering.environment(token))
        env.update(self.proxy.environment(proxy_token))
        return env

    def strategy(self, name: str, params: dict[str, Any], max_ingest_loss: float, source: Source) -> RemoteStrategy:
        """This thread's instance of ``name`` (a new worker the first time)."""
        held: dict[str, RemoteStrategy] = self._local.__dict__.setdefault("strategies", {})
        if name in held and not held[name].worker.alive():  # it exited or was killed: a new one
            held.pop(name).close()
        if name not in held:
            held[name] = self._spawn(name, params, max_ingest_loss, source)
        return held[name]

    def new_strategy(self, name: str, params: dict[str, Any], max_ingest_loss: float, source: Source) -> RemoteStrategy:
        """An instance of ``name`` in a worker of its own, owned by the caller (``close`` it)."""
        return self._spawn(name, params, max_ingest_loss, source)

    def discard(self, name: str) -> None:
        """Kill this thread's worker of ``name`` (missed its deadline, or failed): the next
        unit gets a new one."""
        held: dict[str, RemoteStrategy] = self._local.__dict__.setdefault("strategies", {})
        strategy = held.pop(name, None)
        if strategy is not None:
            strategy.close()

    def _spawn(self, name: str, params: dict[str, Any], max_ingest_loss: float, source: Source) -> RemoteStrategy:
        with self._lock:
            self._count += 1
            scratch = self.scratch_root / f"{name}-{self._count}"
        scratch.mkdir(parents=True)
        token = self.metering.new_token() if self.metering is not None else None
        with self._lock:
            self.proxy.start()
        proxy_token = self.proxy.register(name, [])  # what it may reach is known once it is created
        worker = WorkerProcess(self._environment(scratch, token, proxy_token), scratch / "worker.log", scratch)
        with self._lock:
            self._workers.append(worker)
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
        reads = created.get("read_paths") or []
        refused = [p for p in reads if any(_overlap(Path(p), guarded) for guarded in self.guarded)]
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
        if self.confine:
            policy = {"read": reads, "write": [str(scratch)], "ports": [*self.ports, self.proxy.port]}
            confined = self._ask(worker, name, scratch, {"op": "confine", "policy": policy})
            applied: dict[str, Any] = confined["sandbox"] if isinstance(confined.get("sandbox"), dict) else {}
            if applied.get("sandbox") != sandbox_name():
                worker.kill()  # never a silent fallback: the run's identity says the workers are confined
                raise PluginHostError(f"strategy {name!r}: its worker could not be confined ({applied or 'no answer'})")
        return RemoteStrategy(name, worker, created, self.metering, token, self.proxy, proxy_token)

    @staticmethod
    def _ask(worker: WorkerProcess, name: str, scratch: Path, frame: dict[str, Any]) -> dict[str, Any]:
        """One setup exchange; a worker that fails or dies is killed and named."""
        try:
            reply = worker.exchange(frame)
        except WorkerGone as exc:
            worker.kill()
            log = (scratch / "worker.log").read_text(errors="replace")[-2000:]
            raise PluginHostError(f"strategy {name!r}: {exc}; its output: {log or '(none)'}") from None
        if "failed" in reply:
            worker.kill()
            raise PluginHostError(str(reply["failed"].get("message")))
        done = reply.get("done")
        return done if isinstance(done, dict) else {}

    def close(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.kill()
        self.proxy.stop()
