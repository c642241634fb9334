"""``budgetbench merge RUN... -o OUT``: combine the shard directories of one run into one.

Shards (``--shard i/N``) are separate run directories of the same experiment. Merging
verifies each shard (``integrity.verify_run``: every line chained under the shard's key,
every row of the run's key, no second terminal row for a cell, every saved retrieval and
cache entry MAC'd under the shard's key), checks that they are the same experiment (same
run identity), that together they are the shards of one partition with none twice, that
every row in a shard belongs to that shard and that the shards read the same items; then it
writes one run directory, its rows chained (and its retrievals and cache entries MAC'd) again
under a key of its own, that ``report`` (and a resumed ``run``) reads as if the run had been
done in one go.
The run-level logs (``episodes.jsonl``, ``late_calls.jsonl``, ``items.jsonl``) are merged by
cell (and item) key like the cell files. Nothing is merged in place: the result is assembled
beside ``OUT`` and moved there at the end, so an interrupted merge leaves no half directory,
and the inputs are never changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from .cache import CACHE_FILE, ResponseCache, cache_entries
from .events import SchemaError
from .integrity import INTEGRITY_FILE, ITEMS_LOG, RUN_LOGS, chained_files, read_record, verify_run
from .retrievals import RETRIEVALS, read_retrieval, retrieval_files, write_retrieval
from .run_manifest import Manifest
from .runlog import TERMINAL_EVENTS, EventLog, load_manifest, now, read_events, write_json_atomic
from .shards import Shard

# Until every manifest carries a run_key: the config fields that make two runs one experiment.
_IDENTITY_CONFIG = (
    "task",
    "task_options",
    "strategies",
    "strategy_params",
    "budgets",
    "repeats",
    "model",
    "api_base",
    "tokenizer",
    "grader",
    "judge_model",
    "limit",
    "seed",
    "temperature",
    "max_output_tokens",
    "max_ingest_loss",
)
# Files of a run directory that merge writes itself rather than copies.
_OWN = {"manifest.json", "cache.sqlite", "cache.sqlite-wal", "cache.sqlite-shm", ".lock", INTEGRITY_FILE, *RUN_LOGS}
_SKIPPED_DIRS = {"cells", "report", RETRIEVALS}


class MergeError(ValueError):
    """Shard directories that cannot be merged; the message names the directory and the field."""


@dataclass
class MergeSummary:
    out: Path
    inputs: list[Path]
    shard_count: int
    shards: list[int]
    missing_shards: list[int]
    rows: int
    terminal_rows: int
    cache_entries: int


def _identity(manifest: Manifest) -> dict[str, Any]:
    """What must be equal across shards: the run key when the manifest has one, else the config
    fields that define the experiment and the versions of the plugins that produced the rows."""
    if manifest.run_key:
        return {"run_key": manifest.run_key}
    identity = {name: manifest.config.get(name) for name in _IDENTITY_CONFIG}
    identity["plugins_used"] = manifest.plugins_used
    identity["tokenizer_info"] = manifest.tokenizer
    return identity


def _covered(run_dir: Path, manifest: Manifest) -> tuple[int, set[int]]:
    """(N, shard indices) a run directory holds: one shard, the shards of an earlier merge, or
    the whole partition (N = 1) for a run made without ``--shard``."""
    merged = manifest.shards
    if merged:
        return int(merged["count"]), {int(i) for i in merged["merged"]}
    spec = manifest.config.get("shard")
    if spec is None:
        return 1, {1}
    shard = Shard.parse(spec)
    return shard.count, {shard.index}


@contextlib.contextmanager
def _not_running(run_dirs: Sequence[Path]) -> Iterator[None]:
    """Hold every input's run lock, so no shard still being written is merged half done."""
    with contextlib.ExitStack() as stack:
        for run_dir in run_dirs:
            handle = stack.enter_context(open(run_dir / ".lock", "a"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise MergeError(
                    f"{run_dir} is in use by a running budgetbench run; merge it when it has finished"
                ) from None
        yield


def _merge_cache(sources: Sequence[tuple[Path, bytes]], target: Path, key: bytes) -> int:
    """Copy the entries of every source cache (each verified under its shard's key) into
    ``target``, MAC'd under the merged run's ``key`` (first copy of a key wins: the same key is
    the same request, and a run keeps the first reply it got)."""
    merged = ResponseCache(target, key)
    try:
        for path, source_key in sources:
            merged.add((entry, text) for entry, text in cache_entries(path, source_key) if text is not None)
        return merged.count()
    finally:
        merged.close()


def _merge_retrievals(source_root: Path, source_key: bytes, target_root: Path, key: bytes) -> None:
    """Each saved retrieval of a shard, verified under its key, saved again under the merged
    run's; one retrieval saved with two contents by two shards is an error."""
    for path in retrieval_files(source_root):
        record = read_retrieval(source_root, path, source_key)
        target = target_root / path.relative_to(source_root)
        if not target.exists():
            write_retrieval(target_root, target, record, key)
        elif read_retrieval(target_root, target, key) != record:
            raise MergeError(
                f"{path.relative_to(source_root)} differs between the shards ({source_root} and an earlier "
                f"input): the shards did not compute the same thing"
            )


def _copy_extra(source_root: Path, target_root: Path) -> None:
    """Copy files merge does not build itself (config copies); one path holding two different
    contents in two shards is an error, never a silent choice."""
    for path in sorted(source_root.rglob("*")):
        relative = path.relative_to(source_root)
        if not path.is_file() or relative.parts[0] in _SKIPPED_DIRS or str(relative) in _OWN:
            continue
        if path.name.endswith(".tmp"):  # an atomic write cut short
            continue
        target = target_root / relative
        if target.exists():
            if target.read_bytes() != path.read_bytes():
                raise MergeError(
                    f"{relative} differs between the shards ({source_root} and an earlier input): "
                    f"the shards did not compute the same thing"
                )
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _new_item(
    event: dict[str, Any], run_dir: Path, items: dict[tuple, tuple[Any, Path]], path: Path, number: int
) -> bool:
    """Whether an ``items.jsonl`` row is the first of its item; the same item read with other
    content by two shards is an error (they ran on different data)."""
    key = (event.get("run_key"), event.get("item_id"))
    seen = items.get(key)
    if seen is None:
        items[key] = (event.get("digest"), run_dir)
        return True
    if seen[0] != event.get("digest"):
        raise MergeError(
            f"{path}: line {number}: item {event.get('item_id')!r} has other content in {run_dir} than in "
            f"{seen[1]} (digest {event.get('digest')} vs {seen[0]}): the shards read different data"
        )
    return False


def merge_runs(
    inputs: Sequence[Path], out: Path, allow_partial: bool = False, key_files: Sequence[Path] = ()
) -> MergeSummary:
    """Merge the shard directories ``inputs`` into the new run directory ``out``; ``key_files``
    hold the keys of shards made on other machines (see ``integrity.find_key``)."""
    inputs = [Path(p) for p in inputs]
    out = Path(out)
    if not inputs:
        raise MergeError("give at least one shard directory to merge")
    if len({p.resolve() for p in inputs}) != len(inputs):
        raise MergeError("the same directory is given twice")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MergeError(f"{out} already exists and is not empty: merge into a new directory")
    if any(out.resolve() == p.resolve() for p in inputs):
        raise MergeError(f"{out} is one of the inputs: merge into a new directory")
    manifests = []
    for run_dir in inputs:
        try:
            manifest = load_manifest(run_dir) if run_dir.is_dir() else None
        except SchemaError as exc:
            raise MergeError(str(exc)) from None
        if manifest is None:
            raise MergeError(f"{run_dir} is not a run directory (no manifest.json)")
        manifests.append(manifest)

    keys = []  # each shard's key, to read its retrievals and cache entries
    for run_dir, manifest in zip(inputs, manifests):
        verified = verify_run(run_dir, key_files, run_key=manifest.run_key)
        if not verified.ok or verified.key is None:
            raise MergeError(verified.refusal("merge"))
        keys.append(verified.key)

    reference = _identity(manifests[0])
    for run_dir, manifest in zip(inputs[1:], manifests[1:]):
        identity = _identity(manifest)
        changed = sorted(k for k in reference.keys() | identity.keys() if reference.get(k) != identity.get(k))
        if changed:
            details = "; ".join(f"{k}: {reference.get(k)!r} in {inputs[0]} but {identity.get(k)!r}" for k in changed)
            raise MergeError(
                f"{run_dir} is a different run from {inputs[0]} ({details}); only shards of one run can be merged"
            )

    coverage = [_covered(run_dir, manifest) for run_dir, manifest in zip(inputs, manifests)]
    counts = {count for count, _ in coverage}
    if len(counts) != 1:
        detail = ", ".join(f"{d}: shards of {count}" for d, (count, _) in zip(inputs, coverage))
        raise MergeError(f"the inputs are shards of different partitions ({detail})")
    shard_count = counts.pop()
    seen: dict[int, Path] = {}
    for run_dir, (_, indices) in zip(inputs, coverage):
        for index in sorted(indices):
            if index in seen:
                what = (
                    "the whole run (it was made without --shard)"
                    if shard_count == 1
                    else f"shard {index}/{shard_count}"
                )
                raise MergeError(f"{run_dir} and {seen[index]} both hold {what}: each shard may be merged once")
            seen[index] = run_dir
    missing = sorted(set(range(1, shard_count + 1)) - seen.keys())
    if missing and not allow_partial:
        raise MergeError(
            f"shards {', '.join(f'{i}/{shard_count}' for i in missing)} are missing; merge them too, "
            f"or pass --allow-partial to merge an incomplete run (a later run of the same command "
            f"without --shard on the merged directory fills in the missing units)"
        )

    task = manifests[0].config["task"]
    tmp = out.with_name(f".{out.name}.merging-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    rows = terminal = 0
    items: dict[tuple, tuple[Any, Path]] = {}  # (run_key, item id) -> (digest, the shard that read it)
    with _not_running(inputs):
        try:
            tmp.mkdir(parents=True)
            log = EventLog(tmp)
            for run_dir, source_key, (_, indices) in zip(inputs, keys, coverage):
                shards = [Shard(i, shard_count) for i in sorted(indices)]
                for path in chained_files(run_dir):
                    relative = path.relative_to(run_dir)
                    for number, event in enumerate(read_events(path), start=1):
                        if relative.name == ITEMS_LOG:
                            if not _new_item(event, run_dir, items, path, number):
                                continue
                        elif not any(
                            s.owns(event.get("task", task), event["strategy"], event["item_id"]) for s in shards
                        ):
                            raise MergeError(
                                f"{path}: line {number} (strategy {event['strategy']!r}, item "
                                f"{event['item_id']!r}) does not belong to the shards this "
                                f"directory holds ({', '.join(map(str, shards))})"
                            )
                        log.append(event, tmp / relative)
                        rows += 1
                        terminal += relative.parts[0] == "cells" and event.get("event") in TERMINAL_EVENTS
                _copy_extra(run_dir, tmp)
                _merge_retrievals(run_dir, source_key, tmp, log.key)
            caches = [(d / CACHE_FILE, k) for d, k in zip(inputs, keys) if (d / CACHE_FILE).exists()]
            entries = _merge_cache(caches, tmp / CACHE_FILE, log.key) if caches else 0
            log.close()
            manifest = dataclasses.replace(
                manifests[0],
                config={**manifests[0].config, "shard": None, "out": str(out)},
                shards={"count": shard_count, "merged": sorted(seen), "missing": missing},
                merged={
                    "at": now(),
                    "from": [
                        {
                            "path": str(d),
                            "run_id": (read_record(d) or {}).get("run_id"),
                            "shards": sorted(c[1]),
                            "host": m.host,
                            "git_commit": m.git_commit,
                            "started": m.started,
                            "calls_made": m.calls_made,
                        }
                        for d, c, m in zip(inputs, coverage, manifests)
                    ],
                },
                started=min(m.started or "" for m in manifests) or None,
                invocations=[i for m in manifests for i in m.invocations],
                calls_made=sum(m.calls_made or 0 for m in manifests),
            )
            write_json_atomic(tmp / "manifest.json", manifest.to_dict())
            if out.exists():
                out.rmdir()  # checked empty above
            tmp.replace(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return MergeSummary(out, inputs, shard_count, sorted(seen), missing, rows, terminal, entries)


@click.command("merge")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--out", "-o", required=True, type=click.Path(path_type=Path), help="New run directory to create.")
@click.option("--allow-partial", is_flag=True, help="Merge even if some shards of the partition are missing.")
@click.option(
    "--key-file",
    "key_files",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="The key of a shard made on another machine (its file from that machine's key store); repeatable.",
)
@click.option("--no-report", is_flag=True, help="Do not write the merged run's report.")
def merge_command(
    runs: tuple[Path, ...], out: Path, allow_partial: bool, key_files: tuple[Path, ...], no_report: bool
) -> None:
    """Combine the shard directories of one run (--shard i/N) into one run directory and write its report."""
    summary = merge_runs(runs, out, allow_partial=allow_partial, key_files=key_files)
    missing = (
        f", missing {', '.join(f'{i}/{summary.shard_count}' for i in summary.missing_shards)}"
        if summary.missing_shards
        else ""
    )
    click.echo(
        f"{summary.out}: merged {len(summary.inputs)} directories (shards "
        f"{', '.join(f'{i}/{summary.shard_count}' for i in summary.shards)}{missing}), {summary.rows} rows, "
        f"{summary.terminal_rows} terminal, {summary.cache_entries} cached replies"
    )
    if not no_report:
        _write_merged_report(summary.out)


def _write_merged_report(run_dir: Path) -> None:
    """The merged run's report, as ``run`` writes one at its end (errors only included); a
    report that cannot be written leaves the merge in place and exits 1."""
    from .runlog import final_rows

    if not final_rows(run_dir):
        click.echo("no report: no cell finished")
        return
    from .report import write_report

    try:
        paths = write_report(run_dir)
    except Exception as exc:  # the merged rows are safe on disk; say how to retry the report alone
        click.echo(
            f"error: the report could not be written ({type(exc).__name__}: {exc}); the merged run is "
            f"saved: fix and run `budgetbench report {run_dir}`",
            err=True,
        )
        raise SystemExit(1) from exc
    click.echo(f"report: {paths.get('html', run_dir / 'report')}")
