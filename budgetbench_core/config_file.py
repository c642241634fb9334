"""``budgetbench run --config run.toml``: every run option from a TOML file.

Keys are the option names, with dashes or underscores (``max-concurrency`` or
``max_concurrency``; ``strategy`` or ``strategies``), taken from the command's ``Setting``
declarations (``cli.RUN_SETTINGS``) like its click options. ``task_options`` is a table, and
``strategy_params`` a table of tables keyed by strategy. Options given on the command
line, then ``BUDGETBENCH_*`` environment variables, win over the file. The file becomes
click's ``default_map``, so it passes through
the same parsing and validation as the command line, and it is copied into the run
directory so the run records exactly what was asked.
"""

from __future__ import annotations

import functools
import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import click

from .run_config import Setting

COPY_NAME = "config.toml"


def _keys_of(specs: tuple[Setting, ...]) -> dict[str, Setting]:
    """Every accepted key (the option's name and its long flag, with underscores) -> its Setting."""
    return {key: spec for spec in specs for key in spec.keys}


def _pairs(value: Any, key: str, path: Path) -> list[str]:
    if not isinstance(value, dict):
        raise click.BadParameter(f"{path}: {key} must be a table", param_hint="--config")
    return [f"{k}={json.dumps(v)}" for k, v in value.items()]


def to_default_map(data: dict[str, Any], specs: tuple[Setting, ...], path: Path) -> dict[str, Any]:
    """The TOML document as click defaults, in the forms the command line takes."""
    keys = _keys_of(specs)
    defaults: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if "api" in key.lower() and "key" in key.lower():
            raise click.UsageError(
                f"{path}: {raw_key!r}: API keys are never read from files or the command line; "
                "set the provider's environment variable instead"
            )
        spec = keys.get(key)
        if spec is None:
            accepted = sorted(s.name for s in specs)
            raise click.BadParameter(
                f"{path}: unknown key {raw_key!r}; accepted: {', '.join(accepted)}", param_hint="--config"
            )
        if spec.kind == "pairs":
            value = _pairs(value, raw_key, path)
        elif spec.kind == "strategy_pairs":
            if not isinstance(value, dict):
                raise click.BadParameter(f"{path}: {raw_key} must be a table of tables", param_hint="--config")
            value = [
                f"{strategy}.{pair}" for strategy, params in value.items() for pair in _pairs(params, raw_key, path)
            ]
        elif spec.kind == "budgets" and isinstance(value, list):
            value = " ".join(str(v) for v in value)
        elif spec.multiple and isinstance(value, str):
            value = [value]
        if spec.name in defaults:
            raise click.BadParameter(f"{path}: {spec.name} is given twice", param_hint="--config")
        defaults[spec.name] = value
    return defaults


def load_config(
    specs: tuple[Setting, ...], ctx: click.Context, param: click.Parameter, value: Path | None
) -> Path | None:
    """Eager ``--config`` callback: read the file into ``ctx.default_map`` before other options."""
    if value is None:
        return None
    try:
        data = tomllib.loads(value.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{value}: not valid TOML: {exc}", param_hint="--config") from None
    ctx.default_map = {**(ctx.default_map or {}), **to_default_map(data, specs, value)}
    return value


def config_option(specs: tuple[Setting, ...]):
    """``--config FILE`` accepting the keys of ``specs`` (the command's own options)."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        is_eager=True,
        expose_value=True,
        callback=functools.partial(load_config, specs),
        envvar="BUDGETBENCH_CONFIG",
        show_envvar=True,
        help="TOML file with any of these options (command-line options and BUDGETBENCH_* variables win); "
        "copied into the run directory.",
    )


def copy_into_run(config_path: Path, run_dir: Path) -> Path:
    """Copy the config into the run directory; an earlier, different config there is kept."""
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / COPY_NAME
    index = 1
    while target.exists() and target.read_bytes() != config_path.read_bytes():
        target = run_dir / f"config.{index}.toml"
        index += 1
    shutil.copyfile(config_path, target)
    return target
