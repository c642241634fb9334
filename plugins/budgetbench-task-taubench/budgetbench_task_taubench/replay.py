"""A finished tau-bench run played back from its own logs, with no model call.

An episode's agent replies are in ``episodes.jsonl`` (one ``episode_turn`` per call, each with
the reply and the simulated user's completions of that turn), and tools and the scripted user
are deterministic. Feeding the stored replies to a fresh :class:`TauEpisode`, with the stored
user completions answering in order, rebuilds the whole trajectory (every tool call, result
and user message) and grades it again: the export writes upstream's trajectories from it,
and the regrade recomputes rewards with fixed task data. A playback that takes another path
than the run (the user would be asked more or fewer times, an episode ends at another turn)
is an error naming the episode: the logs and the data disagree. The run directory is verified
before anything is read (``budgetbench_core.read_run``): an edited, truncated or forged
``episodes.jsonl`` or cell file is refused naming the file and line, never played back.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgetbench_core import Item, VerifiedRun, read_run

from .task import TauBench, TauEpisode

TASK = "tau-bench"
EPISODE_LOG = "episodes.jsonl"  # the run-level turn log (budgetbench_core.episodes)
Key = tuple[str, str, int, int, str]  # task, strategy, budget, repeat, item_id


class ReplayError(Exception):
    """The run's logs cannot be played back on this task data (not a ValueError: the episode
    turns a ValueError from its user into a user_error ending, and this must not be one)."""


class RecordedUser:
    """The user channel of a playback: the run's user completions, in the order they were made."""

    def __init__(self, completions: list[str], where: str) -> None:
        self._completions = list(completions)
        self._where = where
        self.used = 0

    def complete(self, messages: Any, max_tokens: int) -> str:
        if self.used >= len(self._completions):
            raise ReplayError(f"{self._where}: the playback asks the user more often than the run did")
        self.used += 1
        return self._completions[self.used - 1]


@dataclass
class Played:
    """One episode played back: per turn the run's ``episode_turn`` row and the events it added."""

    key: Key
    row: dict[str, Any]
    episode: TauEpisode
    opening_events: int
    turns: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)
    outcome: dict[str, Any] | None = None


def run_rows(run: VerifiedRun) -> dict[Key, dict[str, Any]]:
    """The terminal rows of the run's tau-bench cells."""
    rows = {key: row for key, row in run.rows.items() if key[0] == TASK}
    if not rows:
        raise ReplayError(f"{run.run_dir}: no {TASK!r} rows (tasks in this run: {sorted({k[0] for k in run.rows})})")
    return rows


def turn_log(run: VerifiedRun) -> dict[Key, list[dict[str, Any]]]:
    """Per episode, its last run of turns from turn 0 (the one its terminal row summarises)."""
    if not (run.run_dir / EPISODE_LOG).is_file():
        raise ReplayError(f"{run.run_dir / EPISODE_LOG}: missing; the run has no episode turns to play back")
    attempts: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for turn in run.logs[EPISODE_LOG]:
        if turn.get("event") != "episode_turn" or turn.get("task") != TASK:
            continue
        key = (TASK, turn["strategy"], int(turn["budget"]), int(turn["repeat"]), str(turn["item_id"]))
        if int(turn["turn"]) == 0:
            attempts[key] = []
        attempts[key].append(turn)
    return dict(attempts)


def task_of(manifest: dict[str, Any], path: str | None = None) -> TauBench:
    """The run's task with its options; ``path`` replaces the data folder (a fixed copy)."""
    options = dict((manifest.get("config") or {}).get("task_options") or {})
    if path is not None:
        options["path"] = path
    return TauBench(**options)


def play(task: TauBench, items: dict[str, Item], key: Key, row: dict[str, Any], turns: list[dict[str, Any]]) -> Played:
    """Replay one episode; grade it again unless the run ended it as a violation or error."""
    where = f"{key[1]} budget {key[2]} repeat {key[3]} task {key[4]}"
    if key[4] not in items:
        raise ReplayError(f"{where}: task {key[4]!r} is not in the {task.options['split']!r} split of {task.folder}")
    user = RecordedUser([c["completion"] for turn in turns for c in turn.get("user_calls") or []], where)
    episode = task.episode(items[key[4]], user)  # type: ignore[arg-type]  # a recorded channel
    try:
        episode.opening()
    except ReplayError:
        if row["event"] == "result" or turns:
            raise
        # a violation or error before the first turn row: its opening user calls were never logged
    played = Played(key, row, episode, len(episode.events))
    for turn in turns:
        before = len(episode.events)
        calls = (turn.get("record") or {}).get("tool_calls")
        step = episode.step(turn["reply"], calls) if episode.tools else episode.step(turn["reply"])
        if step.done != bool(turn["done"]):
            raise ReplayError(f"{where}: turn {turn['turn']} {'ends' if step.done else 'does not end'} the playback")
        played.turns.append((turn, episode.events[before:]))
    if user.used != len(user._completions):
        raise ReplayError(f"{where}: the playback used {user.used} of the run's {len(user._completions)} user replies")
    end_reason = (row.get("episode") or {}).get("end_reason")
    if row["event"] == "result" and end_reason in ("done", "max_turns"):
        played.outcome = episode.outcome(end_reason)
    return played


def play_run(run_dir: Path, path: str | None = None) -> tuple[dict[str, Any], TauBench, list[Played]]:
    """Every episode of the run played back (on the run's data, or on ``path``). The run directory
    is verified first (``budgetbench_core.read_run``): one that does not verify raises
    ``RunReadError`` naming the file and line, and nothing is played back."""
    run = read_run(run_dir, logs=(EPISODE_LOG,))  # verified first: an edited run is refused, never played back
    manifest, rows, log = run.manifest, run_rows(run), turn_log(run)
    task = task_of(manifest, path)
    items = {item.id: item for item in task.load(None, int((manifest.get("config") or {}).get("seed") or 0))}
    played = [play(task, items, key, row, log.get(key, [])) for key, row in sorted(rows.items())]
    return manifest, task, played
