"""Item intake: the task's items read lazily, made canonical and checked as they arrive.

Each ``next`` of the task's loader is contained (a failure names the task and its
distribution); an item becomes plain core messages with a str id, its evidence marks are
read, and an id seen twice stops the run. The driver streams items through ``stream``; a
remote worker admits the driver's items through ``admit``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from ..evidence import EvidenceMarkError, evidence_marks
from ..messages import Item, Message
from ..plugins import PluginError
from ..run_config import RunConfig, RunConfigError
from ..sandbox import Deadline, PluginFailure, PluginRef, PromptError, canonical_message, contained, describe_exception
from ..tasks import Task, TaskDataError
from .run_plugins import LOAD_TIMEOUT_S


def canonical_item(task: str, item: Any) -> Item:
    """The task's item with plain core messages and a str id; bad text names the item and field."""
    if not isinstance(item, Item):
        raise TaskDataError(f"task {task!r} yielded {type(item).__name__}, not Item")
    item_id = item.id
    if not isinstance(item_id, str) or not item_id:
        raise TaskDataError(
            f"task {task!r} yielded an item whose id is {type(item_id).__name__} {item_id!r}, not a non-empty str"
        )
    item_id = str.__str__(item_id)

    def plain(message: Any, where: str) -> Message:
        try:
            return canonical_message(message, where)
        except PromptError as exc:
            raise TaskDataError(
                f"task {task!r}, item {item_id!r}: {exc}; decode the source file strictly "
                f"and use roles system/user/assistant"
            ) from None

    history = tuple(plain(m, f"history[{i}]") for i, m in enumerate(tuple(item.history)))
    return replace(
        item,
        id=item_id,
        history=history,
        query=plain(item.query, "query"),
        system=plain(item.system, "system") if item.system is not None else None,
    )


class ItemIntake:
    """The run's items as they arrive; ``evidence`` (item id -> marks) and ``selected_ids``
    (every id the task offered, in order) grow with them."""

    def __init__(self, config: RunConfig, task: Task, task_ref: PluginRef) -> None:
        self.config = config
        self.task = task
        self.task_ref = task_ref
        self.evidence: dict[str, list] = {}
        self.selected_ids: list[str] = []

    def admit(self, item: Any) -> Item:
        """The task's item made canonical (plain messages, str id); bad data names the item."""
        item = canonical_item(self.config.task, item)
        try:
            self.evidence[item.id] = evidence_marks(item.history)
        except EvidenceMarkError as exc:
            raise TaskDataError(f"task {self.config.task!r}, item {item.id!r}: {exc}") from None
        return item

    def stream(self, wanted: Callable[[str], bool]) -> Iterator[Item]:
        """The task's items, read lazily: each ``next`` of its loader is contained (any failure
        names the task and its distribution; a ``TaskDataError`` passes through unchanged).
        Only items ``wanted`` accepts are yielded; an item id seen twice stops the run."""
        ref = self.task_ref
        seen: set[str] = set()
        yielded: set[str] = set()
        end = object()

        def check(item_id: Any) -> bool:
            item_id = str(item_id)
            if item_id in seen:
                raise RunConfigError(f"task {self.config.task!r} produced duplicate item ids: [{item_id!r}]")
            seen.add(item_id)
            self.selected_ids.append(item_id)
            return wanted(item_id)

        def step(function: Callable[[], Any]) -> Any:
            try:
                return contained("load", ref, function, Deadline(LOAD_TIMEOUT_S))
            except PluginFailure as failure:
                if isinstance(failure.original, (TaskDataError, RunConfigError)):
                    raise failure.original from None  # already names the file, record and field
                raise PluginError(
                    f"task {self.config.task!r} ({ref.distribution}) failed to load its items: "
                    f"{describe_exception(failure.original) if failure.original else failure.cause}"
                ) from None

        source = step(lambda: iter(self.task.load_wanted(self.config.limit, self.config.seed, check)))
        while (item := step(lambda: next(source, end))) is not end:
            item = self.admit(item)
            if item.id in yielded:
                raise RunConfigError(f"task {self.config.task!r} produced duplicate item ids: [{item.id!r}]")
            if item.id not in seen and not check(item.id):  # a loader that did not ask is asked here
                continue
            if wanted(item.id):
                yielded.add(item.id)
                yield item
        if not seen:
            raise TaskDataError(
                f"task {self.config.task!r} produced no items (options {self.config.task_options}, "
                f"limit {self.config.limit}): nothing to run"
            )
