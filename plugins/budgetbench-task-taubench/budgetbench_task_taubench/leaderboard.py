"""``budgetbench taubench export``: a tau2-bench leaderboard submission from BudgetBench runs.

Upstream's format (docs/leaderboard-submission.md, ``src/tau2/scripts/leaderboard/submission.py``
at the pinned commit): ``submission.json`` (metadata and per-domain pass^1..pass^4 in percent,
with the average agent cost per trajectory) and ``trajectories/<file>.json`` per domain, each
a tau2 ``Results`` file (``info``, ``tasks``, ``simulations`` with their messages and rewards).
One run directory per domain, one cell (strategy, budget) of it, every repeat a trial.

The trajectories are rebuilt by playing the run back from its logs (``replay``); a playback whose
reward differs from the run's is refused (the task data changed since: regrade first). pass^k is
upstream's estimator (``budgetbench_core.pass_k``); an ``error`` row is left out as upstream
leaves out its infrastructure errors, a violation is a failed trial.

The submission is ``custom`` whenever the benchmark side differs from upstream's default setup,
and ``methodology.notes`` says why: a strategy other than ``full_context``, or a budget that
refused a call (either changed what the agent saw); the JSON-action tool format (a modified agent
prompt: ``verification.modified_prompts``); the scripted user. ``omitted_questions`` is true when
the cell did not run every task of the ``base`` split on every trial.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from .domain import PINNED_COMMIT
from .regrade import data_digest
from .replay import Played, ReplayError, play_run

CEILING = "full_context"  # the whole history every call: the strategy that leaves the agent's context as upstream
LEADERBOARD_DOMAINS = ("retail", "airline", "telecom")
TERMINATION = {  # our episode endings -> upstream's TerminationReason values
    "user_stop": "user_stop",
    "agent_stop": "agent_stop",
    "max_steps": "max_steps",
    "too_many_errors": "too_many_errors",
    "user_error": "user_error",
    "max_turns": "max_steps",  # the harness's agent-call bound
    "violation": "context_window_exceeded",  # the budget refused the call: it never reached the model
    "error": "infrastructure_error",  # a model call failed after its retries
}


def _messages(played: Played) -> list[dict[str, Any]]:
    """The episode's trajectory as upstream's messages (assistant, user, tool), oldest first."""
    out: list[dict[str, Any]] = []
    calls = 0

    def add(event: dict[str, Any]) -> None:
        nonlocal calls
        if "tool_call" in event:
            calls += 1
            call = event["tool_call"]
            requestor = event["role"]
            tool_call = {
                "id": f"call_{calls}",
                "name": call["name"],
                "arguments": call["arguments"],
                "requestor": requestor,
            }
            out.append({"role": requestor, "content": None, "tool_calls": [tool_call]})
        elif event["role"] == "tool":
            requestor = event.get("requestor") or "assistant"
            out.append(
                {
                    "role": "tool",
                    "id": f"call_{calls}",
                    "content": event["content"],
                    "requestor": requestor,
                    "error": bool(event.get("error")),
                }
            )
        else:
            out.append({"role": event["role"], "content": event["content"], "tool_calls": None})

    for event in played.episode.events[: played.opening_events]:
        add(event)
    for turn, events in played.turns:
        if turn["record"].get("kind") == "invalid_action":  # no action upstream would see: the raw reply, marked
            out.append(
                {
                    "role": "assistant",
                    "content": turn["reply"],
                    "tool_calls": None,
                    "raw_data": {"invalid_action": turn["record"]},
                }
            )
        for event in events:
            add(event)
    for index, message in enumerate(out):
        message["turn_idx"] = index
    return out


def _reward_info(played: Played) -> dict[str, Any]:
    outcome = played.outcome or {"reward": 0.0, "breakdown": {}}
    info: dict[str, Any] = {"budgetbench_event": played.row["event"]}
    for key in ("note", "ended", "nl_assertions", "nl_assertions_listed", "env_assertions", "actions"):
        if key in outcome:
            info[key] = outcome[key]
    db = outcome.get("db")
    return {
        "reward": float(outcome["reward"]),
        "db_check": {"db_match": bool(db["match"]), "db_reward": float(db["match"])} if db else None,
        "communicate_checks": [
            {"info": c["info"], "met": bool(c["met"]), "justification": ""} for c in outcome.get("communicate") or []
        ]
        or None,
        "reward_basis": list(played.episode.record.reward_basis),
        "reward_breakdown": outcome.get("breakdown") or None,
        "info": info,
    }


def _simulation(played: Played) -> dict[str, Any]:
    row = played.row
    end = (row.get("episode") or {}).get("end_reason")
    ended = (played.outcome or {}).get("ended", end)
    finished = row["time"]
    duration = float(row.get("latency_s") or 0.0)
    started = (dt.datetime.fromisoformat(finished) - dt.timedelta(seconds=duration)).isoformat(timespec="milliseconds")
    return {
        "id": f"{played.key[1]}-{played.key[2]}-r{played.key[3]}-{played.key[4]}",
        "task_id": played.key[4],
        "timestamp": finished,
        "start_time": started,
        "end_time": finished,
        "duration": duration,
        "termination_reason": TERMINATION.get(str(ended), "unexpected_error"),
        "agent_cost": row.get("cost"),
        "user_cost": None,  # the user's calls are metered apart (episodes.jsonl), not priced per row
        "reward_info": _reward_info(played),
        "messages": _messages(played),
        "trial": played.key[3],
        "seed": None,
        "info": {"budgetbench": {"strategy": played.key[1], "budget": played.key[2], "episode": row.get("episode")}},
    }


def _cell(played: list[Played], strategy: str | None, budget: int | None, where: Path) -> list[Played]:
    cells = sorted({(p.key[1], p.key[2]) for p in played})
    chosen = [c for c in cells if strategy in (None, c[0]) and budget in (None, c[1])]
    if len(chosen) != 1:
        listing = ", ".join(f"{s}@{b}" for s, b in cells)
        raise ReplayError(
            f"{where}: {'no' if not chosen else 'more than one'} cell matches; pick one with --strategy and "
            f"--budget (cells: {listing})"
        )
    return [p for p in played if (p.key[1], p.key[2]) == chosen[0]]


def domain_export(run_dir: Path, strategy: str | None, budget: int | None, data: str | None = None) -> dict[str, Any]:
    """One domain of the submission: its trajectory file, results and why it is custom; with ``data``
    (a fixed domain folder) the rewards are regraded on it, as ``budgetbench taubench regrade`` does."""
    from budgetbench_core import pass_k

    manifest, task, played = play_run(run_dir, data)
    domain = task.options["domain"]
    if domain not in LEADERBOARD_DOMAINS:
        raise ReplayError(f"{run_dir}: domain {domain!r} is not on the leaderboard ({', '.join(LEADERBOARD_DOMAINS)})")
    played = _cell(played, strategy, budget, run_dir)
    for p in played if data is None else ():
        if p.outcome is not None and p.outcome["reward"] != p.row["quality"]:
            raise ReplayError(
                f"{run_dir}: task {p.key[4]} repeat {p.key[3]} plays back to reward {p.outcome['reward']}, the run "
                f"recorded {p.row['quality']}: the task data changed since the run; export with --data <the fixed "
                "folder> to regrade it (see `budgetbench taubench regrade`)"
            )
    config = manifest.get("config") or {}
    graded = [p for p in played if p.row["event"] != "error"]
    rewards: dict[str, dict[int, float]] = defaultdict(dict)
    for p in graded:
        rewards[p.key[4]][p.key[3]] = float(p.outcome["reward"]) if p.outcome else 0.0
    figures = pass_k(rewards, max_k=4)
    costs = [p.row.get("cost") for p in played]
    strategy_name, budget_value = played[0].key[1], played[0].key[2]
    reasons = []
    if strategy_name != CEILING:
        reasons.append(f"the memory strategy {strategy_name!r} chose what the agent saw")
    if any(p.row["event"] == "violation" for p in played):
        reasons.append(f"the {budget_value}-token budget refused calls (those trials failed)")
    if task.manifest_notes()["tools_mode"] == "json":
        reasons.append("tools were described in the agent prompt as JSON actions, not native tool schemas")
    if task.options["user"] == "scripted":
        reasons.append("the user was BudgetBench's scripted user, not an LLM user simulator")
    repeats = int(config.get("repeats") or 1)
    in_base = {r.id for r in task.domain.split("base")}
    trials = {(p.key[4], p.key[3]) for p in graded}
    omitted = any((tid, r) not in trials for tid in in_base for r in range(repeats))
    results = {
        f"pass_{k}": (100 * figures["pass_k"][k] if k in figures.get("pass_k", {}) else None) for k in range(1, 5)
    }
    results["cost"] = sum(costs) / len(costs) if costs and all(c is not None for c in costs) else None
    trajectories = {
        "timestamp": manifest.get("started"),
        "info": {
            "git_commit": PINNED_COMMIT,
            "num_trials": repeats,
            "max_steps": task.options["max_steps"],
            "max_errors": task.options["max_errors"],
            "user_info": {
                "implementation": "budgetbench-scripted-user"
                if task.options["user"] == "scripted"
                else "user_simulator",
                "llm": None if task.options["user"] == "scripted" else str(config.get("model")),
                "llm_args": None if task.options["user"] == "scripted" else {"temperature": 0.0},
            },
            "agent_info": {
                "implementation": f"budgetbench {strategy_name}@{budget_value} ({task.manifest_notes()['action_format']})",
                "llm": str(config.get("model")),
                "llm_args": {"temperature": config.get("temperature"), "max_tokens": config.get("max_output_tokens")},
            },
            "environment_info": {"domain_name": domain, "policy": task.domain.policy},
            "seed": config.get("seed"),
        },
        "tasks": [task.domain.task(tid).raw for tid in sorted({p.key[4] for p in played})],
        "simulations": [_simulation(p) for p in played],
    }
    return {
        "domain": domain,
        "model": str(config.get("model")),
        "user": "scripted" if task.options["user"] == "scripted" else str(config.get("model")),
        "results": results,
        "trajectories": trajectories,
        "reasons": reasons,
        "omitted": omitted,
        "flip_rate": figures.get("flip_rate"),
        "cell": f"{strategy_name}@{budget_value}",
        "evaluation_date": str(manifest.get("started") or "")[:10] or None,
        "regraded": None
        if data is None
        else f"{domain} rewards regraded from the stored episodes on the task data at {task.folder} "
        f"(sha256 {data_digest(task.folder, domain)[:16]})",
    }


def export(
    run_dirs: list[Path],
    out: Path,
    *,
    model_organization: str,
    submitting_organization: str,
    email: str | None = None,
    model_name: str | None = None,
    strategy: str | None = None,
    budget: int | None = None,
    data: str | None = None,
) -> dict[str, Any]:
    """Write ``out`` (submission.json) and ``trajectories/`` beside it; return the submission."""
    if data is not None and len(run_dirs) != 1:
        raise ReplayError(f"--data is one domain's fixed folder: give one run directory with it, not {len(run_dirs)}")
    parts = [domain_export(Path(d), strategy, budget, data) for d in run_dirs]
    domains = [p["domain"] for p in parts]
    if len(set(domains)) != len(domains):
        raise ReplayError(f"one run per domain: {', '.join(domains)} (upstream takes one result per domain)")
    if len({(p["model"], p["user"]) for p in parts}) > 1:
        raise ReplayError("every domain must use the same agent model and user simulator (upstream's requirement)")
    name = model_name or parts[0]["model"]
    folder = out.parent / "trajectories"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for part in parts:
        trials = part["trajectories"]["info"]["num_trials"]
        filename = f"{name.replace('/', '_')}_{part['domain']}_{part['cell']}_{trials}trials.json"
        (folder / filename).write_text(json.dumps(part["trajectories"], indent=1, ensure_ascii=False), encoding="utf-8")
        files[part["domain"]] = filename
    reasons = sorted({f"{p['domain']}: {r}" for p in parts for r in p["reasons"]})
    flips = "; ".join(
        f"{p['domain']} {p['cell']} flip rate {p['flip_rate']:.2f}" for p in parts if p["flip_rate"] is not None
    )
    submission = {
        "model_name": name,
        "model_organization": model_organization,
        "submitting_organization": submitting_organization,
        "submission_date": dt.date.today().isoformat(),
        "submission_type": "custom" if reasons else "standard",
        "modality": "text",
        "contact_info": {"email": email},
        "results": {p["domain"]: p["results"] for p in parts},
        "trajectories_available": True,
        "trajectory_files": files,
        "methodology": {
            "evaluation_date": min(filter(None, (p["evaluation_date"] for p in parts)), default=None),
            "tau2_bench_version": f"commit {PINNED_COMMIT}",
            "user_simulator": parts[0]["user"],
            "notes": "Run with BudgetBench's own implementation of the tau2 domains and orchestrator. "
            + ("Custom because " + "; ".join(reasons) + ". " if reasons else "")
            + (flips + ". " if flips else "")
            + "".join(p["regraded"] + ". " for p in parts if p["regraded"]),
            "verification": {
                "modified_prompts": any("JSON actions" in r for r in reasons),
                "omitted_questions": any(p["omitted"] for p in parts),
                "details": "base split, every task on every trial"
                if not any(p["omitted"] for p in parts)
                else "not every base-split task ran on every trial (a split, --limit, or error rows)",
            },
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(submission, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return submission
