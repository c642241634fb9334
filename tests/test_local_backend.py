"""The embedded server's thread and OpenMP settings are applied and recorded in the manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = """
import json, os
from budgetbench_core.builtin.local_backend import LocalBackend
backend = LocalBackend()
backend.start()
try:
    print(json.dumps({"describe": backend.describe(), "env": os.environ.get("OMP_WAIT_POLICY")}))
finally:
    backend.stop()
"""


def start_in_fresh_process(env: dict[str, str]) -> dict:
    """OpenMP reads its environment once per process, so each case needs its own."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env={**clean, **env}, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_passive_waiting_is_applied_and_recorded():
    result = start_in_fresh_process({})
    openmp = result["describe"]["openmp"]
    assert result["env"] == "PASSIVE" and openmp["OMP_WAIT_POLICY"] == "PASSIVE"
    assert openmp["applied_before_import"] is True
    # the measured choice: one generation thread, every core for prompt processing
    assert result["describe"]["threads"] == {"generation": 1, "batch": os.cpu_count()}
    # how a call is bounded is recorded too: no total deadline, a stall limit from --timeout and the steps
    assert result["describe"]["total_deadline_s"] is None and result["describe"]["step_tokens"] == 512
    assert result["describe"]["stall_limit"] == {"at_least_s": 120.0, "longest_steps": 10.0}


@pytest.mark.slow
def test_a_policy_the_user_exported_wins():
    result = start_in_fresh_process({"OMP_WAIT_POLICY": "ACTIVE"})
    assert result["describe"]["openmp"]["OMP_WAIT_POLICY"] == "ACTIVE" and result["env"] == "ACTIVE"
