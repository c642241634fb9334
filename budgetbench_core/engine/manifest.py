"""What a run records about itself: its identity (hashed into the run key), its manifest, and
the cells already finished under that key (a resume runs only the rest)."""

from __future__ import annotations

import os
import platform
import subprocess
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from ..events import FINAL_EVENTS, SCHEMA_VERSION, TERMINAL_EVENTS, CellKey
from ..host.pool import sandbox_name
from ..identity import known_identities, mismatch_message, record_identity
from ..run_config import RunConfig, RunConfigError
from ..run_manifest import Manifest
from ..runlog import iter_events
from ..sandbox import json_safe_or_empty
from ..tokenizers import Tokenizer
from .run_plugins import RunPlugins


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def identity(
    config: RunConfig, plugins: RunPlugins, tokenizer: Tokenizer, data_files: dict[str, str]
) -> dict[str, Any]:
    """Everything that changes the experiment (hashed into ``run_key``)."""
    c = config
    return {
        "task": c.task,
        "task_options": json_safe_or_empty(c.task_options),
        "data_files": data_files,
        "strategies": {name: json_safe_or_empty(c.strategy_params.get(name, {})) for name in sorted(c.strategies)},
        "budgets": sorted(c.budgets),
        "repeats": c.repeats,
        "limit": c.limit,
        "model": c.model,
        "api_base": c.api_base,
        "tokenizer": tokenizer_identity(plugins, tokenizer),
        "grader": {"name": plugins.grader_name, "version": str(plugins.grader.version)},
        "judge_model": c.judge_model,
        "seed": c.seed,
        "temperature": c.temperature,
        "max_output_tokens": plugins.max_output_tokens,
        "max_ingest_loss": c.max_ingest_loss,
        "server_prompt_cache": c.server_prompt_cache,
        "isolation": (
            {"isolation": "process", "sandbox": sandbox_name()}
            if c.isolation == "process"
            else {"isolation": "none", "sandbox": "none"}
        ),
        "versions": plugins.versions(),
        **({"prompts_only": True} if c.prompts_only else {}),  # absent otherwise: older keys stay valid
    }


def tokenizer_identity(plugins: RunPlugins, tokenizer: Tokenizer) -> dict[str, Any]:
    """The tokenizer's id, backend and exactness; a ``server`` tokenizer is the served model's own,
    so its id (which names an ephemeral port) is left to the model and api base fields."""
    spec = plugins.tokenizer_spec()
    info = tokenizer.info.to_dict()
    if spec.partition(":")[0] == "server":
        info["id"] = "server"
    return {"spec": spec, **info}


def manifest(
    config: RunConfig,
    plugins: RunPlugins,
    tokenizer: Tokenizer,
    run_key: str,
    started: str,
    identity: dict[str, Any],
    strategies: dict[str, Any],
    read_paths: dict[str, Any],
    network_hosts: dict[str, Any],
    price: Any,
    invocations: list[dict[str, Any]],
) -> Manifest:
    """The manifest a run writes before its first call (``strategies``: what each described)."""
    used = {("task", config.task), ("grader", plugins.grader_name)} | {("strategy", s) for s in config.strategies}
    return Manifest(
        schema_version=SCHEMA_VERSION,
        run_key=run_key,
        identity=identity,
        config=json_safe_or_empty(config.to_dict()),
        started=started,
        versions={
            "budgetbench": metadata.version("budgetbench"),
            "python": platform.python_version(),
            **plugins.registry.distributions(),
        },
        plugins_used={
            f"{kind}:{name}": {
                "distribution": plugins.plugin_of(kind, name).distribution,
                "version": plugins.plugin_of(kind, name).version,
            }
            for kind, name in sorted(used)
        },
        price=price.to_dict() if price is not None else None,
        read_paths=read_paths,
        network_hosts=network_hosts,
        task=json_safe_or_empty(plugins.task.manifest_notes()),
        data_files=identity["data_files"],
        grader={
            "name": plugins.grader_name,
            "version": str(plugins.grader.version),
            "binary": bool(plugins.grader.binary),
            "judge_model": config.judge_model,
        },
        strategies=strategies,
        model=json_safe_or_empty(plugins.backend.describe()),
        judge=json_safe_or_empty(plugins.judge_backend.describe()) if plugins.judge_backend else None,
        tokenizer=tokenizer.info.to_dict(),
        plugin_failures=[
            {"name": p.name, "distribution": p.distribution, "version": p.version, "error": p.error}
            for p in plugins.registry.failures
        ],
        git_commit=_git_commit(),
        host={"node": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()},
        invocations=invocations,
    )


def finished_cells(
    run_dir: Path, run_key: str, manifest: Manifest | None, identity: dict[str, Any], prompts_only: bool
) -> set[CellKey]:
    """Cells already finished under the current run_key; rows of any other key stop the run."""
    done: dict[CellKey, str] = {}
    foreign: Counter = Counter()
    for event in iter_events(run_dir):
        key = event.get("run_key")
        if key != run_key:
            foreign[key] += 1
            continue
        if event.get("event") in TERMINAL_EVENTS:
            done[CellKey.of(event)] = event["event"]
    if manifest and manifest.run_key not in (None, run_key) and not foreign:
        foreign[manifest.run_key] = 0
    elif manifest and manifest.run_key is None and not foreign and manifest.config:
        foreign[None] = 0
    known = known_identities(run_dir, manifest)
    if foreign:
        raise RunConfigError(mismatch_message(run_dir, run_key, identity, foreign, known))
    record_identity(run_dir, run_key, identity, known)
    keep = (*FINAL_EVENTS, "admitted") if prompts_only else FINAL_EVENTS
    return {cell for cell, kind in done.items() if kind in keep}
