"""The strategies of a run: in confined worker processes leased per unit (``host``) or, with
``--isolation none``, one instance per executor thread in this process; a harness control
always here."""

from __future__ import annotations

import threading
from typing import Any

from ..controls import HarnessControl, is_control
from ..host.pool import PluginHost, PluginHostError, Source, strategy_source
from ..host.remote import RemoteStrategy
from ..memory_systems import MemorySystem, MemorySystemStrategy
from ..plugins import PluginError
from ..run_config import RunConfig
from ..sandbox import Deadline, PluginFailure, PluginRef, contained, json_safe_or_empty
from ..strategies import MemoryStrategy
from .run_plugins import RunPlugins


class StrategyPool:
    """``get(name)`` the calling thread's instance (an isolated one is leased until
    ``release(name)``); ``discard(name)`` after a timeout or failure."""

    def __init__(self, config: RunConfig, plugins: RunPlugins, host: PluginHost | None) -> None:
        self.config = config
        self.plugins = plugins
        self.host = host
        # In-process strategies are imported here; isolated ones only in their workers.
        self._classes = (
            {name: plugins.registry.get("strategy", name).obj for name in config.strategies if not is_control(name)}
            if host is None
            else {}
        )
        self._local = threading.local()

    def ref(self, name: str) -> PluginRef:
        return self.plugins.ref("strategy", name)

    def _params(self, name: str) -> dict[str, Any]:
        return self.config.strategy_params.get(name, {})

    def _source(self, name: str) -> Source:
        """For a strategy installed as an entry point, the entry points its worker imports (its
        own and the hook wrappers); for one registered by code in this process (tests), where its
        worker imports it from."""
        registered = self.plugins.registry.registered("strategy", name)
        if registered is None:
            entry_points = self.plugins.registry.entry_points_for("strategy", name)
            return {"entry_points": entry_points} if entry_points else None
        return strategy_source(registered.obj, registered.plugin.distribution, registered.plugin.version)

    def _creation_error(self, name: str, distribution: str | None, cause: Any) -> PluginError:
        return PluginError(
            f"strategy {name!r} from {distribution} could not be created with {self._params(name)}: {cause}"
        )

    def new(self, name: str) -> MemoryStrategy:
        """A fresh instance in this process (the caller owns it); an isolated strategy's
        instances are leased from the plugin host instead."""
        if is_control(name):
            return HarnessControl(name)  # run by the harness itself, in this process (controls.py)
        params = self._params(name)
        cls = self._classes[name]

        def create() -> MemoryStrategy:
            if isinstance(cls, type) and issubclass(cls, MemorySystem):
                return MemorySystemStrategy(cls(**params), max_ingest_loss=self.config.max_ingest_loss)
            return cls(**params)

        try:
            return contained("create", self.ref(name), create, Deadline(self.config.item_timeout_s))
        except PluginFailure as failure:
            raise self._creation_error(name, failure.plugin.distribution, failure.cause) from None

    def _held(self) -> dict[str, MemoryStrategy]:
        held: dict[str, MemoryStrategy] = self._local.__dict__.setdefault("strategies", {})
        return held

    def get(self, name: str) -> MemoryStrategy:
        """The calling thread's instance, kept for a unit's cells (strategies keep per-item state)."""
        held = self._held()
        leased = held.get(name)
        if isinstance(leased, RemoteStrategy) and not leased.worker.alive():
            self.discard(name)  # it exited or was killed: a new one, as for the next unit
        elif leased is not None:
            return leased
        if self.host is not None and not is_control(name):
            try:
                held[name] = self.host.lease(name, self._params(name), self.config.max_ingest_loss, self._source(name))
            except PluginHostError as exc:
                raise PluginError(f"strategy {name!r} could not be created: {exc}") from None
        else:
            held[name] = self.new(name)
        return held[name]

    def release(self, name: str) -> None:
        """The unit's prompts are built: its leased worker may serve another unit (an
        in-process instance stays with its thread)."""
        if self.host is not None and not is_control(name):
            strategy = self._held().pop(name, None)
            if isinstance(strategy, RemoteStrategy):
                self.host.give_back(strategy)

    def discard(self, name: str) -> None:
        """After a timeout or failure: an isolated strategy's worker is killed (nothing it
        started can reach a server afterwards); an in-process one is only dropped."""
        strategy = self._held().pop(name, None)
        if self.host is not None and isinstance(strategy, RemoteStrategy):
            self.host.discard(strategy)

    def describe(self, name: str) -> dict[str, Any]:
        """What a fresh instance says of itself, for the manifest, with its distribution. An
        isolated strategy's worker then serves the first unit (reset, as any leased worker)."""
        strategy: MemoryStrategy
        if self.host is not None and not is_control(name):
            try:
                strategy = self.host.lease(name, self._params(name), self.config.max_ingest_loss, self._source(name))
            except PluginHostError as exc:
                raise self._creation_error(name, self.ref(name).distribution, exc) from None
        else:
            strategy = self.new(name)
        try:
            described = contained("describe", self.ref(name), strategy.describe, Deadline(self.config.item_timeout_s))
        except PluginFailure as failure:
            if isinstance(strategy, RemoteStrategy) and self.host is not None:
                self.host.discard(strategy)
            raise PluginError(failure.cause) from None
        if isinstance(strategy, RemoteStrategy) and self.host is not None:
            self.host.give_back(strategy)
        described = json_safe_or_empty(described)
        return {
            **(described if isinstance(described, dict) else {}),
            "distribution": self.plugins.plugin_of("strategy", name).distribution,
        }
