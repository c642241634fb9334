"""The qdrant vector store behind the retrieval strategies.

``vector_store`` is ``:memory:`` (default, embedded, one store per strategy instance),
``path=DIR`` (embedded, persistent; qdrant allows one client per folder, so all instances
in the process share it) or ``url=http://host:6333`` (a qdrant server). Each item's index
is a collection named by a fingerprint of the embedding model, the chunking and the
history, so a persistent store lets a resumed run, a repeat, or another strategy with the
same model and chunking reuse the index without embedding again.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # qdrant-client takes ~0.4 s to import: only a store that is created needs it
    from qdrant_client import QdrantClient

MEMORY = ":memory:"

_shared: dict[str, tuple[QdrantClient, threading.Lock]] = {}
_shared_lock = threading.Lock()


def parse_store(spec: str) -> tuple[str, str]:
    """``(kind, where)`` for a ``vector_store`` parameter; a clear error for anything else."""
    spec = str(spec).strip()
    if spec in (MEMORY, "memory"):
        return "memory", MEMORY
    kind, sep, where = spec.partition("=")
    if sep and kind in ("path", "url") and where:
        return kind, where
    raise ValueError(f"vector_store must be ':memory:', 'path=DIR' or 'url=http://host:6333', got {spec!r}")


class VectorStore:
    """Collections of unit vectors, one per item, in one qdrant client."""

    def __init__(self, spec: str) -> None:
        from qdrant_client import QdrantClient

        self.kind, self.where = parse_store(spec)
        self.persistent = self.kind != "memory"
        if self.kind == "memory":
            self.client, self.lock = QdrantClient(MEMORY), nullcontext()
        elif self.kind == "path":
            folder = str(Path(self.where).expanduser().resolve())
            with _shared_lock:
                if folder not in _shared:
                    Path(folder).mkdir(parents=True, exist_ok=True)
                    _shared[folder] = (QdrantClient(path=folder), threading.Lock())
                self.client, self.lock = _shared[folder]
        else:
            self.client, self.lock = QdrantClient(url=self.where), nullcontext()
            try:
                self.client.get_collections()
            except Exception as exc:
                raise ValueError(
                    f"qdrant server at {self.where} is not reachable: {type(exc).__name__}: {exc}"
                ) from exc

    def has(self, name: str, points: int) -> bool:
        """Whether ``name`` already holds exactly ``points`` vectors (a complete earlier index)."""
        with self.lock:
            if not self.client.collection_exists(name):
                return False
            return self.client.count(name, exact=True).count == points

    def put(self, name: str, vectors: np.ndarray) -> None:
        """(Re)create ``name`` with one point per row of ``vectors``; point id = unit index."""
        from qdrant_client import models

        with self.lock:
            if self.client.collection_exists(name):
                self.client.delete_collection(name)
            self.client.create_collection(
                name, vectors_config=models.VectorParams(size=int(vectors.shape[1]), distance=models.Distance.COSINE)
            )
            self.client.upload_collection(name, vectors=vectors, ids=list(range(len(vectors))), wait=True)

    def search(self, name: str, query: np.ndarray, limit: int) -> list[tuple[int, float]]:
        """``(unit index, cosine similarity)`` best first, for the ``limit`` nearest units."""
        with self.lock:
            hits = self.client.query_points(name, query=query.tolist(), limit=limit, with_payload=False).points
        return [(int(hit.id), float(hit.score)) for hit in hits]

    def drop(self, name: str) -> None:
        with self.lock:
            if self.client.collection_exists(name):
                self.client.delete_collection(name)
