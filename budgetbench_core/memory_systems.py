"""The MemorySystem contract (mem0-like layers) and the harness-side budget fill.

A memory system only ingests and retrieves. The harness, not the vendor, decides what
fits: whole retrieved items in rank order, an item that does not fit is skipped and
filling continues, never cut mid-item. Retrieval happens once per item and the engine saves
it to ``retrievals/<system>/<item>.json``; every budget tier reuses it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from .messages import Item, Message, Session
from .sandbox import PhaseError
from .strategies import MemoryStrategy, Regime, StrategyContext
from .tokenizers import PromptCounter


@dataclass
class IngestFailure:
    session_id: str
    cause: str
    attempts: int = 1


@dataclass
class IngestReport:
    """What a memory system stored and what it lost, with causes. Never swallow a failure."""

    sessions: int
    stored: int
    failures: list[IngestFailure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def loss(self) -> float:
        """Fraction of sessions that failed to ingest."""
        return len(self.failures) / self.sessions if self.sessions else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loss": self.loss}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IngestReport:
        failures = [IngestFailure(**f) for f in data.get("failures", [])]
        return cls(data["sessions"], data["stored"], failures, data.get("seconds", 0.0))


@dataclass
class RetrievedItem:
    """One ranked memory: its text, score and where it came from."""

    text: str
    score: float
    source_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class IngestLossError(RuntimeError):
    """Raised when a memory system lost more of an item's history than allowed."""


class MemorySystem(ABC):
    """Base class for memory layers. Subclasses set ``name`` and ``regime``."""

    name: ClassVar[str]
    regime: ClassVar[Regime] = Regime.PERSISTENT_STATEFUL
    description: ClassVar[str] = ""

    def __init__(self, **params: Any) -> None:
        self.params = params

    def reset(self) -> None:  # noqa: B027 - optional: a system that keeps nothing between items has nothing to do
        """Forget the previous item's memories."""

    @abstractmethod
    def ingest(self, sessions: Sequence[Session], context: StrategyContext) -> IngestReport:
        """Store the sessions; report every failure with its cause."""

    @abstractmethod
    def retrieve(self, query: str, context: StrategyContext) -> list[RetrievedItem]:
        """Memories ranked best first."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "regime": self.regime.value, "params": self.params, "kind": "memory-system"}

    def read_paths(self) -> list[str]:
        """Folders outside the Python environment this system reads (a model folder): as
        ``MemoryStrategy.read_paths``."""
        return []

    def network_hosts(self) -> list[str]:
        """Outside services this system calls (its hosted memory API): as
        ``MemoryStrategy.network_hosts``."""
        return []


@dataclass
class BudgetFill:
    """The outcome of filling a budget: the prompt and what was kept or dropped."""

    messages: list[Message]
    used_tokens: int
    included: list[int]
    dropped: list[int]


MEMORY_HEADER = "Relevant memories, most relevant first:"


def render_memory(rank: int, item: RetrievedItem) -> str:
    return f"[{rank + 1}] {item.text}"


def fill_budget(item: Item, ranked: Sequence[RetrievedItem], budget: int, counter: PromptCounter) -> BudgetFill:
    """Whole memories in rank order until the budget is full, confirmed by an exact count."""

    def frame(chosen: list[int]) -> list[Message]:
        if not chosen:
            return item.frame([])
        body = "\n\n".join([MEMORY_HEADER, *(render_memory(i, ranked[i]) for i in chosen)])
        return item.frame([Message("user", body, {"source_id": "memories"})])

    used = counter.estimate(frame([]))
    header = counter.message_tokens(Message("user", MEMORY_HEADER))
    chosen: list[int] = []
    dropped: list[int] = []
    for index, memory in enumerate(ranked):
        cost = counter.content_tokens("\n\n" + render_memory(index, memory)) + (header if not chosen else 0)
        if used + cost <= budget:
            chosen.append(index)
            used += cost
        else:
            dropped.append(index)
    chosen, exact = counter.fit(frame, chosen, budget, drop_index=-1)
    dropped = sorted(set(range(len(ranked))) - set(chosen))
    return BudgetFill(frame(chosen), exact, chosen, dropped)


def _phase(phase: str, call, owner=None):
    """Run a memory-system call; anything it raises is tagged with its phase for the error row
    (``owner.current_phase`` says which phase a call that never returns was in)."""
    if owner is not None:
        owner.current_phase = phase
        if owner.on_phase is not None:
            owner.on_phase(phase)
    try:
        return call()
    except BaseException as exc:  # noqa: BLE001 - the sandbox records it
        raise PhaseError(phase, exc) from None


def _plain_retrieved(item: RetrievedItem) -> RetrievedItem:
    """A retrieved memory of plain types (text str, score float, JSON-safe metadata), or PhaseError."""
    from .sandbox import json_safe_or_empty

    fields = object.__getattribute__(item, "__dict__")
    text, score, source = fields.get("text"), fields.get("score"), fields.get("source_id")
    if not isinstance(text, str) or isinstance(score, bool) or not isinstance(score, (int, float)):
        raise PhaseError("retrieve", TypeError("a RetrievedItem needs str text and a numeric score"))
    metadata = json_safe_or_empty(fields.get("metadata"))
    return RetrievedItem(
        str.__str__(text),
        float(score),
        str.__str__(source) if isinstance(source, str) else None,
        metadata if isinstance(metadata, dict) else {},
    )


def ingest_view(item: Item) -> Item:
    """The item as ingest sees it: its history only. Ingest is amortised over the questions and
    not budgeted, so a system that saw the question there could answer it with the whole history
    and call that a write; the question reaches the system at ``retrieve``, whose cost is the
    question's own."""
    return replace(item, query=Message("user", ""), system=None)


class MemorySystemStrategy(MemoryStrategy):
    """Runs a MemorySystem as a strategy: ingest and retrieve once per item, fill per budget."""

    def __init__(self, system: MemorySystem, max_ingest_loss: float = 0.0) -> None:
        super().__init__(**system.params)
        self.system = system
        self.max_ingest_loss = max_ingest_loss
        self._item_id: str | None = None
        self._ranked: list[RetrievedItem] = []
        self._report: IngestReport | None = None
        self.current_phase: str | None = None  # ingest or retrieve while one runs
        self.on_phase: Callable[[str | None], None] | None = None  # told when current_phase changes
        self.saved_retrieval: dict[str, Any] | None = None  # set by the engine: this item's saved retrieval
        self.new_retrieval: dict[str, Any] | None = None  # read by the engine after apply: to save

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.system.name

    @property
    def regime(self) -> Regime:  # type: ignore[override]
        return self.system.regime

    def describe(self) -> dict[str, Any]:
        return {**self.system.describe(), "max_ingest_loss": self.max_ingest_loss}

    def reset(self) -> None:
        self.system.reset()
        self._item_id = None

    def _prepare(self, context: StrategyContext) -> None:
        """Ingest and retrieve for a new item, or take what the engine saved from a previous
        invocation of this run (``saved_retrieval``). Never touches the run directory: the
        engine saves ``new_retrieval`` there (only the harness writes a run's files)."""
        saved = self.saved_retrieval
        self.new_retrieval = None
        if isinstance(saved, dict) and saved.get("item_id") == context.item.id:
            self._report = IngestReport.from_dict(saved["ingest"])
            self._ranked = [RetrievedItem(**r) for r in saved["ranked"]]
        else:
            blind = replace(context, item=ingest_view(context.item))
            self._report = _phase("ingest", lambda: self.system.ingest(blind.item.sessions(), blind), self)
            if not isinstance(self._report, IngestReport):
                raise PhaseError(
                    "ingest",
                    TypeError(
                        f"memory system {self.name!r} ingest returned {type(self._report).__name__}, not IngestReport"
                    ),
                )
            if self._report.loss > self.max_ingest_loss:
                ranked = []
            else:
                ranked = _phase("retrieve", lambda: self.system.retrieve(context.item.query.content, context), self)
            if not isinstance(ranked, list) or not all(isinstance(r, RetrievedItem) for r in ranked):
                raise PhaseError(
                    "retrieve", TypeError(f"memory system {self.name!r} retrieve must return list[RetrievedItem]")
                )
            self._ranked = [_plain_retrieved(r) for r in ranked]
            self.new_retrieval = {
                "item_id": context.item.id,
                "system": self.name,
                "query": context.item.query.content,
                "ingest": self._report.to_dict(),
                "ranked": [asdict(r) for r in self._ranked],
            }
        self._item_id = context.item.id
        self.current_phase = None

    def apply(self, history: Sequence[Message], budget: int, context: StrategyContext) -> list[Message]:
        if self._item_id != context.item.id:
            self._prepare(context)
        assert self._report is not None
        context.audit["ingest"] = self._report.to_dict()
        if self._report.loss > self.max_ingest_loss:
            raise IngestLossError(
                f"memory system {self.name!r} lost {len(self._report.failures)} of {self._report.sessions} sessions "
                f"of item {context.item.id!r} (allowed loss {self.max_ingest_loss}): "
                + "; ".join(f"{f.session_id}: {f.cause}" for f in self._report.failures[:3])
            )
        fill = fill_budget(context.item, self._ranked, budget, context.counter)
        context.audit["fill"] = {
            "included": fill.included,
            "dropped": fill.dropped,
            "scores": [self._ranked[i].score for i in fill.included],
            "sources": [self._ranked[i].source_id for i in fill.included],
        }
        return fill.messages
