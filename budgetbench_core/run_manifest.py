"""The manifest of a run directory (``manifest.json``): what ran, with which versions, under which
run identity.

One dataclass, built by ``engine.manifest`` and read back by the runner (a resume), the report,
``merge`` and the CLI, so a field cannot be written without being documented: it is the single
source of docs/manifest.md (``python -m budgetbench_core.run_manifest``; a test fails when the page
and the class disagree). Every field may be absent from a manifest an older
release wrote, so every field has a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .events import SCHEMA_VERSION, SchemaError, migration


def _doc(text: str, factory: Any = None, late: bool = False) -> Any:
    """A field with its documentation; ``late`` fields are written only once they are known."""
    metadata = {"doc": text, "late": late}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=None, metadata=metadata)


@dataclass(kw_only=True)
class Manifest:
    """What a run records about itself, written before its first model call and again when an
    invocation ends."""

    schema_version: str | None = _doc("the version of the event schema the rows follow (see [events](events.md))")
    run_key: str | None = _doc(
        "hash of `identity`: rows of another key are never reused (see [Run identity](events.md#run-identity))"
    )
    identity: dict[str, Any] | None = _doc("the fields `run_key` is made of")
    config: dict[str, Any] = _doc("every run option (`RunConfig`; no secrets)", dict)
    started: str | None = _doc("UTC ISO time the first invocation started")
    versions: dict[str, str] = _doc("version of the core (`budgetbench`), Python and every loaded distribution", dict)
    plugins_used: dict[str, dict[str, Any]] = _doc("`kind:name` -> `{distribution, version}` of each plugin used", dict)
    price: dict[str, Any] | None = _doc("the price every $ figure of the report is tokens times (`--price`)")
    read_paths: dict[str, Any] | None = _doc("the folders each confined strategy declared it reads (`read_paths()`)")
    network_hosts: dict[str, Any] | None = _doc(
        "the outside hosts each confined strategy declared it needs (`network_hosts()`), let through the proxy"
    )
    task: dict[str, Any] | None = _doc("the task's own notes (`manifest_notes()`)")
    data_files: dict[str, str] | None = _doc("path -> sha256 of every file the task read")
    grader: dict[str, Any] | None = _doc("`{name, version, binary, judge_model}`")
    strategies: dict[str, Any] | None = _doc("what each strategy described of itself")
    model: dict[str, Any] | None = _doc("the answering backend's description")
    judge: dict[str, Any] | None = _doc("the judge backend's description; null without a judge")
    tokenizer: dict[str, Any] | None = _doc("`{id, backend, exact}` of the tokenizer that counted")
    plugin_failures: list[dict[str, Any]] = _doc(
        "plugins that failed to load: `{name, distribution, version, error}`", list
    )
    git_commit: str | None = _doc("the core's git commit, when it runs from a checkout")
    host: dict[str, Any] | None = _doc("`{node, platform, cpus}` of the machine")
    invocations: list[dict[str, Any]] = _doc(
        "one `{started, finished, calls_made, plugin_workers, plugin_shared_memory}` per invocation (a resume "
        "adds one; `plugin_workers`: worker processes started per strategy, descriptions included; "
        "`plugin_shared_memory`: per strategy, `private` when its workers' /dev/shm is a tmpfs of their own, "
        "else `shared: ` and why); a process killed with -9 leaves `finished: null`",
        list,
    )
    calls_made: int | None = _doc("model calls made by all invocations", late=True)
    undeclared_network: list[Any] | None = _doc(
        "connections refused to hosts no strategy declared, outside any cell", late=True
    )
    selected_items: dict[str, Any] | None = _doc(
        "task -> `{count, ids, complete}`: every item id of the selection in load order; `complete` is false "
        "when the invocation stopped before the task was read to its end",
        late=True,
    )
    shards: dict[str, Any] | None = _doc("`budgetbench merge` only: `{count, merged, missing}`", late=True)
    merged: dict[str, Any] | None = _doc(
        "`budgetbench merge` only: `{at, from}`, each input's path, run id, shards, host, git commit, start and "
        "`calls_made`",
        late=True,
    )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``manifest.json`` (a late field only once it is set)."""
        return {
            item.name: getattr(self, item.name)
            for item in fields(self)
            if not (item.metadata["late"] and getattr(self, item.name) is None)
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Manifest:
        """The manifest ``data`` records; one of a schema this release cannot read, or with a field
        this class does not describe, raises ``events.SchemaError`` naming ``where``."""
        if type(data) is not dict:
            raise SchemaError(f"{where}: a manifest is a JSON object, got {type(data).__name__}")
        migration(data.get("schema_version") or SCHEMA_VERSION, where)  # refuses a newer or unknown schema
        unknown = sorted(set(data) - {item.name for item in fields(cls)})
        if unknown:
            raise SchemaError(f"{where}: field(s) {unknown} that a manifest of schema_version {SCHEMA_VERSION} lacks")
        return cls(**data)


def render_markdown() -> str:
    """docs/manifest.md, from the class above."""
    lines = [
        f"# The manifest (schema_version {SCHEMA_VERSION})",
        "",
        "This page is generated from `budgetbench_core/run_manifest.py` (`python -m budgetbench_core.run_manifest >",
        "docs/manifest.md`); a test fails when they disagree. The rows beside it are described in",
        "[the event schema](events.md).",
        "",
        (Manifest.__doc__ or "").strip().replace("\n    ", "\n"),
        "",
        "`manifest.json` is one JSON object with these fields; those marked *late* are written once known",
        "(at the end of an invocation, or by `budgetbench merge`). `config.executor`, `config.executor_options`",
        "and `config.shard` say how units were scheduled (never part of `run_key`).",
        "",
        "| field | type | meaning |",
        "|---|---|---|",
    ]
    for item in fields(Manifest):
        late = " (*late*)" if item.metadata["late"] else ""
        kind = str(item.type).replace("|", "\\|")
        lines.append(f"| `{item.name}` | {kind} | {item.metadata['doc']}{late} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
