"""Print the plugin index as one JSON line: run in a child process by ``plugin_index``,
so the plugins' import-time code never runs in the harness that asks.

Every installed plugin is imported here, so this process confines itself first, with the
policy its parent computed and passed as the one argument (nothing a plugin plants can widen
it), and records what confined it in the index (``sandbox``)."""

from __future__ import annotations

import json
import sys

from ..plugins import HOOKS, Registry
from .landlock import abi_version, confine


def index() -> dict:
    registry = Registry.discover().load()
    names = {
        kind: {name: entry.plugin.name for name, entry in sorted(entries.items())}
        for kind, entries in registry.entries.items()
    }
    resolvers = sorted(
        p.name for p in registry.plugins if {"resolve_backend", "resolve_tokenizer"}.intersection(p.hooks)
    )
    wrappers = sorted(
        {
            impl.plugin_name
            for hook in HOOKS
            for impl in getattr(registry.manager.hook, hook).get_hookimpls()
            if impl.hookwrapper or impl.wrapper
        }
    )
    commands = sorted(p.name for p in registry.plugins if "register_commands" in p.hooks)
    failed = {p.name: p.error for p in registry.failures}
    executor_options = {name: dict(entry.obj.options) for name, entry in registry.entries["executor"].items()}
    return {
        "names": names,
        "resolvers": resolvers,
        "wrappers": wrappers,
        "commands": commands,
        "failed": failed,
        "executor_options": executor_options,
    }


def main(policy: dict) -> None:
    """Confine this process with ``policy``, then index; where Landlock exists but refuses,
    import nothing (never a silent fallback to an unconfined index)."""
    sandbox = confine(policy)
    if sandbox["sandbox"] == "none" and abi_version() > 0:
        sys.exit(f"budgetbench: the plugin index could not be confined: {sandbox.get('reason')}")
    print(json.dumps({**index(), "sandbox": sandbox}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
