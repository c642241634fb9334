"""Secrets never reach the run directory or the report, and are refused on the command line.

The key is set in the environment and sent to the loopback server, which quotes the
Authorization header back in its error bodies (as some providers quote a wrong key), so
the errors the run records would carry the key if nothing stopped it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core import RunConfig, run  # noqa: E402
from budgetbench_core.runlog import iter_events  # noqa: E402
from budgetbench_core.testing import FaultServer  # noqa: E402

SECRET = "sk-test-SECRET-b7f3c9d2e1a04f58"
BUDGETBENCH = Path(sys.executable).with_name("budgetbench")


def _files_containing(folder: Path, needle: str) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and needle.encode() in path.read_bytes()]


@pytest.mark.slow
def test_api_key_from_environment_never_lands_in_run_or_report(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    out = tmp_path / "run"
    with FaultServer(
        rate=0.6, faults=("500", "429", "malformed", "null_content"), retry_after_s=0.1, echo_auth_in_errors=True
    ) as server:
        summary = run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation"],
                budgets=[40, 2000],
                out=out,
                model="openai/fault-model",
                api_base=server.url,
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": 12, "history_tokens": 300},
                retries=1,
                timeout_s=5.0,
                max_concurrency=4,
            )
        )
    # The key was really used, and the server really quoted it back in errors the run recorded.
    assert {r.authorization for r in server.requests} == {f"Bearer {SECRET}"}
    assert summary.errors > 0 and summary.results > 0 and summary.violations > 0
    causes = [e["cause"] for e in iter_events(out) if e["event"] == "error"]
    assert any("OPENAI_API_KEY redacted" in cause for cause in causes), causes
    try:
        from budgetbench_core.report import write_report
    except ImportError:
        pass
    else:
        write_report(out)
        assert (out / "report").is_dir()
    for needle in (SECRET, SECRET[-12:]):
        assert _files_containing(out, needle) == []


def refused_run(tmp_path, arguments: list[str]) -> subprocess.CompletedProcess:
    """``budgetbench run`` with ``arguments``, expected to stop before anything runs."""
    command = [str(BUDGETBENCH), "run", "-t", "synthetic-memory", "-s", "truncation", "-o", str(tmp_path / "run")]
    done = subprocess.run(
        [*command, *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 2, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert not (tmp_path / "run").exists()
    return done


@pytest.mark.parametrize(
    "arguments",
    [
        ["--api-key", SECRET],
        [f"--api-key={SECRET}"],
        ["--task-option", f"api_key={SECRET}"],
        ["--strategy-param", f"truncation.api_key={SECRET}"],
    ],
)
def test_keys_on_the_command_line_are_refused(tmp_path, arguments):
    done = refused_run(tmp_path, arguments)
    assert "OPENAI_API_KEY" in done.stderr and "environment variable" in done.stderr


@pytest.mark.parametrize(
    "arguments",
    [
        ["--api-base", f"http://user:{SECRET}@127.0.0.1:9/v1"],
        ["--executor-option", f"address=ray://admin:{SECRET}@head:10001"],
    ],
)
def test_credentials_in_a_url_option_are_refused_with_the_environment_way(tmp_path, arguments):
    """Old code: the URL, password included, went into manifest.json and identity.json."""
    done = refused_run(tmp_path, arguments)
    assert "carries credentials" in done.stderr and "_API_KEY" in done.stderr


def test_a_key_is_redacted_in_every_encoding_a_server_may_echo(monkeypatch):
    """Old code: a key with '/' echoed JSON-escaped (\\/) was written whole, and its pieces were never redacted."""
    import json
    from urllib.parse import quote, quote_plus

    from budgetbench_core.runlog import redact

    key = "sk-or-v1/Ab+Cd/0123456789efGHIJ=="
    monkeypatch.setenv("VENDOR_API_KEY", key)
    echoes = {
        "plain": key,
        "json": json.dumps(key)[1:-1],
        "json, slash escaped": json.dumps(key).replace("/", "\\/")[1:-1],
        "url": quote(key, safe=""),
        "url, plus": quote_plus(key),
        "upper": key.upper(),
        "lower": key.lower(),
    }
    for how, echoed in echoes.items():
        body = json.dumps({"error": {"message": f"invalid key {echoed} for this project"}})
        cleaned = redact(body)
        assert "<VENDOR_API_KEY redacted>" in cleaned, how
        assert echoed not in cleaned and "0123456789ef" not in cleaned.lower(), (how, cleaned)
    piece = key[6:20]  # a provider quoting part of the key, "/" and "+" inside
    assert piece not in redact(f"key ending {piece}..."), piece
