"""Plugin discovery and the registry of everything plugins register.

Entry points in the group ``budgetbench`` are loaded one by one; a plugin that fails to
import, or whose hook raises, is recorded with its error and the others still load.
``BUDGETBENCH_LOAD_PLUGINS=a,b`` restricts loading to those entry-point names. Each
hook implementation is called separately so every registered name is attributed to
the distribution that registered it, and a duplicate name names both.
"""

from __future__ import annotations

import inspect
import os
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .backends import Backend
from .graders import Grader
from .memory_systems import MemorySystem
from .strategies import MemoryStrategy
from .tasks import Task

GROUP = "budgetbench"
KINDS = ("strategy", "task", "grader", "backend", "tokenizer")
_HOOK_OF_KIND = {
    "strategy": "register_strategies",
    "task": "register_tasks",
    "grader": "register_graders",
    "backend": "register_backends",
    "tokenizer": "register_tokenizers",
}
_BASE_OF_KIND = {
    "strategy": (MemoryStrategy, MemorySystem),
    "task": (Task,),
    "grader": (Grader,),
    "backend": (Backend,),
}


class PluginError(Exception):
    """A plugin problem the user must fix; the message names the plugin."""


class UnknownNameError(PluginError):
    """A name no installed plugin registered; the message lists the available ones."""


@dataclass
class PluginInfo:
    """One loaded (or failed) entry point and the distribution that provides it."""

    name: str
    distribution: str
    version: str
    hooks: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Registered:
    """A registered class or factory and where it came from."""

    name: str
    kind: str
    obj: Any
    plugin: PluginInfo


def _distribution_of(entry_point: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return "unknown", "unknown"
    return dist.metadata["Name"], dist.version


def _short_error(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" ({frame.filename}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


class Registry:
    """Everything registered by the loaded plugins, looked up by kind and name."""

    def __init__(self) -> None:
        self.plugins: list[PluginInfo] = []
        self.entries: dict[str, dict[str, Registered]] = {kind: {} for kind in KINDS}
        self.conflicts: dict[tuple[str, str], str] = {}
        self.manager = pluggy.PluginManager(GROUP)
        self.manager.add_hookspecs(hookspecs)

    @property
    def failures(self) -> list[PluginInfo]:
        return [p for p in self.plugins if p.error]

    def add_plugin(self, module: Any, info: PluginInfo) -> None:
        """Register one plugin module (or object) and collect what its hooks register."""
        try:
            self.manager.register(module, name=info.name)
        except Exception as exc:  # pluggy validation errors, duplicate registration
            info.error = _short_error(exc)
            self.plugins.append(info)
            return
        info.hooks = sorted(
            hook_name for hook_name in _HOOK_OF_KIND.values() if hasattr(module, hook_name)
        ) + (["register_commands"] if hasattr(module, "register_commands") else [])
        self.plugins.append(info)
        for kind, hook_name in _HOOK_OF_KIND.items():
            implementation = getattr(module, hook_name, None)
            if implementation is None:
                continue
            try:
                implementation(register=self._registrar(kind, info))
            except PluginError as exc:
                info.error = str(exc)
            except Exception as exc:
                info.error = f"{hook_name} raised {_short_error(exc)}"

    def _registrar(self, kind: str, info: PluginInfo):
        def register(obj: Any, factory: Any = None) -> None:
            if kind == "tokenizer":
                name, target = obj, factory
                if not isinstance(name, str) or not callable(target):
                    raise PluginError(f"plugin {info.name!r} ({info.distribution}): register_tokenizers expects register('prefix', factory)")
            else:
                target = obj
                bases = _BASE_OF_KIND[kind]
                if not (inspect.isclass(target) and issubclass(target, bases)):
                    raise PluginError(
                        f"plugin {info.name!r} ({info.distribution}) registered {target!r} as a {kind}, "
                        f"but it is not a subclass of {' or '.join(b.__name__ for b in bases)}"
                    )
                name = getattr(target, "name", None)
                if not isinstance(name, str) or not name:
                    raise PluginError(f"plugin {info.name!r} ({info.distribution}): {target.__name__} has no 'name'")
            existing = self.entries[kind].get(name)
            if existing is not None:
                message = (
                    f"{kind} name {name!r} is registered twice: by {existing.plugin.distribution} "
                    f"(plugin {existing.plugin.name!r}) and by {info.distribution} (plugin {info.name!r})"
                )
                self.conflicts[(kind, name)] = message
                raise PluginError(message)
            self.entries[kind][name] = Registered(name, kind, target, info)

        return register

    def get(self, kind: str, name: str) -> Registered:
        if (kind, name) in self.conflicts:
            raise PluginError(self.conflicts[(kind, name)])
        try:
            return self.entries[kind][name]
        except KeyError:
            available = ", ".join(sorted(self.entries[kind])) or "none"
            hint = ""
            if self.failures:
                hint = "; plugins that failed to load: " + ", ".join(f"{p.name} ({p.error})" for p in self.failures)
            raise UnknownNameError(f"unknown {kind} {name!r}; available: {available}{hint}") from None

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])

    def distributions(self) -> dict[str, str]:
        """Distribution name -> version of every loaded plugin (for the manifest)."""
        return {p.distribution: p.version for p in self.plugins if not p.error}

    def add_commands(self, cli: Any) -> None:
        for plugin in self.plugins:
            module = self.manager.get_plugin(plugin.name)
            implementation = getattr(module, "register_commands", None)
            if implementation is None:
                continue
            try:
                implementation(cli=cli)
            except Exception as exc:
                plugin.error = f"register_commands raised {_short_error(exc)}"


def allowed_plugins() -> set[str] | None:
    raw = os.environ.get("BUDGETBENCH_LOAD_PLUGINS")
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def load_registry() -> Registry:
    """Load every allowed entry point of the ``budgetbench`` group into a new registry."""
    registry = Registry()
    allowed = allowed_plugins()
    for entry_point in sorted(metadata.entry_points(group=GROUP), key=lambda ep: ep.name):
        if allowed is not None and entry_point.name not in allowed:
            continue
        distribution, version = _distribution_of(entry_point)
        info = PluginInfo(entry_point.name, distribution, version)
        try:
            module = entry_point.load()
        except Exception as exc:
            info.error = f"failed to import {entry_point.value}: {_short_error(exc)}"
            registry.plugins.append(info)
            continue
        registry.add_plugin(module, info)
    return registry


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = load_registry()
    return _registry
