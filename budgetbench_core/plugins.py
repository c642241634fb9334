"""Plugin discovery, guarded lazy loading, and the registry of everything plugins register.

Entry points in the group ``budgetbench`` are read from package metadata when the
registry is created; nothing is imported until a name is looked up, a resolution hook
is asked, or the plugins are listed (inspect_ai style). Loading then imports every
allowed entry point once, each guarded: a plugin that fails to import, raises (even
``SystemExit``) or prints while loading is recorded with its error or output and the
others still load. ``BUDGETBENCH_LOAD_PLUGINS=a,b`` restricts loading to those
entry-point names; a name that is no installed entry point (a typo, a distribution's name)
is warned about on stderr with the valid names.

A run imports only what it uses: ``index()`` maps every registered name to the entry point
that registers it, computed by importing the plugins in a child process (so no plugin's
import-time code runs in the harness) and cached by the installed entry points and their
files; ``get`` then imports that one entry point, and resolution hooks import only the
plugins that implement them. Strategies are not even imported: they run in workers
(``host``), and ``locate`` names their distribution from the index.

Each registration hook is called per plugin so every name is attributed to the
distribution that registered it. A name registered twice is an error naming both
distributions; the name is then unusable, and every other registration (of the same
hook, by the same plugin) still counts.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.util
import inspect
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pluggy

from . import hookspecs
from .backends import Backend
from .datasets import Dataset
from .executors import Executor
from .graders import Grader
from .memory_systems import MemorySystem
from .strategies import MemoryStrategy
from .tasks import Task
from .tokenizers import Tokenizer

GROUP = "budgetbench"
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


class PluginError(Exception):
    """A plugin problem the user must fix; the message names the plugin."""


class UnknownNameError(PluginError):
    """A name no installed plugin registered; the message lists the available ones."""


@dataclass
class PluginInfo:
    """One entry point (loaded, failed or not yet imported) and its distribution."""

    name: str
    distribution: str
    version: str
    hooks: list[str] = field(default_factory=list)
    error: str | None = None
    value: str = ""  # the entry point's target, e.g. "budgetbench_core.builtin.strategies"
    output: str = ""  # what the plugin printed while it was loaded (kept out of stdout)
    loaded: bool = False  # imported and registered with the plugin manager

    def add_error(self, message: str) -> None:
        self.error = message if not self.error else f"{self.error}; {message}"


@dataclass
class Registered:
    """A registered class, factory or dataset and where it came from."""

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


@contextlib.contextmanager
def _captured_output(text: io.StringIO) -> Iterator[None]:
    """Collect what plugin code prints into ``text``, at the file-descriptor level too
    (``os.write(1, ...)``, C extensions), so a plugin cannot corrupt machine-readable
    output such as ``list-plugins --json``."""
    try:
        sys.stdout.flush()
        saved_fd = os.dup(1)
    except (OSError, ValueError):  # no real stdout (embedded interpreter): Python level only
        with contextlib.redirect_stdout(text):
            yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            with contextlib.redirect_stdout(text):
                yield
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
            sink.seek(0)
            text.write(sink.read().decode("utf-8", "replace"))


@contextlib.contextmanager
def _contained(info: PluginInfo, failure: str) -> Iterator[None]:
    """Any failure of plugin code, ``SystemExit`` included, becomes the plugin's error
    (``failure`` starts the message); what it printed goes to stderr, never stdout.

    A ``KeyboardInterrupt`` still propagates: that is the user stopping the program.
    """
    printed = io.StringIO()
    try:
        with _captured_output(printed):
            yield
    except KeyboardInterrupt:
        raise
    except PluginError as exc:
        info.add_error(str(exc))
    except BaseException as exc:
        info.add_error(f"{failure} {_short_error(exc)}")
    finally:
        if printed.getvalue():
            info.output += printed.getvalue()
            print(
                f"budgetbench: plugin {info.name!r} ({info.distribution}) printed while loading "
                f"(kept off stdout): {printed.getvalue()[:500]!r}",
                file=sys.stderr,
            )


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

    def __init__(self, entry_points: list[metadata.EntryPoint] | None = None) -> None:
        self.manager = pluggy.PluginManager(GROUP)
        self.manager.add_hookspecs(hookspecs)
        self.manager.register(_CoreResolvers(self), name=_CORE_RESOLVERS)
        self._plugins: list[PluginInfo] = []
        self._entries: dict[str, dict[str, Registered]] = {kind: {} for kind in KINDS}
        self.conflicts: dict[tuple[str, str], str] = {}
        self._pending: list[tuple[metadata.EntryPoint, PluginInfo]] = []
        self._load_lock = threading.RLock()
        self._index: dict[str, Any] | None = None
        for entry_point in entry_points or []:
            distribution, version = _distribution_of(entry_point)
            info = PluginInfo(entry_point.name, distribution, version, value=entry_point.value)
            self._pending.append((entry_point, info))

    @classmethod
    def discover(cls) -> Registry:
        """A registry of the allowed installed entry points, none of them imported yet."""
        allowed = allowed_plugins()
        found = sorted(metadata.entry_points(group=GROUP), key=lambda ep: ep.name)
        if allowed is not None:
            _warn_unknown_allowed(allowed, found)
        return cls([ep for ep in found if allowed is None or ep.name in allowed])

    # ------------------------------------------------------------- loading

    def declared(self) -> list[PluginInfo]:
        """Every plugin known so far, from metadata alone: nothing is imported."""
        return [*self._plugins, *(info for _, info in self._pending)]

    def load(self, only: set[str] | None = None) -> Registry:
        """Import the pending entry points (``only`` those names, if given) once, each guarded.
        Lookups may come from a run's worker threads, so one thread loads while the others wait."""
        if not self._pending:
            return self
        with self._load_lock:
            for pending in [p for p in self._pending if only is None or p[0].name in only]:
                entry_point, info = pending
                try:
                    module = None
                    with _contained(info, f"failed to import {entry_point.value}:"):
                        module = entry_point.load()
                    if info.error:
                        self._plugins.append(info)
                    else:
                        self.add_plugin(module, info)
                finally:  # pending until registered: a lookup never sees half a plugin
                    self._pending.remove(pending)
        return self

    # ------------------------------------------------------------- the index

    def index(self) -> dict[str, Any]:
        """``{"names": {kind: {name: entry point}}, "resolvers": [entry points]}`` of the
        pending entry points, made in a child process (``host.index``) and cached on disk."""
        if self._index is None:
            pending = sorted(self._pending, key=lambda p: p[0].name)
            digest = hashlib.sha256(json.dumps([_fingerprint(ep) for ep, _ in pending]).encode()).hexdigest()[:24]
            cache = _cache_dir() / f"plugin-index-{digest}.json"
            try:
                self._index = json.loads(cache.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._index = _build_index([ep.name for ep, _ in pending])
                with contextlib.suppress(OSError):
                    cache.parent.mkdir(parents=True, exist_ok=True)
                    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
                    tmp.write_text(json.dumps(self._index), encoding="utf-8")
                    tmp.replace(cache)
        return self._index

    def _load_for(self, kind: str, name: str) -> None:
        """Import only the entry point that registers ``name`` (all of them if the index
        does not know it: an unknown name then lists everything that is installed)."""
        if not self._pending or name in self._entries[kind]:
            return
        entry = self.index()["names"].get(kind, {}).get(name)
        self.load({entry} if entry else None)

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
        return [p for p in self.plugins if p.error]

    def add_plugin(self, module: Any, info: PluginInfo) -> None:
        """Register one plugin module (or object) and collect what its hooks register."""
        self._plugins.append(info)
        try:
            self.manager.register(module, name=info.name)
        except Exception as exc:  # pluggy validation errors (unknown hook, bad arguments), duplicate name
            info.add_error(_short_error(exc))
            return
        info.loaded = True
        info.hooks = sorted(name for name in HOOKS if callable(getattr(module, name, None)))
        for kind, hook_name in _HOOK_OF_KIND.items():
            implementation = getattr(module, hook_name, None)
            if implementation is None:
                continue
            with _contained(info, f"{hook_name} raised"):
                implementation(register=self._registrar(kind, info))

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

    # ------------------------------------------------------------- lookups

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
        return sorted(self.entries[kind])

    def datasets(self) -> dict[str, Dataset]:
        return {name: entry.obj for name, entry in sorted(self.entries["dataset"].items())}

    def distributions(self) -> dict[str, str]:
        """Distribution name -> version of every loaded plugin (for the manifest)."""
        return {p.distribution: p.version for p in self.plugins if p.loaded}

    def _first_result(self, hook_name: str, **kwargs: Any) -> tuple[Any, str | None]:
        """Call a firstresult hook in pluggy's order, naming the plugin whose code failed."""
        if self._pending:
            self.load(set(self.index()["resolvers"]))
        hook = getattr(self.manager.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):
            if impl.hookwrapper or impl.wrapper:
                continue
            try:
                result = impl.function(*(kwargs[name] for name in impl.argnames))
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"{hook_name} of plugin {impl.plugin_name!r} ({self._distribution(impl.plugin_name)}) "
                    f"raised {_short_error(exc)}"
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
        """Let every plugin add its commands; one may not replace a command already there."""
        for plugin in self.plugins:
            module = self.manager.get_plugin(plugin.name)
            implementation = getattr(module, "register_commands", None)
            if implementation is None:
                continue
            before = dict(cli.commands)
            with _contained(plugin, "register_commands raised"):
                implementation(cli=cli)
            for name, command in before.items():
                if cli.commands.get(name) is not command:
                    cli.commands[name] = command
                    plugin.add_error(f"register_commands tried to replace the command {name!r}; kept the original")


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "budgetbench"


def _fingerprint(entry_point: metadata.EntryPoint) -> list[Any]:
    """What the index of ``entry_point`` depends on: its target and its distribution's
    version, and the modification time of its module's files (editable installs change in place)."""
    distribution, version = _distribution_of(entry_point)
    module = entry_point.value.partition(":")[0]
    times: list[float] = []
    with contextlib.suppress(Exception):
        top = module.partition(".")[0]
        spec = importlib.util.find_spec(top)  # a top-level name: imports nothing
        for folder in (spec.submodule_search_locations or []) if spec else []:
            times.extend(sorted(p.stat().st_mtime for p in Path(folder).rglob("*.py")))
        if spec and spec.origin and not spec.submodule_search_locations:
            times.append(Path(spec.origin).stat().st_mtime)
    return [entry_point.name, entry_point.value, distribution, version, max(times, default=0.0), len(times)]


def _build_index(names: list[str]) -> dict[str, Any]:
    """The index, computed by ``python -m budgetbench_core.host.index`` over ``names``."""
    env = {**os.environ, "BUDGETBENCH_LOAD_PLUGINS": ",".join(names)}
    done = subprocess.run(
        [sys.executable, "-m", "budgetbench_core.host.index"], capture_output=True, text=True, env=env, timeout=600
    )
    if done.returncode != 0:
        raise PluginError(f"could not index the installed plugins: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def allowed_plugins() -> set[str] | None:
    raw = os.environ.get("BUDGETBENCH_LOAD_PLUGINS")
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unknown_allowed_message(allowed: set[str], found: list[metadata.EntryPoint]) -> str | None:
    """What is wrong with ``BUDGETBENCH_LOAD_PLUGINS``, or None: the names that are no
    installed entry point (a distribution's name is told the entry points it has) and the valid names."""
    names = sorted({ep.name for ep in found})
    unknown = sorted(allowed - set(names))
    if not unknown:
        return None
    by_distribution: dict[str, list[str]] = {}
    for ep in found:
        by_distribution.setdefault(_normalized(_distribution_of(ep)[0]), []).append(ep.name)
    described = []
    for name in unknown:
        own = sorted(by_distribution.get(_normalized(name), []))
        if own:
            described.append(
                f"{name!r} (a distribution, not an entry point; its entry point{'s' if len(own) > 1 else ''}: "
                f"{', '.join(own)})"
            )
            continue
        close = difflib.get_close_matches(name, names, n=1)
        described.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return (
        f"budgetbench: BUDGETBENCH_LOAD_PLUGINS names no installed entry point: {', '.join(described)}; "
        f"these are not loaded. Valid entry-point names: {', '.join(names) or 'none'}"
    )


_warned_allowed: set[str] = set()


def _warn_unknown_allowed(allowed: set[str], found: list[metadata.EntryPoint]) -> None:
    """Warn on stderr (once per process and setting) about unknown names in ``BUDGETBENCH_LOAD_PLUGINS``."""
    message = unknown_allowed_message(allowed, found)
    if message and message not in _warned_allowed:
        _warned_allowed.add(message)
        print(message, file=sys.stderr)


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
