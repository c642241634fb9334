"""One source of every run option: the ``Setting`` declarations make the click options of ``run``,
the keys ``--config`` accepts and the options table of docs/cli/run.md."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from budgetbench_core.cli import DISPLAY_SETTINGS, RUN_SETTINGS, click_option, demo, run_command
from budgetbench_core.config_file import to_default_map
from budgetbench_core.run_config import OPTIONS_BEGIN, OPTIONS_END, RunConfig, Setting, options_table, settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli" / "run.md"


def test_the_run_page_shows_the_generated_options_table():
    text = PAGE.read_text(encoding="utf-8")
    assert OPTIONS_BEGIN in text and OPTIONS_END in text, f"{PAGE}: no generated options block"
    shown = text.split(OPTIONS_BEGIN, 1)[1].split(OPTIONS_END, 1)[0].strip()
    assert shown == options_table(RUN_SETTINGS).strip(), (
        "docs/cli/run.md's options table is stale: run `.venv/bin/python scripts/run_options_table.py`"
    )


def test_every_field_of_run_config_is_an_option_of_run_with_its_declared_spelling():
    declared = {spec.name: spec for spec in RUN_SETTINGS}
    assert {f.name for f in fields(RunConfig)} <= set(declared)
    options = {p.name: p for p in run_command.params if isinstance(p, click.Option) and p.expose_value and not p.hidden}
    assert set(options) - {"config_path"} == set(declared)
    for name, spec in declared.items():
        option = options[name]
        assert option.opts == [spec.flag, *([spec.short] if spec.short else [])], name
        assert (option.envvar, option.help, option.multiple) == (spec.envvar, spec.help, spec.multiple), name
        assert option.required == spec.required and option.is_flag == (spec.kind == "flag"), name
    field_defaults = {f.name: f.default for f in fields(RunConfig)}
    assert options["max_concurrency"].default == field_defaults["max_concurrency"] == 4
    assert options["timeout_s"].default == field_defaults["timeout_s"] == 120.0
    assert [p.name for p in demo.params if p.name in {s.name for s in DISPLAY_SETTINGS}] == ["display", "no_preflight"]


def test_a_new_setting_becomes_an_option_and_a_config_key(tmp_path):
    """What declaring one Setting gives: the option with its variable and range, and its TOML keys."""
    knob = Setting("--max-knob", "How far the knob turns.", kind="int", minimum=2, default=3, name="knob_s")

    @click.command()
    @click_option(knob)
    def command(knob_s):
        click.echo(f"knob={knob_s}")

    runner = CliRunner()
    assert runner.invoke(command, []).output == "knob=3\n"
    assert runner.invoke(command, [], env={"BUDGETBENCH_MAX_KNOB": "5"}).output == "knob=5\n"
    refused = runner.invoke(command, ["--max-knob", "1"])
    assert refused.exit_code == 2 and "x>=2" in refused.output
    assert "default: 3" in runner.invoke(command, ["--help"]).output
    path = tmp_path / "run.toml"
    assert to_default_map({"max-knob": 4}, (knob,), path) == {"knob_s": 4}
    assert to_default_map({"knob_s": 4}, (knob,), path) == {"knob_s": 4}
    with pytest.raises(click.BadParameter, match=r"unknown key 'knob'; accepted: knob_s"):
        to_default_map({"knob": 4}, (knob,), path)
    assert "| `--max-knob` | `INTEGER >= 2` | `3` | `BUDGETBENCH_MAX_KNOB` | How far the knob turns. |" in (
        options_table((knob,))
    )


def test_a_setting_of_an_unknown_kind_is_refused_naming_its_flag():
    with pytest.raises(ValueError, match=r"setting --knob: kind 'number' is not one of"):
        Setting("--knob", "help", kind="number")


def test_settings_follow_the_fields_defaults():
    by_name = {spec.name: spec for spec in settings()}
    assert by_name["task"].required and by_name["task"].default is None
    assert by_name["strategies"].required and by_name["strategies"].default is None  # no () default: click 8.3+
    assert by_name["task_options"].default == () and by_name["budgets"].default is None  # resolved by preflight
    assert by_name["isolation"].default == RunConfig.isolation == "process"
