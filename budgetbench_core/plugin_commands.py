"""Commands for plugin authors and data: ``new-plugin``, ``check-plugin``, ``data fetch`` and ``data status``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import sys
from importlib import metadata
from pathlib import Path

import click
import jinja2
from rich.console import Console
from rich.table import Table

from .data_files import data_dir, dataset_status
from .datasets import Dataset
from .plugins import UnknownNameError, get_registry

console = Console(stderr=True)

TEMPLATE_DIR = Path(__file__).resolve().parent / "plugin_template"
KINDS = {"strategy": "strategy", "memory-system": "memory"}
_NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")


# ----------------------------------------------------------------- new-plugin


def render_template(kind: str, name: str, destination: Path) -> Path:
    """Render the plugin template for ``kind`` into ``destination/budgetbench-<kind>-<name>``."""
    if kind not in KINDS:
        raise click.BadParameter(f"kind must be one of {', '.join(KINDS)}, got {kind!r}", param_hint="KIND")
    if not _NAME.match(name):
        raise click.BadParameter(
            f"{name!r}: use lower-case letters and digits, words joined by '-' or '_' (e.g. my-strategy)",
            param_hint="NAME",
        )
    words = re.split(r"[-_]", name)
    module = f"budgetbench_{KINDS[kind]}_{'_'.join(words)}"
    values = {
        "kind": kind,
        "name": name,
        "module": module,
        "class_name": "".join(w.capitalize() for w in words),
        "distribution": f"budgetbench-{KINDS[kind]}-{'-'.join(words)}",
        "entry_point": f"{KINDS[kind]}-{'-'.join(words)}",
    }
    target = destination / values["distribution"]
    if target.exists():
        raise click.UsageError(f"{target} already exists; choose another NAME or --dir")
    _refuse_taken(name, values["distribution"])
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    for source in sorted(TEMPLATE_DIR.rglob("*.j2")):
        relative = source.relative_to(TEMPLATE_DIR).as_posix()
        stem, _, _ = relative.rpartition(".j2")
        for other in KINDS:
            if stem.endswith("." + other):  # a file for one kind only: name.py.strategy.j2
                stem = stem[: -len(other) - 1] if other == kind else ""
        if not stem:
            continue
        path = target / stem.replace("__module__", module)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(environment.get_template(relative).render(**values), encoding="utf-8")
    return target


def _refuse_taken(name: str, distribution: str) -> None:
    """A strategy name or distribution already installed would clash on install (duplicate names
    are an error for both plugins), so refuse it now, naming who has it."""
    registry = get_registry()
    for kind in ("strategy", "task", "grader"):
        if name in registry.entries[kind]:
            owner = registry.entries[kind][name].plugin
            raise click.UsageError(
                f"the name {name!r} is taken: {kind} {name!r} of {owner.distribution}; choose another NAME"
            )
    try:
        installed = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return
    raise click.UsageError(
        f"a distribution {distribution!r} ({installed.version}) is already installed; choose another NAME"
    )


@click.command("new-plugin")
@click.argument("kind", type=click.Choice(list(KINDS)))
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder to create the plugin in.",
)
def new_plugin(kind, name, directory):
    """Create a strategy or memory-system plugin from the template, ready to install and test."""
    target = render_template(kind, name, directory)
    click.echo(f"created {target}")
    python = shlex.quote(sys.executable)  # this environment's pip and pytest, not whatever is on PATH
    script = Path(sys.executable).with_name("budgetbench")
    budgetbench = shlex.quote(str(script)) if script.is_file() else "budgetbench"
    click.echo(
        f"next: {python} -m pip install -e {shlex.quote(str(target))} && {python} -m pytest "
        f"{shlex.quote(str(target / 'tests'))} && {budgetbench} check-plugin {name}"
    )


# ----------------------------------------------------------------- check-plugin


def strategies_of(name: str) -> list[str]:
    """Strategy names for NAME: a strategy itself, or every strategy a plugin/distribution registers."""
    registry = get_registry()
    if name in registry.entries["strategy"]:
        return [name]
    found = [
        s
        for s, entry in sorted(registry.entries["strategy"].items())
        if name in (entry.plugin.name, entry.plugin.distribution)
    ]
    if found:
        return found
    failed = [p for p in registry.failures if name in (p.name, p.distribution)]
    if failed:
        raise UnknownNameError(f"plugin {name!r} failed to load: {failed[0].error}")
    raise UnknownNameError(
        f"no strategy, plugin or distribution named {name!r} registers a strategy or memory system; "
        f"strategies: {', '.join(registry.names('strategy')) or 'none'}"
    )


@click.command("check-plugin")
@click.argument("name")
@click.option(
    "--model",
    "-m",
    default="local",
    show_default=True,
    help="Model for auxiliary calls and the default tokenizer ('local' or a litellm string).",
)
@click.option("--api-base", default=None, help="Server address for openai/<name> models.")
@click.option("--tokenizer", default=None, help="Tokenizer spec (default: the model's exact tokenizer).")
@click.option("--budgets", "-b", default="256 512 1024", show_default=True, help="Budgets to check, in tokens.")
@click.option(
    "--isolation",
    type=click.Choice(["process", "none"]),
    default="process",
    show_default=True,
    help="Run the plugin in a confined worker process, as a run does; 'none' (in this process) is for debugging.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check_plugin(name, model, api_base, tokenizer, budgets, isolation, as_json):
    """Run the conformance kit on a strategy or memory system (or every one a plugin registers).

    Exits 1 when any check fails.
    """
    from .conformance import open_kit
    from .option_values import parse_budgets

    names = strategies_of(name)
    registry = get_registry()
    results: dict[str, list] = {}
    with open_kit(
        model=model, tokenizer=tokenizer, api_base=api_base, budgets=parse_budgets(budgets), isolation=isolation
    ) as kit:
        for strategy in names:
            results[strategy] = kit.run_checks(registry.get("strategy", strategy).obj)
    if as_json:
        click.echo(json.dumps({s: [r.to_dict() for r in rs] for s, rs in results.items()}, indent=2))
    else:
        table = Table(title=f"conformance: {name}")
        for column in ("strategy", "check", "result", "detail"):
            table.add_column(column)
        colours = {"pass": "green", "fail": "red", "skip": "yellow"}
        for strategy, checks in results.items():
            for r in checks:
                table.add_row(strategy, r.check, f"[{colours[r.status]}]{r.status.upper()}[/]", r.detail)
        Console(width=160).print(table)
    if any(r.status == "fail" for checks in results.values() for r in checks):
        raise SystemExit(1)


# ----------------------------------------------------------------- data fetch

CHECKSUMS = "SHA256SUMS"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _offline() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "BUDGETBENCH_OFFLINE")
    )


def _download(source: Dataset, filename: str, target: Path) -> str:
    """Download one file at the repository's current commit; returns that commit."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    commit = get_hf_file_metadata(hf_hub_url(source.repo, filename, repo_type="dataset")).commit_hash
    if commit is None:  # the checksum line records the commit: never download an unnamed revision
        raise RuntimeError(f"the hub named no commit for {source.repo}/{filename}")
    cached = hf_hub_download(source.repo, filename, repo_type="dataset", revision=commit)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".part")
    shutil.copyfile(cached, tmp)
    tmp.replace(target)
    return commit


def _placement_help(dataset: str, source: Dataset, missing: list[str], folder: Path) -> str:
    lines = [f"Place the official {dataset} files yourself:"]
    for remote in missing:
        url = f"https://huggingface.co/datasets/{source.repo}/resolve/main/{remote}"
        lines.append(f"  {folder / source.files.get(remote, Path(remote).name)}\n      downloaded from {url}")
    default = data_dir() / source.folder
    where = f"Task plugins look in {default} by default"
    if folder.resolve() != default.resolve():
        where += f" (set BUDGETBENCH_DATA_DIR={folder.parent} to use {folder})"
    lines.append(where + ", or pass --task-option path=<file>.")
    return "\n".join(lines)


@click.group("data")
def data() -> None:
    """Official benchmark files: where they go and how to get them."""


def dataset_named(name: str | None) -> Dataset:
    """The dataset a plugin registered under ``name``; the error lists every one."""
    datasets = get_registry().datasets()
    if name in datasets:
        return datasets[name]
    listing = "\n".join(f"  {d.name:<20} {d.repo}  {d.description}" for d in datasets.values()) or "  none"
    problem = f"unknown dataset {name!r}" if name else "name a dataset"
    raise click.UsageError(f"{problem}; the installed task plugins register:\n{listing}")


DATA_DIR_OPTION = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Data folder (default: $BUDGETBENCH_DATA_DIR or ~/.cache/budgetbench/data).",
)


@data.command("fetch")
@click.argument("dataset", required=False)
@DATA_DIR_OPTION
@click.option("--file", "files", multiple=True, help="Fetch only this file of the dataset (repeatable).")
@click.option(
    "--from",
    "mirror",
    default=None,
    metavar="URL",
    help="For a dataset pinned to a GitHub commit: download from this copy of the repository at that commit "
    "instead (its root as a file:// or http(s):// URL, e.g. file:///src/LoCoMo for a clone); checksums are checked "
    "all the same.",
)
def fetch(dataset, directory, files, mirror):
    """Download a dataset's official files, recording SHA-256 checksums.

    DATASET is one a task plugin registers (run without it to list them). A dataset pinned
    to a GitHub commit is downloaded at that commit, shows its licence, and a file whose
    SHA-256 is not the pinned one is refused; the others come from the Hugging Face hub.
    Offline (HF_HUB_OFFLINE=1, BUDGETBENCH_OFFLINE=1 or no connection) it says which file to
    place where, and exits 1 if any is missing.
    """
    source = dataset_named(dataset)
    folder = (directory or data_dir()) / source.folder
    unknown = sorted(set(files) - set(source.files))
    if unknown:
        raise click.BadParameter(
            f"{dataset} has no file {unknown[0]!r}; files: {', '.join(source.files)}", param_hint="--file"
        )
    if mirror and not source.commit:
        raise click.BadParameter(
            f"{dataset} is not pinned to a GitHub commit (its files come from the Hugging Face hub {source.repo})",
            param_hint="--from",
        )
    wanted = list(files) or list(source.files)
    missing = [f for f in wanted if not (folder / source.files[f]).is_file()]
    for remote in wanted:
        if remote not in missing:
            click.echo(f"present: {folder / source.files[remote]}{_checked(source, remote, folder)}")
    if not missing:
        return
    if source.manual:
        if len(source.files) == 1:
            places = f"  {folder / source.files[missing[0]]}"
        else:  # several files: say which upstream file goes where
            places = "\n".join(f"  {folder / source.files[remote]}\n      <- {remote}" for remote in missing)
        default = data_dir() / source.folder
        click.echo(
            f"{dataset} is not downloaded by budgetbench: {source.manual}\n"
            f"Place {'it' if len(missing) == 1 else f'these {len(missing)} files'} here:\n{places}\n"
            f"Task plugins look in {default} by default, or pass --task-option path=<file>."
        )
        raise SystemExit(1)
    if source.commit:
        _fetch_pinned(dataset, source, missing, folder, mirror)
        return
    if _offline():
        click.echo(
            "offline (HF_HUB_OFFLINE is set): nothing downloaded.\n" + _placement_help(dataset, source, missing, folder)
        )
        raise SystemExit(1)
    for index, remote in enumerate(missing):
        target = folder / source.files[remote]
        try:
            commit = _download(source, remote, target)
        except Exception as exc:  # no connection, gated repo, moved file: say what to do instead
            click.echo(
                f"could not download {source.repo}/{remote}: {type(exc).__name__}: {str(exc)[:300]}\n"
                + _placement_help(dataset, source, missing[index:], folder)
            )
            raise SystemExit(1) from None
        digest = _sha256(target)
        with (folder / CHECKSUMS).open("a", encoding="utf-8") as sums:
            sums.write(f"{digest}  {target.name}  # {source.repo}@{commit}/{remote}\n")
        click.echo(f"fetched: {target} sha256={digest} ({source.repo}@{commit})")


def _checked(source: Dataset, remote: str, folder: Path) -> str:
    """For a pinned dataset, whether a file already in place is the pinned one (it is kept either way)."""
    if not source.commit:
        return ""
    if _sha256(folder / source.files[remote]) == source.sha256[remote]:
        return f" (sha256 matches {source.repo}@{source.commit[:7]})"
    return (
        f" (sha256 differs from {source.repo}@{source.commit[:7]}: another version; delete it to fetch the pinned one)"
    )


def _pinned_places(source: Dataset, missing: list[str], folder: Path) -> str:
    """Which upstream file goes where, with the digest it must have."""
    lines = [f"Place {'it' if len(missing) == 1 else f'these {len(missing)} files'} here:"]
    for remote in missing:
        lines.append(f"  {folder / source.files[remote]}\n      <- {remote}  sha256 {source.sha256[remote]}")
    lines.append(
        f"(each from {source.url('<path>')}, or a clone: git -C <clone> checkout {source.commit}; "
        f"then `budgetbench data fetch {source.name} --from file://<clone>` copies and checks them)"
    )
    default = data_dir() / source.folder
    where = f"Task plugins look in {default} by default"
    if folder.resolve() != default.resolve():
        where += f" (set BUDGETBENCH_DATA_DIR={folder.parent} to use {folder})"
    lines.append(where + ", or pass --task-option path=<file>.")
    return "\n".join(lines)


def _fetch_pinned(dataset: str, source: Dataset, missing: list[str], folder: Path, mirror: str | None) -> None:
    """Download each missing file at the pinned commit and keep it only if its SHA-256 is the pinned one."""
    click.echo(
        f"{dataset}: https://github.com/{source.repo} at commit {source.commit}\n"
        f"licence: {source.licence or 'see the upstream repository'}"
    )
    if _offline() and not mirror:
        click.echo("offline (HF_HUB_OFFLINE or BUDGETBENCH_OFFLINE is set): nothing downloaded.")
        click.echo(_pinned_places(source, missing, folder))
        raise SystemExit(1)
    for index, remote in enumerate(missing):
        url = f"{mirror.rstrip('/')}/{remote}" if mirror else source.url(remote)
        target = folder / source.files[remote]
        try:
            digest = _download_checked(url, target, source.sha256[remote])
        except OSError as exc:  # no connection, 404, unreadable mirror: say what to do instead
            click.echo(f"could not download {url}: {type(exc).__name__}: {str(exc)[:300]}")
            click.echo(_pinned_places(source, missing[index:], folder))
            raise SystemExit(1) from None
        if digest != source.sha256[remote]:
            click.echo(
                f"refused {url}: its sha256 {digest} is not the pinned {source.sha256[remote]} "
                f"({source.repo}@{source.commit[:7]}/{remote}); nothing kept at {target}. The copy is another "
                "version of the file (or a Git LFS pointer): fetch it at the pinned commit."
            )
            raise SystemExit(1)
        with (folder / CHECKSUMS).open("a", encoding="utf-8") as sums:
            sums.write(f"{digest}  {source.files[remote]}  # {source.repo}@{source.commit}/{remote}\n")
        click.echo(f"fetched: {target} sha256={digest} (checked)")


def _download_checked(url: str, target: Path, expected: str) -> str:
    """Stream ``url`` to ``target`` and return its SHA-256; ``target`` is written only when it is ``expected``."""
    import urllib.request

    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        with partial.open("wb") as out:
            for block in iter(lambda: response.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
    if digest.hexdigest() == expected:
        partial.replace(target)
    else:
        partial.unlink()
    return digest.hexdigest()


@data.command("status")
@DATA_DIR_OPTION
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(directory, as_json):
    """Every dataset the installed task plugins register: where each file is, or is missing.

    A task finds its files here when it is given no path option. Exits 0 whatever is missing
    (`data fetch NAME` says how to get it).
    """
    registry = get_registry()
    root = directory or data_dir()
    entries = registry.entries["dataset"]
    report = []
    for name, source in registry.datasets().items():
        files = dataset_status(source, root)
        report.append(
            {
                "dataset": name,
                "distribution": entries[name].plugin.distribution,
                "folder": str(root / source.folder),
                "present": sum(f.present for f in files),
                "files": [
                    {"remote": f.remote, "path": str(f.path), "present": f.present, "bytes": f.size} for f in files
                ],
                "fetch": f"budgetbench data fetch {name}",
            }
        )
    if as_json:
        click.echo(json.dumps({"data_dir": str(root), "datasets": report}, indent=2))
        return
    click.echo(f"data folder: {root}" + ("" if directory or "BUDGETBENCH_DATA_DIR" in os.environ else " (default)"))
    if not report:
        click.echo("no installed task plugin registers a dataset")
    for row in report:
        total = len(row["files"])
        state = "complete" if row["present"] == total else "none present" if not row["present"] else "partial"
        click.echo(
            f"\n{row['dataset']} ({row['distribution']}): {row['present']}/{total} files, {state}\n  folder: {row['folder']}"
        )
        for entry in row["files"]:
            mark = f"present  {entry['bytes']:>12,} B" if entry["present"] else "MISSING"
            click.echo(f"  {mark:<24} {entry['path']}")
        if row["present"] < total:
            click.echo(f"  to get the missing files: {row['fetch']}")
