"""The steps of one cell: build the prompt, gate it, send it, grade the reply.

A single-call cell is ``prepare_cell`` (the strategy's part) then ``send_cell`` (the model's
part), so a unit can build all its prompts before it sends any; ``episode_loop.run_episode``
reuses ``build_prompt`` and ``send`` for every call of an episode. Each step writes the cell's terminal row itself
when it ends the cell (error or violation) and returns None. Every step takes the run's
``CellServices``; every plugin call here is ``contained`` and bound by the cell's deadline.
A prompts-only run stops after the gate: its terminal row is ``admitted``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ..backends import GenerationParams
from ..cell import AuxChannel, CellLog
from ..controls import HarnessControl, control_prompt
from ..events import Admitted, Error, PromptAudit, Result, Violation, Warning
from ..evidence import evidence_outcome
from ..gate import AuxiliaryBudgetError, Gated, admit, served_over_budget
from ..host.remote import RemoteStrategy
from ..memory_systems import IngestLossError, MemorySystemStrategy
from ..messages import Item, Message
from ..model_calls import CallFailed
from ..retrievals import load_retrieval, save_retrieval
from ..sandbox import (
    HISTORY_MUTATED,
    Deadline,
    PluginFailure,
    PluginRef,
    PrivateView,
    PromptError,
    SealedView,
    Stage,
    StageFailure,
    canonical_prompt,
    contained_stages,
    describe_exception,
    json_safe_or_empty,
    validate_prompt,
)
from ..strategies import MemoryStrategy, StrategyContext
from ..tokenizers import PromptCounter
from .services import CellServices, PromptServices


def _no_model_calls(messages: Sequence[Message], max_tokens: int, purpose: str) -> str:
    """``context.complete`` of a prompts-only run: the strategy's cell becomes an error row."""
    raise RuntimeError(f"prompts-only run: auxiliary model call {purpose!r} refused (no model is called)")


def _strategy_cause(name: str, item: Item, failure: PluginFailure) -> str:
    detail = describe_exception(failure.original) if failure.original is not None else failure.cause
    return f"strategy {name!r} failed on item {item.id!r} ({failure.phase}, {failure.plugin.distribution}): {detail}"


def strategy_context(
    services: PromptServices,
    cell: CellLog,
    view: PrivateView | SealedView,
    budget: int,
    repeat: int,
    deadline: Deadline,
    counter: PromptCounter | None = None,
) -> StrategyContext:
    """The context of one strategy call: its view of the item, and auxiliary calls through the
    cell's gated channel (refused in a prompts-only run). ``counter`` counts the prompts the
    strategy builds (default the run's; an agent call with tool schemas counts them too), while
    auxiliary calls, sent without tools, are gated with the run's."""
    caller = None if services.settings.prompts_only else services.caller
    channel: Callable[[Sequence[Message], int, str], str] = (
        _no_model_calls
        if caller is None
        else AuxChannel(cell, services.counter, caller, services.settings.seed + repeat, deadline)
    )
    return StrategyContext(
        item=view.item,
        budget=budget,
        counter=counter or services.counter,
        seed=services.settings.seed + repeat,
        scratch_dir=services.scratch_dir,
        complete=channel,
    )


def build_prompt(
    services: PromptServices,
    cell: CellLog,
    strategy: MemoryStrategy,
    item: Item,
    view: PrivateView | SealedView,
    budget: int,
    context: StrategyContext,
    deadline: Deadline,
    call: int = 0,
) -> Gated | None:
    """Ask the strategy for a prompt, canonicalise, validate, count and audit it.

    Returns the gated prompt when it may be sent; otherwise writes the cell's terminal
    row (error or violation) and returns None. Call it once per model call of an episode.
    ``item`` is the runner's own copy; ``view`` the private copy the strategy was given.
    """
    name = cell.key.strategy
    retriever = strategy if isinstance(strategy, (MemorySystemStrategy, RemoteStrategy)) else None
    if retriever is not None:  # read here, not in the strategy's stage: one that does not verify stops the run
        retriever.saved_retrieval = load_retrieval(services.run_dir, name, item.id, services.log.key)

    def apply() -> tuple[tuple[Message, ...], list[str], Any]:
        if isinstance(strategy, RemoteStrategy):
            strategy.cell = cell  # its own SDK's calls through the gateway are charged to this cell
        try:
            if isinstance(strategy, HarnessControl):  # needs the full item: built here, never by a plugin
                returned = control_prompt(name, item, budget, services.counter)
            else:
                returned = strategy.apply(view.item.history, budget, context)
        finally:  # saved even when the cell then fails (an ingest loss): every tier reuses it
            if retriever is not None and retriever.new_retrieval is not None:
                save_retrieval(services.run_dir, name, item.id, retriever.new_retrieval, services.log.key)
        dropped: list[str] = []
        prompt = canonical_prompt(returned, dropped)
        validate_prompt(item, prompt)
        if not view.intact():
            raise PromptError(HISTORY_MUTATED)
        copied = json_safe_or_empty(context.audit)
        cell.strategy_s = time.monotonic() - started
        return prompt, dropped, copied

    def counted(built: tuple[tuple[Message, ...], list[str], Any]) -> tuple[Gated, int | None]:
        gated = admit(built[0], budget, services.counter, built[1])
        plain = services.counter.without_tools  # set on the counter of calls that send tool schemas
        return gated, None if plain is None else gated.tokens - plain.count(gated.prompt)

    started = time.monotonic()
    try:  # one handoff: the strategy's call, then the tokenizer's (each with its own deadline and blame)
        (prompt, dropped, audit), (gated, tools_tokens) = contained_stages(
            Stage("strategy", services.strategies.ref(name), lambda _: apply(), deadline),
            Stage(
                "counting",
                services.tokenizer_ref,
                lambda built: (built, counted(built)),
                float(services.settings.item_timeout_s),
            ),
        )
    except StageFailure as stopped:
        failure = stopped.failure
        cell.close()  # a thread left behind can no longer reach the server through `complete`
        if stopped.stage == 1:
            cell.fail(
                "counting",
                services.tokenizer_ref,
                f"token counting failed: {failure.cause}",
                strategy_s=cell.strategy_s,
            )
            return None
        spent = time.monotonic() - started
        if failure.timed_out:
            services.strategies.discard(name)
        original = failure.original
        if isinstance(original, AuxiliaryBudgetError):
            cell.finish(
                Violation,
                phase="auxiliary",
                prompt_tokens=original.prompt_tokens,
                cause=describe_exception(original),
                plugin=name,
                strategy_s=spent,
            )
            return None
        phase = "ingest" if isinstance(original, IngestLossError) else failure.phase
        if (
            failure.timed_out
            and isinstance(strategy, (MemorySystemStrategy, RemoteStrategy))
            and strategy.current_phase
        ):
            phase = strategy.current_phase  # hung in ingest or retrieve
        cell.fail(
            phase,
            PluginRef("strategy", name, failure.plugin.distribution),
            _strategy_cause(name, item, failure),
            strategy_s=spent,
        )
        return None
    strategy_s = cell.strategy_s
    cell.evidence = evidence_outcome(services.evidence.get(item.id, ()), gated.prompt)
    cell.emit(
        PromptAudit,
        call=call,
        prompt_hash=gated.prompt_hash,
        prompt_tokens=gated.tokens,
        tools_tokens=tools_tokens,
        messages=gated.messages(),
        metadata_dropped=dropped,
        strategy_audit=audit if isinstance(audit, dict) else {},
        evidence=cell.evidence,
    )
    if not gated.admitted:
        cell.close()
        cell.finish(Violation, phase="prompt", prompt_tokens=gated.tokens, strategy_s=strategy_s, plugin=name)
        return None
    if cell.served_violation:
        cell.close()
        cell.finish(
            Violation,
            phase="served",
            prompt_tokens=gated.tokens,
            cause=cell.served_violation,
            strategy_s=strategy_s,
            plugin=name,
        )
        return None
    return gated


def send(services: CellServices, cell: CellLog, gated: Gated, repeat: int, tools: str | None = None) -> Any:
    """Send an admitted prompt (with ``tools``, the JSON array of tool schemas it was counted
    with); returns the CallOutcome, or None after writing the terminal row."""
    params = GenerationParams(
        services.settings.max_output_tokens, services.settings.temperature, services.settings.seed + repeat, tools
    )
    strategy_s = cell.strategy_s
    try:
        outcome = services.caller.call(gated.prompt, params, chat_json=gated.chat_json)
    except CallFailed as exc:
        cell.finish(
            Error,
            phase="model",
            cause=str(exc),
            attempts=exc.attempts,
            prompt_tokens=gated.tokens,
            plugin=services.backend_name,
            strategy_s=strategy_s,
        )
        return None
    for warning in outcome.warnings:
        cell.emit(Warning, kind="cache_corrupt", detail=warning)
    completion = outcome.completion
    if served_over_budget(completion.prompt_tokens, gated.budget):
        cell.finish(
            Violation,
            phase="served",
            prompt_tokens=gated.tokens,
            served_prompt_tokens=completion.prompt_tokens,
            completion=completion.text,
            cached=outcome.cached,
            cause=f"the server counted {completion.prompt_tokens} prompt tokens, over the budget of "
            f"{gated.budget} (we counted {gated.tokens})",
            strategy_s=strategy_s,
        )
        return None
    return outcome


def grade(services: CellServices, cell: CellLog, item: Item, gated: Gated, outcome: Any) -> None:
    """Extract the prediction and grade it; writes the terminal row."""
    completion = outcome.completion
    strategy_s = cell.strategy_s
    failed = dict(
        completion=completion.text,
        prompt_tokens=gated.tokens,
        served_prompt_tokens=completion.prompt_tokens,
        strategy_s=strategy_s,
    )
    task_ref = services.task_ref
    grader_ref = services.grader_ref

    def extracted(_: None) -> str:
        prediction = services.task.extract_prediction(item, completion.text)
        if not isinstance(prediction, str):
            raise PluginFailure(
                "extract",
                task_ref,
                f"task {services.settings.task!r} extract_prediction returned {type(prediction).__name__}, not str",
            )
        return str.__str__(prediction)

    def checked_verdict(prediction: str) -> tuple[str, float, Any]:
        verdict = services.grader.grade(item, prediction, services.grading(cell))
        quality = verdict.quality
        if isinstance(quality, bool) or not isinstance(quality, (int, float)):
            raise TypeError(f"quality is {type(quality).__name__}, not a number")
        quality = float(quality)
        if not 0.0 <= quality <= 1.0:
            raise ValueError(f"quality {quality} outside [0, 1]")
        return prediction, quality, json_safe_or_empty(verdict.detail)

    try:  # one handoff: the task's extraction, then the grader (each with its own deadline and blame)
        prediction, quality, detail = contained_stages(
            Stage("extract", task_ref, extracted, float(services.settings.item_timeout_s)),
            Stage(
                "grading",
                grader_ref,
                checked_verdict,
                float(max(services.settings.item_timeout_s, services.settings.timeout_s * 4)),
            ),
        )
    except StageFailure as stopped:
        if stopped.stage == 0:
            cell.fail("extract", task_ref, f"extracting the prediction failed: {stopped.failure.cause}", **failed)
        else:
            cell.fail("grading", grader_ref, f"grading failed: {stopped.failure.cause}", **failed)
        return
    served = completion.prompt_tokens
    cell.finish(
        Result,
        prediction=prediction,
        completion=completion.text,
        answer=json_safe_or_empty(item.answer),
        quality=quality,
        verdict=detail if isinstance(detail, dict) else {},
        grader={"name": services.grader_name, "version": str(services.grader.version)},
        prompt_tokens=gated.tokens,
        served_prompt_tokens=served,
        served_cached_tokens=completion.cached_tokens,
        served_count_matches=None if served is None else served == gated.tokens,
        completion_tokens=completion.completion_tokens,
        utilisation=gated.tokens / gated.budget,
        latency_s=completion.latency_s,
        strategy_s=strategy_s,
        cost=completion.cost,
        attempts=outcome.attempts,
        cached=outcome.cached,
    )


def prepare_cell(
    services: CellServices, strategy_name: str, item: Item, view: PrivateView | SealedView, budget: int, repeat: int
) -> tuple[CellLog, Gated] | None:
    """A cell's strategy part: its prompt, built, gated and audited, ready to send (``send_cell``).

    Returns None when the cell has ended here (its terminal row written: an error, a
    violation, or ``admitted`` in a prompts-only run). The cell's channel is closed either
    way: the strategy's part is over and it takes no more auxiliary calls.
    """
    cell = services.cell(strategy_name, item, budget, repeat)
    try:
        strategy = services.strategies.get(strategy_name)
        # from here: a worker started above (its predecessor was discarded) is not the plugin's time
        deadline = Deadline(services.settings.item_timeout_s)
        context = strategy_context(services, cell, view, budget, repeat, deadline)
        gated = build_prompt(services, cell, strategy, item, view, budget, context, deadline)
        cell.close()
        if gated is None:
            return None
        if services.settings.prompts_only:
            cell.finish(
                Admitted,
                prompt_tokens=gated.tokens,
                prompt_hash=gated.prompt_hash,
                utilisation=gated.tokens / gated.budget,
                strategy_s=cell.strategy_s,
            )
            return None
        return cell, gated
    except BaseException:
        ensure_terminal(cell)
        raise


def send_cell(services: CellServices, cell: CellLog, item: Item, gated: Gated, repeat: int) -> None:
    """A prepared cell's model part: send, grade; exactly one terminal row, nothing after it."""
    try:
        outcome = send(services, cell, gated, repeat)
        if outcome is not None:
            grade(services, cell, item, gated, outcome)
    finally:
        ensure_terminal(cell)


def ensure_terminal(cell: CellLog) -> None:
    """A harness bug must still never leave a cell without its row."""
    cell.close()
    if cell.terminal is None:
        cell.finish(Error, phase="cell", cause="the cell ended without a decision (harness error)")
