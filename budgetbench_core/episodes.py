"""Agent episodes: a loop of model calls for one item, every call under the cell's budget.

An :class:`EpisodicTask` turns an item into an :class:`Episode`. For each turn the runner
builds the turn's item (the episode's system prompt, the history so far, and the newest
message as the query), asks the strategy for the prompt, and gates, audits and sends it
with the same ``build_prompt`` and ``send`` (``cell_pipeline``) as a single-call cell: one
``prompt_audit`` per call (its ``call`` field is the turn index) and the served-count check
per call. The episode turns each reply into a :class:`Step` (the reply and what answered
it: a tool result, the user's next message), until it says it is done or ``max_turns`` is
reached.

The terminal row carries ``episode``: ``{reward, end_reason, turns, calls,
total_prompt_tokens, peak_prompt_tokens, tool_errors, served_counts_match, user_calls,
user_prompt_tokens, user_completion_tokens, outcome}``. ``end_reason`` is ``done``,
``max_turns``, ``violation`` (a call whose prompt did not fit: the episode stops there,
reward 0) or ``error``. Each turn is also written to ``episodes.jsonl`` (the reply, the
step, and the simulated user's calls, whose tokens are logged there and never budgeted).

Tool calls and their results are marked in message metadata (``exchange`` and
``exchange_part``: ``call`` or ``result``). A strategy must keep them together:
:func:`keep_exchanges` repairs a selection, and the runner refuses (error row) a prompt
that separates a result from its call.
"""

from __future__ import annotations

import functools
import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from .backends import GenerationParams
from .cell import CellLog
from .cell_pipeline import build_prompt, send, strategy_context
from .events import EpisodeSummary, EpisodeTurn, Error, Result, Terminal, Violation
from .messages import Item, Message
from .sandbox import (
    Deadline,
    PluginFailure,
    PrivateView,
    PromptError,
    canonical_prompt,
    contained,
    describe_exception,
    json_safe_or_empty,
)
from .tasks import Task

EXCHANGE = "exchange"
PART = "exchange_part"
EPISODE_LOG = "episodes.jsonl"
JUDGE_CONTEXT = 32768  # the context the runner opens a separate judge backend with


def exchange_of(message: Message) -> tuple[str, str] | None:
    """``(exchange id, "call" | "result")`` when ``message`` is one half of a tool exchange."""
    exchange, part = message.metadata.get(EXCHANGE), message.metadata.get(PART)
    return (str(exchange), str(part)) if exchange is not None and part in ("call", "result") else None


def keep_exchanges(kept: Sequence[Message], history: Sequence[Message], query: Message) -> list[Message]:
    """``kept`` (a selection of ``history``, in order) with no half-exchange: a result whose call
    is not right before it, or a call whose result is not right after it, is dropped; when the
    query is a tool result, its call (the newest history message) is kept right before it,
    even if that no longer fits (the runner then records a violation, never a split)."""
    kept = list(kept)
    out: list[Message] = []
    for index, message in enumerate(kept):
        mark = exchange_of(message)
        if mark and mark[1] == "result":
            previous = exchange_of(kept[index - 1]) if index else None
            if previous != (mark[0], "call"):
                continue
        if mark and mark[1] == "call":
            following = exchange_of(kept[index + 1]) if index + 1 < len(kept) else None
            if following != (mark[0], "result"):
                continue
        out.append(message)
    wanted = exchange_of(query)
    if wanted and wanted[1] == "result" and history and exchange_of(history[-1]) == (wanted[0], "call"):
        if not out or out[-1] is not history[-1] and exchange_of(out[-1]) != (wanted[0], "call"):
            out.append(history[-1])
    return out


def split_exchange(prompt: Sequence[Message]) -> str | None:
    """Why ``prompt`` separates a tool call from its result, or None when it does not."""
    for index, message in enumerate(prompt):
        mark = exchange_of(message)
        if not mark:
            continue
        if mark[1] == "result" and (index == 0 or exchange_of(prompt[index - 1]) != (mark[0], "call")):
            return f"message {index} is the result of tool call {mark[0]!r} without the call right before it"
        if mark[1] == "call" and (index + 1 >= len(prompt) or exchange_of(prompt[index + 1]) != (mark[0], "result")):
            return f"message {index} is tool call {mark[0]!r} without its result right after it"
    return None


@dataclass(frozen=True)
class Step:
    """What one agent reply led to. ``messages`` are appended to the history, the agent's
    reply first (as an assistant message) and then what answered it; the last one is the
    next turn's query. ``record`` is written to the turn log."""

    messages: tuple[Message, ...]
    done: bool = False
    tool_error: bool = False
    record: dict[str, Any] = field(default_factory=dict)


class UserChannel:
    """Model calls of a simulated user: through the harness's caller (temperature 0), counted
    and logged in ``episodes.jsonl``, never budgeted. ``limit`` is the largest prompt the
    served context holds; a longer prompt raises ``ValueError`` without a call."""

    def __init__(self, run: Any, seed: int, limit: int) -> None:
        self._run = run
        self._caller = run.caller
        self._seed = seed
        self.limit = limit
        self.calls: list[dict[str, Any]] = []

    def count(self, messages: Sequence[Message]) -> int:
        return self._run.counter.count(canonical_prompt(list(messages)))

    def complete(self, messages: Sequence[Message], max_tokens: int) -> str:
        prompt = canonical_prompt(list(messages))
        tokens = self._run.counter.count(prompt)
        if tokens > self.limit:
            raise ValueError(
                f"user simulator prompt has {tokens} tokens, more than the served context holds ({self.limit})"
            )
        outcome = self._caller.call(prompt, GenerationParams(int(max_tokens), 0.0, self._seed))
        completion = outcome.completion
        self.calls.append(
            {
                "prompt_tokens": tokens,
                "served_prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "latency_s": completion.latency_s,
                "cached": outcome.cached,
                "completion": completion.text,
            }
        )
        return completion.text


class JudgeChannel(UserChannel):
    """The run's judge (``--judge-model``) for :meth:`Episode.judged`: like :class:`UserChannel`
    (temperature 0, counted with the run's tokenizer, each call kept in ``calls``, never
    budgeted), but through the judge's backend; ``model`` names it."""

    def __init__(self, run: Any, seed: int) -> None:
        separate = run.judge_backend is not None  # a judge model of its own, or the served one
        super().__init__(run, seed, JUDGE_CONTEXT - run.max_output_tokens if separate else max(run.config.budgets))
        self._caller = run.judge_caller
        self.model = str(run.config.judge_model)


class Episode:
    """One item's episode. ``system`` heads every prompt; ``opening()`` is the history before
    the agent's first turn (its last message is the first query)."""

    system: Message | None = None

    @abstractmethod
    def opening(self) -> list[Message]:
        """The messages before the first agent call (at least one)."""

    @abstractmethod
    def step(self, reply: str) -> Step:
        """The agent replied ``reply``: act on it and say what follows."""

    @abstractmethod
    def outcome(self, end_reason: str) -> dict[str, Any]:
        """The grade once the episode ended (``reward`` in [0, 1] plus any detail); called for
        ``done`` and ``max_turns``, never after a violation or error (those score 0)."""

    def judged(self, outcome: dict[str, Any], judge: JudgeChannel) -> dict[str, Any]:
        """Figures from the run's judge, apart from the reward: called after ``outcome`` only
        when the run has ``--judge-model``; the keys returned are added to the outcome (never
        ``reward``). Default: none."""
        return {}


class EpisodicTask(Task):
    """A task whose items are episodes. ``max_turns`` bounds the agent calls of one episode
    (a task option may override it); grading is the episode's ``outcome``, not a grader."""

    max_turns: ClassVar[int] = 30
    outcome_version: ClassVar[str] = "1"

    @abstractmethod
    def episode(self, item: Item, user: UserChannel) -> Episode:
        """A fresh episode for ``item`` (a fresh environment: nothing carries over)."""

    def turn_limit(self) -> int:
        return int(self.options.get("max_turns") or self.max_turns)


class EpisodeCell(CellLog):
    """A cell whose terminal row, whatever writes it, carries the episode's summary."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.episode: dict[str, Any] = asdict(EpisodeSummary())

    def make(self, cls: type, **fields: Any) -> Any:
        event = super().make(cls, **fields)
        if isinstance(event, Terminal):
            summary = dict(self.episode)
            if not isinstance(event, Result):
                summary["end_reason"] = "violation" if isinstance(event, Violation) else "error"
                summary["reward"] = 0.0
            return WithEpisode(event, summary)
        return event


@dataclass(frozen=True)
class WithEpisode:
    """A terminal event whose row also carries ``episode`` (documented by :class:`EpisodeSummary`)."""

    event: Terminal
    episode: dict[str, Any]

    def row(self) -> dict[str, Any]:
        return {**self.event.row(), "episode": self.episode}


def run_episode(run: Any, strategy_name: str, item: Item, budget: int, repeat: int) -> None:
    """One episodic cell: the turn loop, then exactly one terminal row (see the module doc)."""
    task: EpisodicTask = run.task
    cell = EpisodeCell(run.log, run._cell_key(strategy_name, item, budget, repeat), run._tally)
    summary = cell.episode
    task_ref = run.ref("task", run.config.task)
    user = UserChannel(run, run.config.seed + repeat, max(run.config.budgets))
    strategy = run._strategy(strategy_name)
    started = time.perf_counter()
    latency = completion_tokens = attempts = 0.0
    all_cached, matches = True, True
    last_reply, peak_served = "", None
    try:
        try:
            episode = contained(
                "episode", task_ref, lambda: task.episode(item, user), Deadline(run.config.item_timeout_s)
            )
            history = list(contained("episode", task_ref, episode.opening, Deadline(run.config.item_timeout_s)))
        except PluginFailure as failure:
            cell.fail(
                "episode",
                task_ref,
                f"task {run.config.task!r} could not start the episode of item {item.id!r}: {failure.cause}",
            )
            return
        end_reason = "max_turns"
        for turn in range(task.turn_limit()):
            turn_item = replace(item, history=tuple(history[:-1]), query=history[-1], system=episode.system)
            try:
                view = PrivateView(turn_item, run.hidden_metadata)  # stored fields only; no grading key
            except PromptError as exc:
                cell.fail(
                    "episode",
                    task_ref,
                    f"task {run.config.task!r} gave a message the harness cannot use at turn {turn} of item "
                    f"{item.id!r}: {exc}",
                )
                return
            deadline = Deadline(run.config.item_timeout_s)
            context = strategy_context(run, cell, view, budget, repeat, deadline)
            gated = build_prompt(run, cell, strategy, turn_item, view, budget, context, deadline, call=turn)
            if gated is None:  # violation or error: the terminal row is written (reward 0)
                return
            split = split_exchange(gated.prompt)
            if split:
                cell.finish(
                    Error,
                    phase="strategy",
                    plugin=strategy_name,
                    prompt_tokens=gated.tokens,
                    cause=f"strategy {strategy_name!r} split a tool call from its result at turn {turn} of "
                    f"item {item.id!r}: {split}",
                )
                return
            outcome = send(run, cell, gated, repeat)
            if outcome is None:
                return
            completion = outcome.completion
            summary["calls"] += 1
            summary["turns"] = turn + 1
            summary["total_prompt_tokens"] += gated.tokens
            if gated.tokens >= summary["peak_prompt_tokens"]:
                summary["peak_prompt_tokens"], peak_served = gated.tokens, completion.prompt_tokens
            known = completion.prompt_tokens is not None
            matches = matches and (not known or completion.prompt_tokens == gated.tokens)
            summary["served_counts_match"] = matches if known or summary["served_counts_match"] is not None else None
            latency += completion.latency_s or 0.0
            completion_tokens += completion.completion_tokens or 0
            attempts += outcome.attempts
            all_cached = all_cached and outcome.cached
            last_reply = completion.text
            before = 0 if turn == 0 else len(user.calls)  # turn 0 also counts the user's opening calls

            def stepped(reply: str) -> tuple[Step, tuple[Message, ...]]:
                step = episode.step(reply)
                if not isinstance(step, Step) or not step.messages:
                    raise TypeError(f"step returned {type(step).__name__} without messages, not a Step")
                return step, canonical_prompt(list(step.messages))  # checked here: blamed on the task

            try:
                step, appended = contained(
                    "episode",
                    task_ref,
                    functools.partial(stepped, completion.text),
                    Deadline(run.config.item_timeout_s),
                )
            except PluginFailure as failure:
                cell.fail(
                    "episode",
                    task_ref,
                    f"task {run.config.task!r} failed at turn {turn} of item {item.id!r}: {failure.cause}",
                    prompt_tokens=gated.tokens,
                    completion=completion.text,
                )
                return
            summary["tool_errors"] += int(bool(step.tool_error))
            user_calls = user.calls[before:]
            summary["user_calls"] += len(user_calls)
            summary["user_prompt_tokens"] += sum(c["prompt_tokens"] for c in user_calls)
            summary["user_completion_tokens"] += sum(c["completion_tokens"] or 0 for c in user_calls)
            run.log.append(
                EpisodeTurn(
                    **cell.key.fields(),
                    turn=turn,
                    prompt_tokens=gated.tokens,
                    served_prompt_tokens=completion.prompt_tokens,
                    reply=completion.text,
                    done=step.done,
                    tool_error=step.tool_error,
                    record=step.record,
                    appended=[m.to_dict() for m in appended],
                    user_calls=user_calls,
                ).row(),
                run.run_dir / EPISODE_LOG,
            )
            history.extend(step.messages)
            if step.done:
                end_reason = "done"
                break
        try:
            graded = contained(
                "grading",
                task_ref,
                lambda: episode.outcome(end_reason),
                Deadline(max(run.config.item_timeout_s, run.config.timeout_s * 4)),
            )
            reward = float(graded["reward"])
            if not 0.0 <= reward <= 1.0:
                raise ValueError(f"reward {reward} outside [0, 1]")
            if run.config.judge_model:
                judge = JudgeChannel(run, run.config.seed + repeat)
                extra = contained(
                    "grading",
                    task_ref,
                    lambda: episode.judged(dict(graded), judge),
                    # several judge calls (each bounded by the caller's timeout): a wide safety net
                    Deadline(max(run.config.item_timeout_s, run.config.timeout_s * 16)),
                )
                if not isinstance(extra, dict) or "reward" in extra:
                    raise TypeError("judged() must return a dict of figures without 'reward'")
                graded = {**graded, **extra}
        except (PluginFailure, KeyError, TypeError, ValueError) as exc:
            cause = exc.cause if isinstance(exc, PluginFailure) else describe_exception(exc)
            cell.fail("grading", task_ref, f"grading the episode of item {item.id!r} failed: {cause}")
            return
        summary.update(reward=reward, end_reason=end_reason, outcome=json_safe_or_empty(graded))
        peak = summary["peak_prompt_tokens"]
        cell.finish(
            Result,
            prediction=last_reply,
            completion=last_reply,
            answer=json_safe_or_empty(item.answer),
            quality=reward,
            verdict=json_safe_or_empty(graded),
            # the run's grader is named (reports check it); the quality is the episode's reward
            grader={
                "name": run.grader_name,
                "version": str(run.grader.version),
                "episode_outcome": f"{task.name} {task.outcome_version}",
            },
            prompt_tokens=peak,
            served_prompt_tokens=peak_served,
            served_count_matches=summary["served_counts_match"],
            completion_tokens=int(completion_tokens),
            utilisation=peak / budget,
            latency_s=latency,
            strategy_s=time.perf_counter() - started - latency,
            attempts=int(attempts),
            cached=all_cached,
        )
    finally:
        cell.close()
        if cell.terminal is None:  # a harness bug: still never a cell without its row
            cell.finish(Error, phase="cell", cause="the episode ended without a decision (harness error)")
