"""The registry of everything plugins register, filled by calling their hooks through pluggy.

Entry points in the group ``budgetbench`` are read from package metadata when the registry
is created; nothing is imported until a name is looked up, a resolution hook is asked, or
the plugins are listed (inspect_ai style). A lookup imports only the entry point that
registers the name (``plugin_index``); importing is guarded (``plugin_loading``).

Every hook is called through pluggy, one implementation at a time (``get_hookimpls()``
then pluggy's own executor), so that:

- every registered name is attributed to the plugin whose implementation registered it, and
  an implementation that fails is blamed and contained while the others still run;
- ``@hookimpl(specname="register_strategies")`` implements the hook whatever the function's name;
- the hook's wrappers (``hookwrapper=True`` or ``wrapper=True``) wrap each of those calls.

A name registered twice is an error naming both distributions; the name is then unusable,
and every other registration (of the same hook, by the same plugin) still counts.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .backends import Backend
from .datasets import Dataset
from .executors import Executor
from .graders import Grader
from .memory_systems import MemorySystem
from .plugin_index import plugin_index
from .plugin_loading import (
    GROUP,
    PluginError,
    PluginInfo,
    UnknownNameError,
    contained,
    installed_entry_points,
    short_error,
)
from .strategies import MemoryStrategy
from .tasks import Task
from .tokenizers import Tokenizer

__all__ = ["HOOKS", "KINDS", "PluginError", "PluginInfo", "Registered", "Registry", "UnknownNameError"]

KINDS = ("strategy", "task", "grader", "backend", "tokenizer", "dataset", "executor")
_HOOK_OF_KIND = {
    "strategy": "register_strategies",
    "task": "register_tasks",
    "grader": "register_graders",
    "backend": "register_backends",
    "tokenizer": "register_tokenizers",
    "dataset": "register_datasets",
    "executor": "register_executors",
}
_BASE_OF_KIND: dict[str, tuple[type, ...]] = {
    "strategy": (MemoryStrategy, MemorySystem),
    "task": (Task,),
    "grader": (Grader,),
    "backend": (Backend,),
    "executor": (Executor,),
}
HOOKS = (*_HOOK_OF_KIND.values(), "register_commands", "resolve_backend", "resolve_tokenizer")


@dataclass
class Registered:
    """A registered class, factory or dataset and where it came from."""

    name: str
    kind: str
    obj: Any
    plugin: PluginInfo


_CORE_RESOLVERS = "budgetbench-core-resolvers"


class _CoreResolvers:
    """The core's own last-resort resolution: tokenizer specs by registered prefix."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    @hookspecs.hookimpl(trylast=True)
    def resolve_tokenizer(self, spec: str, backend: Any) -> Any:
        prefix, _, argument = spec.partition(":")
        return self.registry.get("tokenizer", prefix).obj(argument, backend)


class Registry:
    """Everything registered by the plugins, looked up by kind and name.

    ``Registry()`` is empty (tests add plugins with ``add_plugin``);
    ``Registry.discover()`` knows the installed entry points and imports them on first use.
    """

    def __init__(self, entry_points: list[metadata.EntryPoint] | None = None, blocked: set[str] | None = None) -> None:
        self.manager = pluggy.PluginManager(GROUP)
        self.manager.add_hookspecs(hookspecs)
        self.manager.register(_CoreResolvers(self), name=_CORE_RESOLVERS)
        for name in blocked or ():
            self.manager.set_blocked(name)  # BUDGETBENCH_LOAD_PLUGINS: pluggy then never loads it
        self._plugins: list[PluginInfo] = []
        self._entries: dict[str, dict[str, Registered]] = {kind: {} for kind in KINDS}
        self.conflicts: dict[tuple[str, str], str] = {}
        self._pending = [(ep, PluginInfo.of(ep)) for ep in entry_points or [] if not self.manager.is_blocked(ep.name)]
        self._load_lock = threading.RLock()
        self._index: dict[str, Any] | None = None

    @classmethod
    def discover(cls) -> Registry:
        """A registry of the allowed installed entry points, none of them imported yet."""
        found, blocked = installed_entry_points()
        return cls(found, blocked)

    # ------------------------------------------------------------- loading

    def declared(self) -> list[PluginInfo]:
        """Every plugin known so far, from metadata alone: nothing is imported."""
        return [*self._plugins, *(info for _, info in self._pending)]

    def load(self, only: set[str] | None = None) -> Registry:
        """Import the pending entry points (``only`` those names, if given) once, each guarded,
        then call their registration hooks, so a wrapper in any of them wraps every call.
        Lookups may come from a run's worker threads, so one thread loads while the others wait."""
        if not self._pending:
            return self
        with self._load_lock:
            batch = [p for p in self._pending if only is None or p[0].name in only]
            try:
                for entry_point, info in batch:
                    with contained(info, f"failed to load {entry_point.value}:"):
                        if not self.manager.load_setuptools_entrypoints(GROUP, name=entry_point.name):
                            raise PluginError(f"plugin {info.name!r} ({info.distribution}): the name is already taken")
                for _, info in batch:
                    self._collect(info)
            finally:  # pending until registered: a lookup never sees half a plugin
                for pending in batch:
                    self._pending.remove(pending)
        return self

    def add_plugin(self, module: Any, info: PluginInfo) -> None:
        """Register one plugin module (or object) and collect what its hooks register."""
        try:
            if self.manager.register(module, name=info.name) is None:
                info.add_error(f"plugin {info.name!r} is blocked by BUDGETBENCH_LOAD_PLUGINS")
        except Exception as exc:  # pluggy validation errors (bad arguments), a duplicate name
            info.add_error(short_error(exc))
        self._collect(info)

    def _collect(self, info: PluginInfo) -> None:
        """Record the plugin and call its registration hooks, each implementation contained."""
        self._plugins.append(info)
        module = self.manager.get_plugin(info.name)
        if info.error or module is None:
            return
        info.loaded = True
        callers = self.manager.get_hookcallers(module) or []
        info.hooks = sorted({caller.name for caller in callers})
        for caller in callers:
            if not caller.has_spec():
                info.add_error(f"{caller.name!r} is no budgetbench hook (see docs/hooks.md); it is never called")
        for kind, hook_name in _HOOK_OF_KIND.items():
            for impl in self._implementations(hook_name, info.name):
                with contained(info, f"{hook_name}{self._wrapped(hook_name)} raised"):
                    self._call(hook_name, impl, register=self._registrar(kind, info))

    # ------------------------------------------------------------- calling hooks

    def _implementations(self, hook_name: str, plugin: str | None = None) -> list[pluggy.HookImpl]:
        """The hook's implementations (not its wrappers) in pluggy's call order, ``plugin``'s only if given."""
        return [
            impl
            for impl in reversed(getattr(self.manager.hook, hook_name).get_hookimpls())
            if not (impl.hookwrapper or impl.wrapper) and plugin in (None, impl.plugin_name)
        ]

    def _call(self, hook_name: str, impl: pluggy.HookImpl, **kwargs: Any) -> Any:
        """Call one implementation inside every wrapper of the hook, through the manager's own
        executor (what ``enable_tracing`` and ``add_hookcall_monitoring`` observe)."""
        hook = getattr(self.manager.hook, hook_name)
        wrappers = [i for i in hook.get_hookimpls() if i.hookwrapper or i.wrapper]
        firstresult = bool(hook.spec and hook.spec.opts.get("firstresult"))
        return self.manager._hookexec(hook_name, [impl, *wrappers], kwargs, firstresult)

    def _wrapped(self, hook_name: str) -> str:
        """`` (inside the wrappers of ...)`` when the hook has wrappers, so a failure's blame is honest."""
        names = [
            i.plugin_name for i in getattr(self.manager.hook, hook_name).get_hookimpls() if i.hookwrapper or i.wrapper
        ]
        return f" (inside the wrappers of {', '.join(names)})" if names else ""

    def _registrar(self, kind: str, info: PluginInfo) -> Callable[..., None]:
        """The ``register`` callback: a bad or duplicate registration is recorded on the
        plugin and skipped, so the plugin's other registrations still count."""

        def register(obj: Any, factory: Any = None) -> None:
            try:
                name, target = self._validate(kind, info, obj, factory)
            except PluginError as exc:
                info.add_error(str(exc))
                return
            existing = self._entries[kind].get(name)
            if existing is not None or (kind, name) in self.conflicts:
                first = existing.plugin if existing else None
                message = self.conflicts.get((kind, name)) or (
                    f"{kind} name {name!r} is registered twice: by {first.distribution if first else '?'} "
                    f"(plugin {first.name if first else '?'!r}) and by {info.distribution} (plugin {info.name!r})"
                )
                self.conflicts[(kind, name)] = message
                info.add_error(message)
                return
            self._entries[kind][name] = Registered(name, kind, target, info)

        return register

    @staticmethod
    def _validate(kind: str, info: PluginInfo, obj: Any, factory: Any) -> tuple[str, Any]:
        who = f"plugin {info.name!r} ({info.distribution})"
        if kind == "tokenizer":
            if not isinstance(obj, str) or not obj or not callable(factory):
                raise PluginError(f"{who}: register_tokenizers expects register('prefix', factory), got {obj!r}")
            return obj, factory
        if kind == "dataset":
            if not isinstance(obj, Dataset):
                raise PluginError(f"{who}: register_datasets expects a budgetbench_core.Dataset, got {obj!r}")
            return obj.name, obj
        bases = _BASE_OF_KIND[kind]
        if not (inspect.isclass(obj) and issubclass(obj, bases)):
            raise PluginError(
                f"{who} registered {obj!r} as a {kind}, but it is not a subclass of "
                f"{' or '.join(b.__name__ for b in bases)}"
            )
        name = getattr(obj, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"{who}: {obj.__name__} has no 'name'")
        return name, obj

    # ------------------------------------------------------------- the index

    def index(self) -> dict[str, Any]:
        """What the pending entry points register, resolve, wrap and add, and which fail (``plugin_index``)."""
        if self._index is None:
            self._index = plugin_index([ep for ep, _ in self._pending])
        return self._index

    def entry_points_for(self, kind: str, name: str) -> list[str] | None:
        """The entry points a process must import to find ``name`` with every hook wrapper, from the
        index; None when no pending entry point registers it. A plugin worker given these imports
        only them and builds no index of its own (its HOME is a fresh scratch folder: no index cache)."""
        if not self._pending:
            return None
        index = self.index()
        entry = index["names"].get(kind, {}).get(name)
        return sorted({entry, *index["wrappers"]}) if entry else None

    def _load_for(self, kind: str, name: str) -> None:
        """Import only the entry point that registers ``name``, with the plugins that wrap hooks
        (all of them if the index does not know it: an unknown name then lists everything)."""
        if not self._pending or name in self._entries[kind]:
            return
        index = self.index()
        entry = index["names"].get(kind, {}).get(name)
        self.load({entry, *index["wrappers"]} if entry else None)

    def registered(self, kind: str, name: str) -> Registered | None:
        """``name`` if it is already registered in this process (loaded or added by code), else None."""
        return self._entries[kind].get(name)

    def locate(self, kind: str, name: str) -> PluginInfo:
        """The plugin that registers ``name``, from the index alone: nothing is imported here."""
        if name in self._entries[kind] or not self._pending:
            return self.get(kind, name).plugin
        entry = self.index()["names"].get(kind, {}).get(name)
        known = next((info for ep, info in self._pending if ep.name == entry), None)
        if known is None:
            return self.get(kind, name).plugin  # unknown: the lookup's error lists what there is
        return known

    # ------------------------------------------------------------- lookups

    @property
    def plugins(self) -> list[PluginInfo]:
        self.load()
        return self._plugins

    @property
    def entries(self) -> dict[str, dict[str, Registered]]:
        self.load()
        return self._entries

    @property
    def failures(self) -> list[PluginInfo]:
        """The plugins that failed to load or register; a pending one is known from the index, unimported."""
        failed = self.index()["failed"] if self._pending else {}
        pending = [replace(info, error=failed[info.name]) for _, info in self._pending if info.name in failed]
        return [*(p for p in self._plugins if p.error), *pending]

    def get(self, kind: str, name: str) -> Registered:
        self._load_for(kind, name)
        entries = self._entries[kind]
        if (kind, name) in self.conflicts:
            raise PluginError(self.conflicts[(kind, name)])
        try:
            return entries[name]
        except KeyError:
            available = ", ".join(sorted(entries)) or "none"
            hint = ""
            if self.failures:
                hint = "; plugins that failed to load: " + ", ".join(f"{p.name} ({p.error})" for p in self.failures)
            raise UnknownNameError(f"unknown {kind} {name!r}; available: {available}{hint}") from None

    def names(self, kind: str) -> list[str]:
        """Every registered name of ``kind``; the index answers for the plugins not imported yet."""
        pending = self.index()["names"].get(kind, {}) if self._pending else {}
        return sorted({*self._entries[kind], *pending})

    def executor_options(self) -> dict[str, dict[str, str]]:
        """Each executor's ``options`` (``--<executor>-<key>`` on ``run``), the pending ones from
        the index, so building the ``run`` command imports no executor plugin."""
        pending = self.index()["executor_options"] if self._pending else {}
        loaded = {name: dict(entry.obj.options) for name, entry in self._entries["executor"].items()}
        return dict(sorted({**pending, **loaded}.items()))

    def datasets(self) -> dict[str, Dataset]:
        return {name: entry.obj for name, entry in sorted(self.entries["dataset"].items())}

    def distributions(self) -> dict[str, str]:
        """Distribution name -> version of every plugin that loads (for the manifest), the pending
        ones from metadata and the index: the versions do not depend on what a run imported."""
        failed = self.index()["failed"] if self._pending else {}
        pending = [info for _, info in self._pending if info.name not in failed]
        return {p.distribution: p.version for p in [*(p for p in self._plugins if p.loaded), *pending]}

    def _first_result(self, hook_name: str, **kwargs: Any) -> tuple[Any, str | None]:
        """Call a firstresult hook one implementation at a time in pluggy's order, naming the
        plugin whose code failed; only the plugins that resolve or wrap are imported for it."""
        if self._pending:
            index = self.index()
            self.load({*index["resolvers"], *index["wrappers"]})
        for impl in self._implementations(hook_name):
            try:
                result = self._call(hook_name, impl, **kwargs)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"{hook_name} of plugin {impl.plugin_name!r} ({self._distribution(impl.plugin_name)})"
                    f"{self._wrapped(hook_name)} raised {short_error(exc)}"
                ) from exc
            if result is not None:
                return result, impl.plugin_name
        return None, None

    def _distribution(self, plugin_name: str) -> str:
        return next((p.distribution for p in self._plugins if p.name == plugin_name), "budgetbench")

    def resolve_backend(self, model: str) -> Registered:
        """The registered backend that serves ``model`` (the ``resolve_backend`` hook)."""
        name, plugin = self._first_result("resolve_backend", model=model)
        if name is None:
            raise UnknownNameError(
                f"no backend accepts --model {model!r}; backends: {', '.join(self.names('backend')) or 'none'}"
            )
        if not isinstance(name, str):
            raise PluginError(
                f"resolve_backend of plugin {plugin!r} ({self._distribution(plugin or '')}) returned "
                f"{name!r}; it must return the name of a registered backend"
            )
        return self.get("backend", name)

    def resolve_tokenizer(self, spec: str, backend: Any) -> Tokenizer:
        """A Tokenizer for ``spec`` (the ``resolve_tokenizer`` hook, then registered prefixes)."""
        return self.resolve_tokenizer_source(spec, backend)[0]

    def resolve_tokenizer_source(self, spec: str, backend: Any) -> tuple[Tokenizer, PluginInfo]:
        """The Tokenizer for ``spec`` and the plugin that made it (for the run's identity)."""
        tokenizer, plugin = self._first_result("resolve_tokenizer", spec=spec, backend=backend)
        if not isinstance(tokenizer, Tokenizer):
            raise PluginError(
                f"tokenizer spec {spec!r}: plugin {plugin!r} ({self._distribution(plugin or '')}) "
                f"gave {tokenizer!r}, not a Tokenizer"
            )
        if plugin == _CORE_RESOLVERS:  # a registered prefix: the plugin that registered it made the tokenizer
            return tokenizer, self.get("tokenizer", spec.partition(":")[0]).plugin
        source = next((p for p in self._plugins if p.name == plugin), PluginInfo(str(plugin), "unknown", "unknown"))
        return tokenizer, source

    def add_commands(self, cli: Any) -> None:
        """Let every plugin add its commands; one may not replace a command already there.
        Only the plugins that implement ``register_commands`` (or wrap hooks) are imported for it."""
        if self._pending:
            index = self.index()
            self.load({*index["commands"], *index["wrappers"]})
        for plugin in list(self._plugins):
            for impl in self._implementations("register_commands", plugin.name):
                before = dict(cli.commands)
                with contained(plugin, f"register_commands{self._wrapped('register_commands')} raised"):
                    self._call("register_commands", impl, cli=cli)
                for name, command in before.items():
                    if cli.commands.get(name) is not command:
                        cli.commands[name] = command
                        plugin.add_error(f"register_commands tried to replace the command {name!r}; kept the original")


def load_registry() -> Registry:
    """A new registry with every allowed entry point imported."""
    return Registry.discover().load()


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry; entry points are imported on first use, not here."""
    global _registry
    if _registry is None:
        _registry = Registry.discover()
    return _registry
