"""`budgetbench taubench export` and `regrade` on a real retail run (embedded model, scripted user).

One run with ``--repeats 2`` on a copy of the retail data: its export validates against the
submission and trajectory schemas (written from upstream's models), is marked custom with the
reasons, and its pass^k comes from the trajectories' own rewards; a regrade on fixed data
changes exactly the rewards the fix changes, under a new run key, without a model call; an
export after the data changed under the run is refused.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest

from budgetbench_core import final_rows
from budgetbench_core.testing import invoke_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import DATA, needs_data  # noqa: E402

SCHEMAS = Path(__file__).resolve().parents[1] / "budgetbench_task_taubench" / "data"
pytestmark = [needs_data, pytest.mark.slow]


def schema(name):
    return json.loads((SCHEMAS / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def retail_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tau-lb")
    data = root / "retail"
    shutil.copytree(DATA / "retail", data)
    out = root / "run"
    result = invoke_cli(
        "run",
        "-t",
        "tau-bench",
        "--task-option",
        "domain=retail",
        "--task-option",
        "user=scripted",
        "--task-option",
        f"path={data}",
        "--task-option",
        "max_turns=1",
        "-s",
        "truncation",
        "-b",
        "6144",
        "-n",
        "2",
        "--repeats",
        "2",
        "--max-output-tokens",
        "32",
        "--timeout",
        "900",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    return out, data


def export(run, target, *extra):
    return invoke_cli(
        "taubench",
        "export",
        str(run),
        "-o",
        str(target),
        "--model-organization",
        "HuggingFace",
        "--submitting-organization",
        "BudgetBench tests",
        "--email",
        "tests@example.org",
        *extra,
    )


def test_export_validates_and_its_pass_k_comes_from_the_trajectories(retail_run, tmp_path):
    run, _ = retail_run
    target = tmp_path / "submission" / "submission.json"
    outcome = export(run, target)
    if outcome.exception is not None and not isinstance(outcome.exception, SystemExit):
        raise outcome.exception
    assert outcome.exit_code == 0, outcome.output
    submission = json.loads(target.read_text())
    jsonschema.validate(submission, schema("leaderboard_submission.schema.json"))
    assert submission["submission_type"] == "custom"
    notes = submission["methodology"]["notes"]
    assert "'truncation' chose what the agent saw" in notes and "scripted user" in notes and "JSON actions" in notes
    assert submission["methodology"]["verification"] == {
        "modified_prompts": True,
        "omitted_questions": True,  # 2 of retail's base tasks
        "details": "not every base-split task ran on every trial (a split, --limit, or error rows)",
    }
    (name,) = submission["trajectory_files"].values()
    trajectories = json.loads((target.parent / "trajectories" / name).read_text())
    jsonschema.validate(trajectories, schema("leaderboard_trajectories.schema.json"))
    assert (
        trajectories["info"]["num_trials"] == 2 and trajectories["info"]["environment_info"]["domain_name"] == "retail"
    )
    simulations = trajectories["simulations"]
    rows = final_rows(run)
    assert len(simulations) == len(rows) == 4
    for simulation in simulations:
        row = rows[("tau-bench", "truncation", 6144, simulation["trial"], simulation["task_id"])]
        assert simulation["reward_info"]["reward"] == row["quality"]
        messages = simulation["messages"]
        assert messages[0] == {
            "role": "assistant",
            "content": "Hi! How can I help you today?",
            "tool_calls": None,
            "turn_idx": 0,
        }
        assert messages[1]["role"] == "user" and [m["turn_idx"] for m in messages] == list(range(len(messages)))
        for index, message in enumerate(messages):  # every tool result answers the call right before it
            if message["role"] == "tool":
                assert messages[index - 1]["tool_calls"][0]["id"] == message["id"]
    # upstream's pass^k over the trajectory file: per task C(c, k) / C(n, k), averaged
    per_task = {}
    for simulation in simulations:
        per_task.setdefault(simulation["task_id"], []).append(simulation["reward_info"]["reward"] == 1.0)
    for k in (1, 2):
        expected = 100 * sum(math.comb(sum(t), k) / math.comb(len(t), k) for t in per_task.values()) / len(per_task)
        assert submission["results"]["retail"][f"pass_{k}"] == pytest.approx(expected)
    assert submission["results"]["retail"]["pass_3"] is None and submission["results"]["retail"]["cost"] is None


def test_regrade_on_fixed_data_changes_the_fixed_rewards_under_a_new_run_key(retail_run, tmp_path):
    run, data = retail_run
    rows = final_rows(run)
    same = tmp_path / "same"
    outcome = invoke_cli("taubench", "regrade", str(run), "-o", str(same))
    if outcome.exception is not None and not isinstance(outcome.exception, SystemExit):
        raise outcome.exception
    assert outcome.exit_code == 0, outcome.output
    unchanged = json.loads((same / "regrade.json").read_text())
    assert unchanged["changed"] == 0 and unchanged["episodes"] == 4
    assert unchanged["regraded_from_run_key"] == json.loads((run / "manifest.json").read_text())["run_key"]
    assert unchanged["run_key"] != unchanged["regraded_from_run_key"]
    # the fix: every run task graded on what the agent communicated too (a basis it never met)
    fixed = tmp_path / "fixed-retail"
    shutil.copytree(data, fixed)
    tasks = json.loads((fixed / "tasks.json").read_text())
    ran = {key[4] for key in rows}
    for task in tasks:
        if task["id"] in ran:
            task["evaluation_criteria"]["communicate_info"] = ["a sentence the agent never said"]
            task["evaluation_criteria"]["reward_basis"] = ["DB", "COMMUNICATE"]
    (fixed / "tasks.json").write_text(json.dumps(tasks))
    regraded = tmp_path / "regraded"
    outcome = invoke_cli("taubench", "regrade", str(run), "-o", str(regraded), "--data", str(fixed))
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads((regraded / "regrade.json").read_text())
    lines = [json.loads(line) for line in (regraded / "rewards.jsonl").read_text().splitlines()]
    assert summary["run_key"] not in (unchanged["run_key"], summary["regraded_from_run_key"])
    assert summary["data_sha256"] != unchanged["data_sha256"]
    assert {line["quality"] for line in lines} == {0.0}
    assert summary["changed"] == sum(row["quality"] == 1.0 for row in rows.values())
    assert all(line["run_key"] == summary["run_key"] for line in lines)
    refused = invoke_cli("taubench", "regrade", str(run), "-o", str(run / "regrade"))
    assert refused.exit_code == 2 and "never into the run directory" in refused.output


def test_export_refuses_a_run_whose_data_changed_since(retail_run, tmp_path):
    run, data = retail_run
    rows = final_rows(run)
    if not any(row["quality"] == 1.0 for row in rows.values()):
        pytest.skip("no rewarded episode to break")  # the export check is on rewards that change
    tasks_file = data / "tasks.json"
    original = tasks_file.read_text()
    tasks = json.loads(original)
    ran = {key[4] for key in rows}
    for task in tasks:
        if task["id"] not in ran:
            continue
        task["evaluation_criteria"]["reward_basis"] = ["DB", "COMMUNICATE"]
        task["evaluation_criteria"]["communicate_info"] = ["a sentence the agent never said"]
    try:
        tasks_file.write_text(json.dumps(tasks))
        outcome = export(run, tmp_path / "submission.json")
    finally:
        tasks_file.write_text(original)
    if isinstance(outcome.exception, ImportError):
        raise outcome.exception
    assert outcome.exit_code == 2, outcome.output
    assert "the task data changed since the run" in outcome.output and "--data" in outcome.output
    assert not (tmp_path / "submission.json").exists() and not (tmp_path / "trajectories").exists()
    fixed = tmp_path / "fixed-retail"  # the same change as a fixed copy: exported regraded, and said so
    shutil.copytree(data, fixed)
    (fixed / "tasks.json").write_text(json.dumps(tasks))
    regraded = export(run, tmp_path / "regraded" / "submission.json", "--data", str(fixed))
    assert regraded.exit_code == 0, regraded.output
    submission = json.loads((tmp_path / "regraded" / "submission.json").read_text())
    assert submission["results"]["retail"]["pass_1"] == 0.0
    assert f"regraded from the stored episodes on the task data at {fixed}" in submission["methodology"]["notes"]
