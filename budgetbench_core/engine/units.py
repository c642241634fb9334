"""One unit: a strategy's cells of one item, after one reset (contained, with a deadline).

A unit builds the prompt of every (budget, repeat) of its item in the order it was given,
so per-item strategy state (an embedding index, a retrieval) is built once and reused for
every tier; then it gives its strategy back (an isolated one's worker serves the next unit
while this one waits on the model) and sends the prompts. An episodic task's cells are
episodes, which keep their strategy to the end, unless the run is prompts-only (the first
prompt of each is gated, nothing is sent).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..episodes import EpisodicTask
from ..events import Error
from ..executors import Unit
from ..host.remote import RemoteStrategy
from ..messages import Item
from ..sandbox import Deadline, PluginFailure, PluginRef, contained, describe_exception
from ..strategies import MemoryStrategy, resets_nothing
from .episode_loop import run_episode
from .pipeline import prepare_cell, send_cell
from .services import CellServices, PromptServices


def run_unit(services: CellServices, unit: Unit, progress: Callable[[str, int], None]) -> None:
    """Reset the strategy, then run the unit's cells in order; ``progress(strategy, 1)`` per cell."""
    if not unit.todo:
        return
    item = unit.item
    prepared = []
    try:
        strategy = reset_for_item(services, unit.strategy, item, unit.todo)
        if strategy is None:
            for _ in unit.todo:
                progress(unit.strategy, 1)
            return
        # an isolated strategy's view stays here, only its frame crosses: nothing to copy or check
        view = services.view(item, sealed=isinstance(strategy, RemoteStrategy))
        episodic = isinstance(services.task, EpisodicTask) and not services.settings.prompts_only
        for budget, repeat in unit.todo:
            if services.stop.is_set():
                return
            if episodic:
                run_episode(services, unit.strategy, item, budget, repeat)
                progress(unit.strategy, 1)
                continue
            ready = prepare_cell(services, unit.strategy, item, view, budget, repeat)
            if ready is None:
                progress(unit.strategy, 1)
            else:
                prepared.append((ready, repeat))
    finally:
        services.strategies.release(unit.strategy)
    for (cell, gated), repeat in prepared:
        if services.stop.is_set():  # left without a row, as if the run had stopped before it: resumed later
            return
        send_cell(services, cell, item, gated, repeat)
        progress(unit.strategy, 1)


def reset_for_item(
    services: PromptServices, name: str, item: Item, todo: Sequence[tuple[int, int]]
) -> MemoryStrategy | None:
    """The strategy ``name``, reset before ``item`` (contained, with a deadline); None after a
    failed reset, when every cell of ``todo`` (``(budget, repeat)``) has its error row."""
    strategy = services.strategies.get(name)
    try:
        no_op = strategy.resets_nothing() if isinstance(strategy, RemoteStrategy) else resets_nothing(strategy)
        if not no_op:  # the base class's no-op needs no call
            contained(
                "reset", services.strategies.ref(name), strategy.reset, Deadline(services.settings.item_timeout_s)
            )
    except PluginFailure as failure:
        services.strategies.discard(name)
        cause = describe_exception(failure.original) if failure.original else failure.cause
        for budget, repeat in todo:
            services.cell(name, item, budget, repeat).fail(
                "reset",
                PluginRef("strategy", name, failure.plugin.distribution),
                f"strategy {name!r} reset failed before item {item.id!r}: {cause}",
            )
        return None
    return strategy


def lost(services: CellServices, unit: Unit, cause: str) -> None:
    """A unit an executor lost (its worker died): every cell still to do is an error row."""
    for budget, repeat in unit.todo:
        services.cell(unit.strategy, unit.item, budget, repeat).finish(
            Error, phase="executor", plugin=unit.strategy, cause=cause
        )
