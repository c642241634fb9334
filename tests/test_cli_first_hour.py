"""A new user's common mistakes, through the real CLI: each stops with exit 2 (or 1 for a run
with errored cells) and one line naming the fix, before any cell runs where it can be known;
no traceback. Also: the plain display, the final table, env/config precedence, describe and
list-plugins, fail-fast against a server that refuses every key."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from budgetbench_core.cli import parse_budgets
from budgetbench_core.preflight import suggest_tokenizer
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer, invoke_cli

BUDGETBENCH = Path(sys.executable).with_name("budgetbench")
SMALL = ["--task-option", "items=3", "--task-option", "history_tokens=300"]
FAST = ["--tokenizer", "tiktoken:cl100k_base", "--retries", "0", "--timeout", "10"]


def budgetbench(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BUDGETBENCH_") and not k.endswith("_API_KEY")}
    return subprocess.run(
        [str(BUDGETBENCH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**base, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})},
    )


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def assert_refused(result: subprocess.CompletedProcess, *needles: str, run_dir: Path | None = None) -> str:
    """Exit 2, exactly one ``error:`` line holding every needle, and no cell written."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    if run_dir is not None:
        assert not (run_dir / "cells").exists()
    return lines[0]


UNAUTHORISED = (
    401,
    {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}},
)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------- names and parameters


def test_misspelt_strategy_param_is_an_error_naming_the_accepted_ones(tmp_path):
    result = budgetbench(
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "checkpoint",
        "--strategy-param",
        "checkpoint.tail_shar=0.5",
        "-o",
        str(tmp_path / "r"),
    )
    assert_refused(result, "'tail_shar'", "did you mean 'tail_share'", "accepted: tail_share", run_dir=tmp_path / "r")


def test_misspelt_task_option_is_an_error(tmp_path):
    result = budgetbench(
        "run", "-t", "synthetic-memory", "-s", "truncation", "--task-option", "item=3", "-o", str(tmp_path / "r")
    )
    assert_refused(result, "'item'", "did you mean 'items'", "history_tokens", run_dir=tmp_path / "r")


def test_strategy_param_for_a_strategy_not_in_the_run(tmp_path):
    result = budgetbench(
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "truncation",
        "--strategy-param",
        "checkpont.tail_share=0.5",
        "-o",
        str(tmp_path / "r"),
    )
    assert_refused(result, "'checkpont'", "not in this run's strategies")


def test_unknown_names_say_did_you_mean(tmp_path):
    result = budgetbench("run", "-t", "synthetic-memroy", "-s", "truncation", "-o", str(tmp_path / "r"))
    assert_refused(result, "unknown task 'synthetic-memroy'", "did you mean 'synthetic-memory'")
    result = budgetbench("run", "-t", "synthetic-memory", "-s", "truncaton", "-o", str(tmp_path / "r"))
    assert_refused(result, "did you mean 'truncation'")


def test_budgets_take_k_and_refuse_nonsense(tmp_path):
    assert parse_budgets("2k 4K,8192") == [2048, 4096, 8192]
    assert parse_budgets("1.5k") == [1536]
    result = budgetbench("run", "-t", "synthetic-memory", "-s", "truncation", "-b", "2x", "-o", str(tmp_path / "r"))
    assert result.returncode == 2 and "'2x' is not a budget" in result.stderr


# ----------------------------------------------------------------- preflight


def test_unknown_provider_is_caught_before_any_cell(tmp_path):
    result = budgetbench(
        "run", "-t", "synthetic-memory", "-s", "truncation", "-m", "olama_chat/qwen2.5:1.5b", "-o", str(tmp_path / "r")
    )
    assert_refused(result, "no provider is known", "did you mean 'ollama_chat/...'", run_dir=tmp_path / "r")


def test_missing_openrouter_key_is_named(tmp_path):
    result = budgetbench(
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "truncation",
        "-m",
        "openrouter/qwen/qwen-2.5-7b-instruct",
        "-o",
        str(tmp_path / "r"),
    )
    assert_refused(result, "OPENROUTER_API_KEY is not set", run_dir=tmp_path / "r")


def test_judge_model_is_preflighted_like_the_model(tmp_path):
    """A judge other than --model: its provider and key are checked before any cell (no call)."""
    common = ["run", "-t", "synthetic-memory", "-s", "truncation", "-b", "512", *SMALL, *FAST, "--prompts-only"]
    result = budgetbench(*common, "--judge-model", "openrouter/qwen/qwen-2.5-7b-instruct", "-o", str(tmp_path / "a"))
    assert_refused(result, "OPENROUTER_API_KEY is not set", "--judge-model", run_dir=tmp_path / "a")
    result = budgetbench(*common, "--judge-model", "olama_chat/qwen2.5:1.5b", "-o", str(tmp_path / "b"))
    assert_refused(result, "--judge-model 'olama_chat/qwen2.5:1.5b': no provider", run_dir=tmp_path / "b")


def test_ollama_not_running_says_how_to_start_it(tmp_path):
    result = budgetbench(
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "truncation",
        "-m",
        "ollama_chat/qwen2.5:1.5b",
        "--api-base",
        f"http://127.0.0.1:{free_port()}",
        "-o",
        str(tmp_path / "r"),
    )
    assert_refused(result, "Ollama does not answer", "ollama serve", run_dir=tmp_path / "r")


def test_ollama_without_tokenizer_suggests_the_family_spec_and_default_tiers_fit(tmp_path):
    tags = (200, {"models": [{"name": "qwen2.5:1.5b"}]})
    show = (200, {"model_info": {"qwen2.context_length": 32768}})
    with FaultServer(routes={"/api/tags": tags, "/api/show": show}, route_default=(404, {})) as ollama:
        result = budgetbench(
            "run",
            "-t",
            "synthetic-memory",
            "-s",
            "truncation",
            "-m",
            "ollama_chat/qwen2.5:1.5b",
            "--api-base",
            ollama.base_url,
            "-o",
            str(tmp_path / "r"),
        )
        assert_refused(result, "--tokenizer hf:Qwen/Qwen2.5-1.5B-Instruct", run_dir=tmp_path / "r")
        missing = budgetbench(
            "run",
            "-t",
            "synthetic-memory",
            "-s",
            "truncation",
            "-m",
            "ollama_chat/llama3.1:8b",
            "--api-base",
            ollama.base_url,
            "-o",
            str(tmp_path / "r"),
        )
        assert_refused(missing, "has no model 'llama3.1:8b'", "ollama pull llama3.1:8b")
        assert ollama.completions() == 0


def test_tokenizer_suggestions_by_family():
    assert suggest_tokenizer("ollama_chat/qwen2.5:7b").endswith("hf:Qwen/Qwen2.5-7B-Instruct")
    assert suggest_tokenizer("openrouter/qwen/qwen-2.5-72b-instruct").endswith("hf:Qwen/Qwen2.5-72B-Instruct")
    assert suggest_tokenizer("openrouter/meta-llama/llama-3.1-8b-instruct").endswith(
        "hf:meta-llama/Llama-3.1-8B-Instruct"
    )
    assert suggest_tokenizer("ollama/smollm2:135m").endswith("hf:HuggingFaceTB/SmolLM2-135M-Instruct")
    unknown = suggest_tokenizer("ollama_chat/some-new-model:3b")
    assert "https://ollama.com/library/some-new-model" in unknown and "hf:<" in unknown


def test_missing_gguf_file_is_named(tmp_path):
    result = budgetbench(
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "truncation",
        "-m",
        f"local:{tmp_path}/none.gguf",
        "-o",
        str(tmp_path / "r"),
    )
    assert_refused(result, "no such model file", "none.gguf", run_dir=tmp_path / "r")


def test_budget_over_the_embedded_context_names_the_tiers_that_fit(tmp_path):
    result = budgetbench("run", "-t", "synthetic-memory", "-s", "truncation", "-b", "4k 16k", "-o", str(tmp_path / "r"))
    assert_refused(result, "16384", "8192", '-b "2048 4096 8192"', run_dir=tmp_path / "r")


def test_server_refusing_the_key_is_caught_by_preflight(tmp_path):
    with FaultServer(route_default=UNAUTHORISED) as server:
        result = budgetbench(
            "run",
            "-t",
            "synthetic-memory",
            "-s",
            "truncation",
            "-b",
            "512",
            *SMALL,
            *FAST,
            "-m",
            "openai/some-model",
            "--api-base",
            server.url,
            "-o",
            str(tmp_path / "r"),
        )
        assert_refused(result, "refused the API key (401)", "OPENAI_API_KEY", run_dir=tmp_path / "r")
        assert server.completions() == 0


def test_no_server_at_api_base_is_caught_by_preflight(tmp_path):
    result = budgetbench(
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "truncation",
        "-b",
        "512",
        *SMALL,
        *FAST,
        "-m",
        "openai/some-model",
        "--api-base",
        f"http://127.0.0.1:{free_port()}/v1",
        "-o",
        str(tmp_path / "r"),
    )
    assert_refused(result, "no server answers", "--api-base", run_dir=tmp_path / "r")


# ----------------------------------------------------------------- fail fast (no preflight)


def test_401_server_gets_at_most_one_model_call(tmp_path):
    """Two strategies x two tiers x three items = 12 cells; the first refused key stops the run."""
    out = tmp_path / "r"
    with FaultServer(route_default=UNAUTHORISED) as server:
        result = budgetbench(
            "run",
            "-t",
            "synthetic-memory",
            "-s",
            "truncation",
            "-s",
            "recency",
            "-b",
            "256 512",
            *SMALL,
            *FAST,
            "-j",
            "2",
            "-m",
            "openai/some-model",
            "--api-base",
            server.url,
            "--no-preflight",
            "--display",
            "plain",
            "-o",
            str(out),
        )
        assert server.completions() <= 1
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    stopped = [line for line in result.stderr.splitlines() if "stopped" in line]
    assert stopped and "401" in stopped[0] or "API key" in stopped[0], result.stderr
    rows = final_rows(out)
    assert len(rows) < 12  # cells not started are not written: a resume runs them
    assert all(r["event"] == "error" for r in rows.values())


def test_same_transport_error_k_times_stops_the_run(tmp_path):
    out = tmp_path / "r"
    result = budgetbench(
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "truncation",
        "-b",
        "256 512 1024",
        *SMALL,
        *FAST,
        "-j",
        "1",
        "-m",
        "openai/some-model",
        "--api-base",
        f"http://127.0.0.1:{free_port()}/v1",
        "--no-preflight",
        "--max-consecutive-failures",
        "3",
        "--display",
        "plain",
        "-o",
        str(out),
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"stopped.*3 calls in a row.*Connect", result.stderr, flags=re.S), result.stderr
    errors = [r for r in final_rows(out).values() if r["event"] == "error"]
    assert 1 <= len(errors) <= 3 < 9


# ----------------------------------------------------------------- what the terminal shows


def test_plain_display_prints_one_line_per_cell_then_the_table_and_the_audit(tmp_path):
    out = tmp_path / "r"
    with FaultServer(count_prompt=lambda messages: 10) as server:  # healthy, but it reports 10 prompt tokens
        result = budgetbench(
            "run",
            "-t",
            "synthetic-memory",
            "-s",
            "truncation",
            "-s",
            "recency",
            "-b",
            "512 1k",
            *SMALL,
            *FAST,
            "-m",
            "openai/fault-model",
            "--api-base",
            server.url,
            "--no-report",
            "-o",
            str(out),
        )
    assert result.returncode == 0, result.stderr
    counted = [line for line in result.stderr.splitlines() if re.match(r"^\[\s*\d+/(>=)?12[\] ]", line)]
    *cell_lines, closing = counted
    assert len(cell_lines) == 12, result.stderr
    assert closing == "[12/12 100%] cells: 12 run now, 0 found done on disk"
    assert all(re.search(r"eta \d+:\d\d$", line) for line in cell_lines), cell_lines
    assert any(" b=1024 " in line and " result quality=" in line for line in cell_lines)
    text = result.stderr
    assert re.search(r"truncation\s+\d\.\d\d\s+\d\.\d\d", text) and re.search(r"strategy\s+512\s+1024", text)
    assert "served-count audit: 12 of 12 results disagree (e.g. 10 served vs" in " ".join(text.split())
    assert "preflight: server at" in text


def test_env_wins_over_config_and_command_line_wins_over_env(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('task = "synthetic-memory"\nstrategies = ["truncation"]\nmodel = "fromconfig/x"\n')
    base = ["run", "--config", str(config), "-o", str(tmp_path / "r")]
    assert "'fromconfig/x'" in error_lines(budgetbench(*base))[0]
    env = {"BUDGETBENCH_MODEL": "fromenv/x"}
    assert "'fromenv/x'" in error_lines(budgetbench(*base, env=env))[0]
    assert "'fromcli/x'" in error_lines(budgetbench(*base, "-m", "fromcli/x", env=env))[0]
    via_env = budgetbench(
        "run", env={"BUDGETBENCH_TASK": "synthetic-memory", "BUDGETBENCH_STRATEGY": "truncation nope"}
    )
    assert_refused(via_env, "unknown strategy 'nope'")


# ----------------------------------------------------------------- describe and list-plugins


def test_describe_shows_parameters_with_defaults_and_help():
    result = budgetbench("describe", "checkpoint", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    assert "tail_share" in result.stdout and "0.4" in result.stdout and "newest messages" in result.stdout
    rows = json.loads(budgetbench("describe", "synthetic-memory", "--json").stdout)
    params = {p["name"]: p for p in rows[0]["parameters"]}
    assert params["items"]["default"] == 50 and params["history_tokens"]["default"] == 4000
    assert_refused(budgetbench("describe", "checkpiont"), "did you mean 'checkpoint'")


def test_every_installed_option_has_help_and_every_name_a_description():
    """What describe shows, for every installed plugin: no option without help, no name without a line."""
    rows = [r for r in json.loads(budgetbench("list-plugins", "--json").stdout) if r["kind"] != "error"]
    assert {"tiktoken", "hf", "gguf", "server"} <= {r["name"] for r in rows if r["kind"] == "tokenizer"}
    no_help = [
        f"{r['kind']} {r['name']}: {p['name']}" for r in rows for p in r.get("parameters") or [] if not p["help"]
    ]
    assert no_help == []
    assert [f"{r['kind']} {r['name']}" for r in rows if not r["description"].strip()] == []


def test_describe_shows_the_plugins_own_text_for_tasks_graders_and_tokenizers():
    """Every registered name is described by its own text, never its base class's docstring."""
    rows = [r for r in json.loads(budgetbench("list-plugins", "--json").stdout) if r["kind"] != "error"]
    for name in sorted({r["name"] for r in rows}):
        result = invoke_cli("describe", name, env={"COLUMNS": "200"})
        assert result.exit_code == 0, (name, result.output)
        assert "Base class for" not in result.output and "Subclasses set" not in result.output, (name, result.output)
    spec = invoke_cli("describe", "tiktoken", env={"COLUMNS": "200"})
    assert "tiktoken:ENCODING" in spec.output and "approximate" in spec.output


def test_describe_takes_a_tokenizer_spec():
    result = invoke_cli("describe", "tiktoken:cl100k_base", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "tiktoken (tokenizer)" in result.output and "tiktoken:ENCODING" in result.output


def test_describe_tau_bench_shows_every_option_with_its_help():
    pytest.importorskip("budgetbench_task_taubench", reason="the tau-bench plugin is not installed")
    result = budgetbench("describe", "tau-bench", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    options = ("domain", "split", "path", "user", "max_steps", "max_errors", "max_turns", "guidelines")
    for option in options:
        assert option in lines, result.stdout
        assert len(lines[option].split()) > 2, lines[option]  # name, default and help
    assert "retail, airline" in lines["domain"] and "llm" in lines["user"] and "scripted" in lines["user"]
    assert "agent calls per episode" in lines["max_turns"]  # its own help, not the base class's sentence


def test_list_plugins_json_has_parameters_and_the_table_fits_80_columns():
    rows = json.loads(budgetbench("list-plugins", "--json").stdout)
    summary = next(r for r in rows if r["name"] == "summary_buffer")
    assert {p["name"] for p in summary["parameters"]} == {"summary_share", "max_calls"}
    table = budgetbench("list-plugins", env={"COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    first_words = {line.split()[0] for line in lines if line.strip()}
    for row in rows:
        if row["kind"] in ("strategy", "task", "grader", "backend"):
            assert row["name"] in first_words, row["name"]  # never cut or wrapped


def test_cli_reference_shows_real_defaults():
    """mkdocs-click prints ``option.default``; none may be click's UNSET marker."""
    import click

    from budgetbench_core.cli import cli

    def options(group, prefix=()):
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from options(command, (*prefix, name))
            for param in command.params:
                if isinstance(param, click.Option) and not param.hidden:
                    yield (*prefix, name, param.name), param

    bad = [where for where, param in options(cli) if "Sentinel" in repr(param.default) and not param.required]
    assert not bad
    run_options = {param.name: param for param in cli.commands["run"].params}
    assert run_options["task"].default is None and run_options["strategies"].default is None  # "_required"
    help_text = budgetbench("run", "--help").stdout
    assert "BUDGETBENCH_MODEL" in help_text and "BUDGETBENCH_DISPLAY" in help_text
    undocumented = [where for where, param in options(cli) if not param.help]
    assert not undocumented, undocumented


# ----------------------------------------------------------------- defaults that run


@pytest.mark.slow
@pytest.mark.timeout(3600)  # six cells of 4,000-token histories on the embedded model; slow on a loaded machine
def test_run_with_no_other_option_finishes(tmp_path):
    """``budgetbench run -t synthetic-memory -s truncation -n 1``: tiers that fit the embedded model,
    every cell finished (one item is enough: the tiers and the cells do not depend on the count)."""
    result = budgetbench(
        "run", "-t", "synthetic-memory", "-s", "truncation", "-n", "1", "--no-report", cwd=tmp_path, timeout=3500
    )
    assert result.returncode == 0, result.stderr
    assert "note: budgets: 2048 4096 8192" in " ".join(result.stderr.split())
    rows = final_rows(tmp_path / "runs" / "synthetic-memory")
    assert sorted({r["budget"] for r in rows.values()}) == [2048, 4096, 8192]
    assert len(rows) == 3 and all(r["event"] in ("result", "violation") for r in rows.values())


def test_display_tells_finished_cells_from_resumed_ones():
    """Rows reported through on_cell are finished cells (one plain line each); progress beyond
    them is cells found done on disk, which do not count toward the speed behind the ETA."""
    import io

    from budgetbench_core.progress import OVERALL, Display

    screen = Display("plain", stream=io.StringIO())
    screen.start(5, {"truncation": 5})
    screen.progress("truncation", 2)  # resumed
    screen.finished(
        {
            "strategy": "truncation",
            "event": "result",
            "budget": 512,
            "item_id": "a",
            "quality": 1.0,
            "prompt_tokens": 300,
        }
    )
    screen.progress("truncation", 1)
    for _ in range(2):  # a unit whose reset failed: two error rows, one progress call
        screen.finished(
            {
                "strategy": "truncation",
                "event": "error",
                "budget": 512,
                "item_id": "b",
                "phase": "reset",
                "cause": "reset failed",
            }
        )
    screen.progress("truncation", 2)
    counter = screen.counters[OVERALL]
    assert (counter.skipped, counter.finished, counter.done) == (2, 3, 5)
    lines = screen.stream.getvalue().splitlines()
    assert len([line for line in lines if line.startswith("[")]) == 3
    assert "error (reset): reset failed" in lines[-1]


def test_new_plugin_refuses_a_taken_name_and_hints_this_environments_pip(tmp_path):
    from click.testing import CliRunner

    from budgetbench_core.cli import cli

    taken = CliRunner().invoke(cli, ["new-plugin", "strategy", "truncation", "--dir", str(tmp_path)])
    assert taken.exit_code == 2 and "is taken" in taken.output and "budgetbench" in taken.output
    assert not list(tmp_path.iterdir())
    made = CliRunner().invoke(cli, ["new-plugin", "strategy", "fresh-name", "--dir", str(tmp_path)])
    assert made.exit_code == 0, made.output
    assert f"next: {sys.executable} -m pip install -e " in made.output


def test_ctrl_c_exits_130_and_keeps_finished_cells(tmp_path):
    import signal

    out = tmp_path / "r"
    with FaultServer(latency_s=0.5, count_prompt=lambda messages: 10) as server:
        base = {k: v for k, v in os.environ.items() if not k.startswith("BUDGETBENCH_")}
        process = subprocess.Popen(
            [
                str(BUDGETBENCH),
                "run",
                "-t",
                "synthetic-memory",
                "-s",
                "truncation",
                "-b",
                "256 512 1k 2k",
                *SMALL,
                *FAST,
                "-j",
                "1",
                "-m",
                "openai/fault-model",
                "--api-base",
                server.url,
                "--no-report",
                "-o",
                str(out),
            ],
            stderr=subprocess.PIPE,
            text=True,
            env={**base, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
        seen = []
        for line in process.stderr:
            seen.append(line)
            if re.match(r"\[ 1/(>=|≥)?12", line):  # the total is "at least" until the task is read
                process.send_signal(signal.SIGINT)
                break
        rest = process.stderr.read()
        code = process.wait(timeout=120)
    assert code == 130, "".join(seen) + rest
    assert "interrupted" in rest and "Traceback" not in rest
    assert 1 <= len(final_rows(out)) < 12


def test_out_naming_a_file_is_a_usage_error_not_a_traceback(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    result = invoke_cli("run", "-t", "synthetic-memory", "-s", "truncation", "-o", str(target), "--no-preflight")
    assert result.exit_code == 2 and "a file, not a folder" in result.output, result.output
    assert "Traceback" not in result.output and target.read_text() == "mine"
