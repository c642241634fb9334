"""The turn loop of an agent episode (the contract is ``episodes``): every agent call is
built, gated, audited and sent with the same steps as a single-call cell (``pipeline``), and
the episode writes exactly one terminal row."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..cell import CellLog
from ..episodes import EPISODE_LOG, EpisodicTask, JudgeChannel, Step, UserChannel, exchange_of, split_exchange
from ..events import EpisodeSummary, EpisodeTurn, Error, Result, Terminal, Violation
from ..messages import TOOL_CALL_ID, TOOL_CALLS, Item, Message
from ..sandbox import (
    Deadline,
    PluginFailure,
    PromptError,
    canonical_prompt,
    contained,
    describe_exception,
    json_safe_or_empty,
)
from .pipeline import build_prompt, send, strategy_context
from .services import CellServices


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


def produced(message: Message, mark: tuple[str, str]) -> tuple[Any, ...]:
    """What identifies a marked message the episode produced: role, text, mark, and the native
    tool-call fields ``to_chat`` sends (so a strategy cannot alter a call or its id either)."""
    meta = message.metadata
    return (message.role, message.content, mark, meta.get(TOOL_CALLS), meta.get(TOOL_CALL_ID))


def fabricated(prompt: Sequence[Message], happened: set[tuple[Any, ...]]) -> str | None:
    """Which marked message of ``prompt`` is no exchange the episode produced, or None."""
    for index, message in enumerate(prompt):
        mark = exchange_of(message)
        if mark and produced(message, mark) not in happened:
            return f"message {index} ({mark[1]} of tool exchange {mark[0]!r})"
    return None


def tools_json(tools: Any) -> str | None:
    """An episode's tool schemas as the JSON text sent and counted, or None when it has none."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise TypeError(f"Episode.tools must be a list of tool schemas (dicts), got {type(tools).__name__}")
    return json.dumps(tools, ensure_ascii=False)


def run_episode(services: CellServices, strategy_name: str, item: Item, budget: int, repeat: int) -> None:
    """One episodic cell: the turn loop, then exactly one terminal row (see the module doc)."""
    task: EpisodicTask = services.task  # type: ignore[assignment]
    cell = EpisodeCell(services.log, services.cell_key(strategy_name, item, budget, repeat), services.tally)
    summary = cell.episode
    task_ref = services.task_ref
    settings = services.settings
    user = UserChannel(services.counter, services.caller, settings.seed + repeat, settings.user_context)
    strategy = services.strategies.get(strategy_name)
    latency = strategy_s = completion_tokens = attempts = 0.0
    all_cached, matches = True, True
    last_reply, peak_served = "", None
    try:
        try:
            episode = contained(
                "episode", task_ref, lambda: task.episode(item, user), Deadline(settings.item_timeout_s)
            )
            history = list(contained("episode", task_ref, episode.opening, Deadline(settings.item_timeout_s)))
            tools = tools_json(getattr(episode, "tools", None))  # duck-typed episodes may lack it
        except (PluginFailure, TypeError) as failure:
            cell.fail(
                "episode",
                task_ref,
                f"task {settings.task!r} could not start the episode of item {item.id!r}: "
                f"{failure.cause if isinstance(failure, PluginFailure) else failure}",
            )
            return
        # with tool schemas, every count of the agent's prompts (the strategy's, the gate's) includes them
        agent = replace(services, counter=services.counter.with_tools(tools)) if tools else services
        end_reason = "max_turns"
        episode_deadline = Deadline(task.time_limit())
        happened: set[tuple[Any, ...]] = set()  # the exchanges this episode produced
        for turn in range(task.turn_limit()):
            happened |= {produced(m, mark) for m in history if (mark := exchange_of(m))}
            if episode_deadline.expired():
                cell.fail(
                    "episode",
                    task_ref,
                    f"the episode of item {item.id!r} ran past its deadline of {task.time_limit():g} s after "
                    f"{turn} turns (task option episode_timeout_s)",
                )
                return
            turn_item = replace(item, history=tuple(history[:-1]), query=history[-1], system=episode.system)
            try:
                view = services.view(turn_item)  # stored fields only; no grading key, an opaque id
            except PromptError as exc:
                cell.fail(
                    "episode",
                    task_ref,
                    f"task {settings.task!r} gave a message the harness cannot use at turn {turn} of item "
                    f"{item.id!r}: {exc}",
                )
                return
            deadline = Deadline(settings.item_timeout_s)
            context = strategy_context(services, cell, view, budget, repeat, deadline, agent.counter)
            gated = build_prompt(agent, cell, strategy, turn_item, view, budget, context, deadline, call=turn)
            if gated is None:  # violation or error: the terminal row is written (reward 0)
                return
            strategy_s += cell.strategy_s or 0.0
            made_up = fabricated(gated.prompt, happened)
            if made_up:
                cell.finish(
                    Violation,
                    phase="fabricated_tool_result",
                    plugin=strategy_name,
                    prompt_tokens=gated.tokens,
                    cause=f"strategy {strategy_name!r} put a tool exchange in its prompt at turn {turn} of item "
                    f"{item.id!r} that did not happen in this episode: {made_up}",
                )
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
            outcome = send(services, cell, gated, repeat, tools)
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
            latency += 0.0 if outcome.cached else (completion.latency_s or 0.0)  # a cache hit took no model time
            completion_tokens += completion.completion_tokens or 0
            attempts += outcome.attempts
            all_cached = all_cached and outcome.cached
            last_reply = completion.text
            before = 0 if turn == 0 else len(user.calls)  # turn 0 also counts the user's opening calls

            def stepped(reply: str, calls: list[dict[str, Any]] | None) -> tuple[Step, tuple[Message, ...]]:
                step = episode.step(reply, calls or []) if tools else episode.step(reply)
                if not isinstance(step, Step) or not step.messages:
                    raise TypeError(f"step returned {type(step).__name__} without messages, not a Step")
                return step, canonical_prompt(list(step.messages))  # checked here: blamed on the task

            try:
                step, appended = contained(
                    "episode",
                    task_ref,
                    functools.partial(stepped, completion.text, completion.tool_calls),
                    Deadline(settings.item_timeout_s),
                )
            except PluginFailure as failure:
                cell.fail(
                    "episode",
                    task_ref,
                    f"task {settings.task!r} failed at turn {turn} of item {item.id!r}: {failure.cause}",
                    prompt_tokens=gated.tokens,
                    completion=completion.text,
                )
                return
            summary["tool_errors"] += int(bool(step.tool_error))
            user_calls = user.calls[before:]
            summary["user_calls"] += len(user_calls)
            summary["user_prompt_tokens"] += sum(c["prompt_tokens"] for c in user_calls)
            summary["user_completion_tokens"] += sum(c["completion_tokens"] or 0 for c in user_calls)
            services.log.append(
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
                services.run_dir / EPISODE_LOG,
            )
            if services.on_turn is not None:
                services.on_turn(
                    {
                        "strategy": strategy_name,
                        "budget": budget,
                        "repeat": repeat,
                        "item_id": item.id,
                        "turn": turn + 1,
                        "max_turns": task.turn_limit(),
                        "prompt_tokens": gated.tokens,
                        "latency_s": completion.latency_s,
                        "cached": outcome.cached,
                    }
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
                Deadline(max(settings.item_timeout_s, settings.timeout_s * 4)),
            )
            reward = float(graded["reward"])
            if not 0.0 <= reward <= 1.0:
                raise ValueError(f"reward {reward} outside [0, 1]")
            if settings.judge_model:
                judge = JudgeChannel(
                    services.counter,
                    services.judge_caller,
                    settings.seed + repeat,
                    settings.judge_context,
                    settings.judge_model,
                )
                extra = contained(
                    "grading",
                    task_ref,
                    lambda: episode.judged(dict(graded), judge),
                    # several judge calls (each bounded by the caller's timeout): a wide safety net
                    Deadline(max(settings.item_timeout_s, settings.timeout_s * 16)),
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
                "name": services.grader_name,
                "version": str(services.grader.version),
                "episode_outcome": f"{task.name} {task.outcome_version}",
            },
            prompt_tokens=peak,
            served_prompt_tokens=peak_served,
            served_count_matches=summary["served_counts_match"],
            completion_tokens=int(completion_tokens),
            utilisation=peak / budget,
            latency_s=latency,
            strategy_s=strategy_s,  # summed over the turns' strategy calls, as a single-call cell's
            attempts=int(attempts),
            cached=all_cached,
        )
    finally:
        cell.close()
        if cell.terminal is None:  # a harness bug: still never a cell without its row
            cell.finish(Error, phase="cell", cause="the episode ended without a decision (harness error)")
