"""Which entry points may load, and the guard every piece of plugin code runs under.

A plugin that fails to import, raises (even ``SystemExit``) or prints while it loads is
recorded on its ``PluginInfo`` and the others still load; what it printed is kept off
stdout (``list-plugins --json`` stays valid JSON). ``BUDGETBENCH_LOAD_PLUGINS=a,b``
restricts loading to those entry-point names, with a warning for names that are none.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata

GROUP = "budgetbench"


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

    @classmethod
    def of(cls, entry_point: metadata.EntryPoint) -> PluginInfo:
        dist = getattr(entry_point, "dist", None)
        distribution, version = (dist.metadata["Name"], dist.version) if dist else ("unknown", "unknown")
        return cls(entry_point.name, distribution, version, value=entry_point.value)

    def add_error(self, message: str) -> None:
        self.error = message if not self.error else f"{self.error}; {message}"


def short_error(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" ({frame.filename}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


@contextlib.contextmanager
def _captured_output(text: io.StringIO) -> Iterator[None]:
    """Collect what plugin code prints into ``text``, at the file-descriptor level too
    (``os.write(1, ...)``, C extensions), so a plugin cannot corrupt machine-readable output."""
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
def contained(info: PluginInfo, failure: str) -> Iterator[None]:
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
        info.add_error(f"{failure} {short_error(exc)}")
    finally:
        if printed.getvalue():
            info.output += printed.getvalue()
            print(
                f"budgetbench: plugin {info.name!r} ({info.distribution}) printed while loading "
                f"(kept off stdout): {printed.getvalue()[:500]!r}",
                file=sys.stderr,
            )


def allowed_plugins() -> set[str] | None:
    """The entry-point names ``BUDGETBENCH_LOAD_PLUGINS`` allows, or None for all."""
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
        by_distribution.setdefault(_normalized(PluginInfo.of(ep).distribution), []).append(ep.name)
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


def installed_entry_points() -> tuple[list[metadata.EntryPoint], set[str]]:
    """Every installed entry point of the group, and the names ``BUDGETBENCH_LOAD_PLUGINS``
    blocks; unknown names in the variable are warned about on stderr once per process."""
    found = sorted(metadata.entry_points(group=GROUP), key=lambda ep: ep.name)
    allowed = allowed_plugins()
    if allowed is None:
        return found, set()
    message = unknown_allowed_message(allowed, found)
    if message and message not in _warned_allowed:
        _warned_allowed.add(message)
        print(message, file=sys.stderr)
    return found, {ep.name for ep in found} - allowed
