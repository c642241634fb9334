"""The plugin index: which entry point registers each name, so a lookup imports only that one.

It is computed by importing the plugins in a child process (``host.index``), so no plugin's
import-time code runs in the harness that asks, and cached on disk keyed by the installed
entry points, their distributions' versions and their files (editable installs change in place).
Every installed plugin is imported there, used in the run or not, so the child is a plugin's
process like a worker: no credential in its environment and, with Landlock, confined before the
first import to the Python environment and the plugins' code, a temporary folder and no TCP.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from .plugin_loading import PluginError, PluginInfo

FORMAT = 3  # bumped when the index gains a field: older cache files are then not read


def plugin_index(entry_points: list[metadata.EntryPoint]) -> dict[str, Any]:
    """``{"names": {kind: {name: entry point}}, "failed": {entry point: error}}`` and the entry points
    that implement a resolution hook (``"resolvers"``), ``register_commands`` (``"commands"``) or a
    wrapper (``"wrappers"``): what a lookup, a resolution or the CLI must import; and each executor's
    options (``"executor_options"``), which the ``run`` command offers without importing it."""
    ordered = sorted(entry_points, key=lambda ep: ep.name)
    key = json.dumps([FORMAT, *(_fingerprint(ep) for ep in ordered)])
    cache = _cache_dir() / f"plugin-index-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    with contextlib.suppress(OSError, ValueError):
        return json.loads(cache.read_text(encoding="utf-8"))
    index = _build_index(ordered)
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index), encoding="utf-8")
        tmp.replace(cache)
    return index


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "budgetbench"


def _fingerprint(entry_point: metadata.EntryPoint) -> list[Any]:
    """What the index of ``entry_point`` depends on: its target and its distribution's
    version, and the modification time of its module's files."""
    info = PluginInfo.of(entry_point)
    times: list[float] = []
    with contextlib.suppress(Exception):
        top = entry_point.value.partition(":")[0].partition(".")[0]
        spec = importlib.util.find_spec(top)  # a top-level name: imports nothing
        for folder in (spec.submodule_search_locations or []) if spec else []:
            times.extend(sorted(p.stat().st_mtime for p in Path(folder).rglob("*.py")))
        if spec and spec.origin and not spec.submodule_search_locations:
            times.append(Path(spec.origin).stat().st_mtime)
    return [entry_point.name, entry_point.value, info.distribution, info.version, max(times, default=0.0), len(times)]


def _build_index(entry_points: list[metadata.EntryPoint]) -> dict[str, Any]:
    """The index, computed by ``python -m budgetbench_core.host.index`` over ``entry_points``,
    with the policy it confines itself with before importing them (``_policy``)."""
    names = [ep.name for ep in entry_points]
    with tempfile.TemporaryDirectory(prefix="budgetbench-index-") as scratch:
        command = [sys.executable, "-m", "budgetbench_core.host.index", json.dumps(_policy(entry_points, scratch))]
        done = subprocess.run(command, capture_output=True, text=True, env=_environment(names, scratch), timeout=600)
    if done.returncode != 0:
        raise PluginError(f"could not index the installed plugins: {done.stderr.strip()[-2000:]}")
    index = json.loads(done.stdout.strip().splitlines()[-1])
    if index["sandbox"]["sandbox"] == "none":  # said, as a run's identity says it: never unconfined silently
        print(
            f"budgetbench: the installed plugins were indexed without a sandbox ({index['sandbox'].get('reason')}): "
            f"their import-time code could read and write your files and reach the network (no credential)",
            file=sys.stderr,
        )
    return index


def _environment(names: list[str], scratch: str) -> dict[str, str]:
    """A worker's inherited environment (``host.pool``: no credential), plus what the import
    system needs (``HOME`` for the user's site folder, ``PYTHONPATH``) and the scratch folder
    as the place for temporary files and caches (matplotlib's font cache, say)."""
    from .host.pool import inherited_environment  # here: a worker's Registry never builds an index

    env = inherited_environment()
    env.update({k: os.environ[k] for k in ("HOME", "PYTHONPATH") if k in os.environ})
    env.update(TMPDIR=scratch, XDG_CACHE_HOME=scratch, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["BUDGETBENCH_LOAD_PLUGINS"] = ",".join(names)
    return env


def _policy(entry_points: list[metadata.EntryPoint], scratch: str) -> dict[str, Any]:
    """What the index's child may reach once confined (``landlock.confine``, which adds the
    Python environment): each plugin's code and distribution metadata, the names in the folder
    that holds it (for importlib.metadata to find it), writes in ``scratch`` only, no TCP port."""
    from .host.pool import code_locations

    read, folders = code_locations({"entry_points": [ep.name for ep in entry_points]}), []
    for ep in entry_points:
        where = getattr(ep.dist, "_path", None)  # the .dist-info folder (a PathDistribution's)
        if where is not None and os.path.isdir(where):
            read.append(str(where))
            folders.append(str(Path(where).parent))
    return {"read": read, "list": folders, "write": [scratch], "ports": []}
