"""The CLI through a real subprocess: list-plugins, guarded loading, key refusal, the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from budgetbench_core.runlog import final_rows, read_manifest

BUILTINS = {
    ("strategy", "truncation"),
    ("strategy", "full_context"),
    ("strategy", "recency"),
    ("strategy", "summary_buffer"),
    ("strategy", "checkpoint"),
    ("task", "synthetic-memory"),
    ("grader", "exact-match"),
    ("grader", "contains-answer"),
    ("backend", "litellm"),
    ("backend", "local"),
    ("tokenizer", "server"),
    ("tokenizer", "tiktoken"),
    ("tokenizer", "hf"),
    ("tokenizer", "gguf"),
}


def budgetbench(*args, env=None, cwd=None):
    script = Path(sys.executable).with_name("budgetbench")
    return subprocess.run([str(script), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


def test_list_plugins_json_lists_every_builtin_with_regime():
    result = budgetbench("list-plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    listed = {(r["kind"], r["name"]) for r in rows}
    assert BUILTINS <= listed
    truncation = next(r for r in rows if r["name"] == "truncation")
    assert truncation["regime"] == "local-only" and truncation["distribution"] == "budgetbench"
    assert "register_strategies" in truncation["hooks"] and truncation["version"]


def broken_plugin_env(tmp_path: Path) -> dict:
    """A real installed-looking distribution whose entry point fails to import."""
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[budgetbench]\nbroken = broken_plugin_module\n")
    (tmp_path / "broken_plugin_module.py").write_text("raise ImportError('needs a library that is not installed')\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_failing_plugin_import_does_not_break_list_plugins(tmp_path):
    env = broken_plugin_env(tmp_path)
    result = budgetbench("list-plugins", "--json", env=env)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    broken = [r for r in rows if r["kind"] == "error"]
    assert broken and broken[0]["distribution"] == "broken-plugin"
    assert "needs a library that is not installed" in broken[0]["error"]
    assert BUILTINS <= {(r["kind"], r["name"]) for r in rows}
    table = budgetbench("list-plugins", env=env)
    assert table.returncode == 0 and "broken-plugin" in table.stderr


def test_load_plugins_variable_restricts_loading():
    env = {**os.environ, "BUDGETBENCH_LOAD_PLUGINS": "builtin-strategies"}
    rows = json.loads(budgetbench("list-plugins", "--json", env=env).stdout)
    assert {r["kind"] for r in rows} == {"strategy"}


def test_unknown_strategy_lists_available(tmp_path):
    result = budgetbench("run", "-t", "synthetic-memory", "-s", "nope", "-o", str(tmp_path / "r"))
    assert result.returncode == 2
    assert "unknown strategy 'nope'" in result.stderr and "truncation" in result.stderr


def test_api_key_on_command_line_is_refused(tmp_path):
    result = budgetbench(
        "run", "-t", "synthetic-memory", "-s", "truncation", "--api-key", "sk-secret", "-o", str(tmp_path / "r")
    )
    assert result.returncode != 0
    assert "environment variable" in result.stderr + result.stdout


@pytest.mark.slow
def test_demo_runs_exactly_and_resumes_without_calls(tmp_path):
    out = tmp_path / "demo"
    first = budgetbench("demo", "--out", str(out), "--limit", "5", "--answered", "2")
    assert first.returncode == 0, first.stderr
    prompts, answered = final_rows(out / "prompts"), final_rows(out / "answered")
    strategies = {k[1] for k in prompts}
    assert {"truncation", "checkpoint", "full_context"} <= strategies
    assert len(prompts) == 5 * len(strategies) * 3 and {r["event"] for r in prompts.values()} <= {
        "admitted",
        "violation",
    }
    assert read_manifest(out / "prompts")["calls_made"] == 0  # prompts only: no model call
    assert {"control:no_memory", "control:evidence_only"} <= strategies  # the demo's reference lines
    contenders = {s for s in strategies if not s.startswith("control:")}
    assert len(answered) == 2 * len(contenders) and {k[2] for k in answered} == {512}
    report = json.loads((out / "prompts" / "report" / "report.json").read_text())
    ranked = {r["strategy"] for r in report["ranking"]}
    assert ranked and ranked <= contenders  # ranked by area under the curve; controls never
    assert report["controls"] == ["control:evidence_only", "control:no_memory"]
    admitted = [r for r in answered.values() if r["event"] == "result"]
    assert admitted and all(r["prompt_tokens"] <= r["budget"] for r in admitted)
    assert all(r["served_prompt_tokens"] == r["prompt_tokens"] for r in admitted)
    assert all("latency_s" in r and "quality" in r for r in admitted)
    assert "Evidence recall at 512 tokens" in first.stdout + first.stderr
    calls = read_manifest(out / "answered")["calls_made"]
    second = budgetbench("demo", "--out", str(out), "--limit", "5", "--answered", "2")
    assert second.returncode == 0, second.stderr
    assert read_manifest(out / "answered")["calls_made"] == calls
    assert " ".join(second.stderr.split()).count("0 model calls") == 2
