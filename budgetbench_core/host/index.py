"""Print the plugin index as one JSON line: run in a child process by ``plugins.Registry.index``,
so the plugins' import-time code never runs in the harness that asks."""

from __future__ import annotations

import json

from ..plugins import Registry


def index() -> dict:
    registry = Registry.discover().load()
    names = {
        kind: {name: entry.plugin.name for name, entry in sorted(entries.items())}
        for kind, entries in registry.entries.items()
    }
    resolvers = sorted(
        p.name for p in registry.plugins if {"resolve_backend", "resolve_tokenizer"}.intersection(p.hooks)
    )
    return {"names": names, "resolvers": resolvers}


if __name__ == "__main__":
    print(json.dumps(index()))
