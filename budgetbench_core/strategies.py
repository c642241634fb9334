"""The MemoryStrategy contract: choose what of a history to present within a budget."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .messages import Item, Message
from .tokenizers import PromptCounter


class Regime(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() of a member, which callers print
    """Where a strategy's work happens, declared so readers compare like with like."""

    LOCAL_ONLY = "local-only"
    AUXILIARY_MODEL = "auxiliary-model-assisted"
    HOSTED = "hosted"
    PERSISTENT_STATEFUL = "persistent-stateful"
    RESET_PER_ITEM = "reset-per-item"


AuxiliaryCall = Callable[[Sequence[Message], int, str], str]


@dataclass
class StrategyContext:
    """What the harness gives a strategy for one item at one budget.

    ``complete(messages, max_tokens, purpose)`` runs an auxiliary model call through the
    harness: its prompt is budget-checked against the same budget, and its tokens and
    latency are logged. ``audit`` is free-form detail (retrieval scores, chosen units)
    copied into the ``prompt_audit`` event so a reader sees why each part was kept.
    ``scratch_dir`` is the strategy's own folder for files it keeps during a run (an index, a
    database): outside the run directory, which only the harness writes and no plugin reads.
    """

    item: Item
    budget: int
    counter: PromptCounter
    complete: AuxiliaryCall
    seed: int
    scratch_dir: Path
    audit: dict[str, Any] = field(default_factory=dict)

    def frame(self, kept: list[Message]) -> list[Message]:
        return self.item.frame(kept)


class MemoryStrategy(ABC):
    """Base class for strategies. Subclasses set ``name`` and ``regime``.

    ``apply`` returns the whole prompt to send: the item's system prompt (if any) first,
    the query unchanged last, and in between whatever history the strategy keeps. The
    runner counts that prompt exactly and never sends it over budget. Per-item state
    (an embedding index, say) may be kept until ``reset`` so that every budget tier of
    one item reuses it.
    """

    name: ClassVar[str]
    regime: ClassVar[Regime]
    description: ClassVar[str] = ""
    # False only for a ceiling arm that sends everything (full_context): the runner still
    # enforces the budget; conformance checks then skip the budget-compliance check.
    enforces_budget: ClassVar[bool] = True

    def __init__(self, **params: Any) -> None:
        self.params = params

    def reset(self) -> None:  # noqa: B027 - optional: a stateless strategy has nothing to forget
        """Forget everything about the previous item."""

    @abstractmethod
    def apply(self, history: Sequence[Message], budget: int, context: StrategyContext) -> list[Message]:
        """The prompt to send for ``context.item`` at ``budget`` input tokens."""

    def describe(self) -> dict[str, Any]:
        """Recorded in the manifest."""
        return {"name": self.name, "regime": self.regime.value, "params": self.params}

    def read_paths(self) -> list[str]:
        """Folders or files outside the Python environment this strategy reads while it runs (a
        model folder given as a parameter). Its confined worker may read them, and nothing else
        outside its scratch folder; the harness refuses a path that holds the run directory or
        the task's data, and records the rest in the manifest."""
        return []

    def network_hosts(self) -> list[str]:
        """Outside services this strategy needs (``host`` or ``host:port``, e.g. a vendor's hosted
        API). Its worker reaches them only through the harness's proxy, which lets these through
        while ``apply`` runs, meters them per cell (calls and bytes by host) and refuses and
        records any other host as undeclared network use."""
        return []


_MRO = type.__dict__["__mro__"].__get__
_CLASS_DICT = type.__dict__["__dict__"].__get__


def resets_nothing(strategy: Any) -> bool:
    """True when ``strategy.reset`` can only be ``MemoryStrategy.reset``, which does nothing:
    no class before it defines ``reset``, no class defines attribute lookup of its own, and the
    instance holds no ``reset``. Read from the type's own slots, never through the plugin."""
    mro = _MRO(type(strategy))
    base = next((index for index, klass in enumerate(mro) if klass is MemoryStrategy), None)
    if base is None or any("reset" in _CLASS_DICT(klass) for klass in mro[:base]):
        return False
    if any("__getattribute__" in _CLASS_DICT(k) or "__getattr__" in _CLASS_DICT(k) for k in mro if k is not object):
        return False
    try:
        own = object.__getattribute__(strategy, "__dict__")
    except AttributeError:
        return True
    return type(own) is dict and "reset" not in own
