"""`budgetbench run --config run.toml`: every option from TOML, command line wins, copied into the run."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from budgetbench_core.cli import cli, run_command
from budgetbench_core.config_file import copy_into_run

EVERY_OPTION = """
task = "synthetic-memory"
strategies = ["truncation", "recency"]
budgets = [256, 512]
model = "openai/my-model"
api-base = "http://127.0.0.1:9/v1"
tokenizer = "tiktoken:cl100k_base"
grader = "exact-match"
judge-model = "local"
limit = 3
repeats = 2
seed = 7
max-concurrency = 1
temperature = 0.5
max-output-tokens = 16
retries = 1
timeout = 30.5
item-timeout = 60
max-ingest-loss = 0.25
server-prompt-cache = true
max-consecutive-failures = 3
out = "runs/from-toml"
no-report = true
display = "plain"
no-preflight = true
shard = "2/3"
isolation = "none"
worker-disk-mb = 512
worker-processes = 16
worker-memory-mb = 2048
controls = true
price = "0.15/0.6"

[task_options]
items = 3
history_tokens = 600

[strategy_params.summary_buffer]
max_calls = 1
summary_share = 0.3
"""


def parse(args: list[str]) -> dict:
    """The values the run command would receive (click's real parsing, without running)."""
    with run_command.make_context("run", args) as ctx:
        return ctx.params


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_every_run_option_can_come_from_the_file(tmp_path):
    params = parse(["--config", str(write(tmp_path, EVERY_OPTION))])
    assert params["task"] == "synthetic-memory" and params["strategies"] == ("truncation", "recency")
    assert params["budgets"] == "256 512" and params["model"] == "openai/my-model"
    assert params["api_base"] == "http://127.0.0.1:9/v1" and params["tokenizer"] == "tiktoken:cl100k_base"
    assert params["grader"] == "exact-match" and params["judge_model"] == "local"
    assert (params["limit"], params["repeats"], params["seed"], params["max_concurrency"]) == (3, 2, 7, 1)
    assert (params["temperature"], params["max_output_tokens"], params["retries"]) == (0.5, 16, 1)
    assert (params["timeout_s"], params["item_timeout_s"], params["max_ingest_loss"]) == (30.5, 60.0, 0.25)
    assert params["server_prompt_cache"] is True
    assert params["out"] == Path("runs/from-toml") and params["no_report"] is True
    assert (params["display"], params["no_preflight"], params["max_consecutive_failures"]) == ("plain", True, 3)
    assert params["task_options"] == ("items=3", "history_tokens=600")
    assert params["strategy_params"] == ("summary_buffer.max_calls=1", "summary_buffer.summary_share=0.3")
    assert params["shard"] == "2/3"
    assert (params["isolation"], params["controls"], params["price"]) == ("none", True, "0.15/0.6")
    assert (params["worker_disk_mb"], params["worker_processes"], params["worker_memory_mb"]) == (512, 16, 2048)
    covered = {
        p.name for p in run_command.params if isinstance(p, click.Option) and p.expose_value and not p.hidden
    } - {"config_path", "help"}
    assert covered <= set(params) and all(params[name] is not None for name in covered)


def test_command_line_wins_over_the_file(tmp_path):
    params = parse(["--config", str(write(tmp_path, EVERY_OPTION)), "-s", "checkpoint", "--seed", "1", "-b", "1024"])
    assert params["strategies"] == ("checkpoint",) and params["seed"] == 1 and params["budgets"] == "1024"
    assert params["limit"] == 3  # still from the file


@pytest.mark.parametrize(
    "text, message",
    [
        ("task = 'x'\nstrategy = 'truncation'\nbugdets = [1]\n", "unknown key 'bugdets'"),
        ("task = 'x'\nstrategy = 'truncation'\nlimit = 'many'\n", "'many' is not a valid integer"),
        ("task = 'x'\nstrategy = 'truncation'\nopenai_api_key = 'sk-1'\n", "API keys are never read"),
        ("task = 'x'\nstrategy = 'truncation'\ntask_options = 3\n", "must be a table"),
        ("task = 'x\n", "not valid TOML"),
    ],
)
def test_bad_files_are_refused_with_the_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    result = CliRunner().invoke(cli, ["run", "--config", str(path)])
    assert result.exit_code == 2
    assert message in result.output
    assert "sk-1" not in result.output


def test_required_options_still_required_without_the_file():
    result = CliRunner().invoke(cli, ["run", "-s", "truncation"])
    assert result.exit_code == 2 and "--task" in result.output


def test_a_different_config_for_the_same_run_dir_is_kept(tmp_path):
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text("seed = 1\n")
    second.write_text("seed = 2\n")
    run_dir = tmp_path / "run"
    assert copy_into_run(first, run_dir).name == "config.toml"
    assert copy_into_run(first, run_dir).name == "config.toml"
    assert copy_into_run(second, run_dir).name == "config.1.toml"
    assert (run_dir / "config.toml").read_text() == "seed = 1\n"


@pytest.mark.slow
def test_run_from_config_on_the_embedded_model(tmp_path):
    out = tmp_path / "run"
    path = write(
        tmp_path,
        f"""
task = "synthetic-memory"
strategy = "truncation"
budgets = [256]
limit = 1
max-concurrency = 1
no-report = true
out = "{out.as_posix()}"
[task_options]
items = 1
history_tokens = 300
""",
    )
    result = CliRunner().invoke(cli, ["run", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert (out / "config.toml").read_text() == path.read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["budgets"] == [256] and manifest["config"]["task_options"]["history_tokens"] == 300
    assert list(out.glob("cells/synthetic-memory/truncation/256/r0.jsonl"))
