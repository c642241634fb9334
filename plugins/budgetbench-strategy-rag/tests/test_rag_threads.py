"""rag on several threads with one shared model (``--isolation none`` runs strategies so).

The model is loaded once per process and shared by every thread. A Hugging Face fast
tokenizer is mutable: each call first writes its padding and truncation settings onto the
Rust tokenizer, then encodes with whatever settings the tokenizer holds when the encoding
starts. ``-j 2`` with ``rag.chunk_tokens=64`` failed once with "ValueError: Unable to create
tensor": one thread chunked (no padding) between another thread's "pad this batch" and its
encoding. The race needs a thread switch inside a window of a few bytecodes, so these tests
do not wait for luck: a profile hook (``sys.setprofile``, this thread only) stops one
thread exactly at the tokenizer's ``encode_batch`` and lets the other thread do its work
there, then lets the first one go on. Everything else is the real model and tokenizer.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rag_support  # noqa: E402, F401  (offline Hugging Face hub)
from budgetbench_strategy_rag.embedding import Embedder, get_embedder  # noqa: E402
from budgetbench_strategy_rag.units import make_units  # noqa: E402

from budgetbench_core import Message  # noqa: E402

# Longer than the model's 256-token window, so truncation would cut it.
LONG = " ".join(f"note-{w} about the garden" for w in range(200))
HISTORY = (Message("user", LONG), Message("assistant", "Noted."), Message("user", LONG[: len(LONG) // 3]))
BATCH = ["a", "b c d e f g h i j k"]  # uneven: the batch needs padding


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return get_embedder("all-MiniLM-L6-v2")


def chunk(embedder: Embedder) -> list:
    """Chunking as ``Rag._prepare`` does it."""
    return make_units(HISTORY, 64, embedder.chunk_tokenizer())


@contextmanager
def paused_at_encode_batch(backend: Any, meanwhile: Callable[[], Any]) -> Iterator[dict[str, Any]]:
    """While the body runs on this thread, the first time it is about to call ``encode_batch``
    of ``backend`` (a Rust tokenizer), ``meanwhile`` runs to the end on another thread."""
    reached, finished = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def other() -> None:
        if reached.wait(60):
            try:
                outcome["result"] = meanwhile()
            except Exception as exc:  # reported by the test
                outcome["error"] = f"{type(exc).__name__}: {exc}"
        finished.set()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__self__", None) is backend and not reached.is_set():
            if getattr(arg, "__name__", "") == "encode_batch":
                reached.set()
                outcome["in_time"] = finished.wait(60)

    thread = threading.Thread(target=other)
    thread.start()
    sys.setprofile(hook)
    try:
        yield outcome
    finally:
        sys.setprofile(None)
        reached.set()
        thread.join()
    # the other thread ran to the end while this one waited at encode_batch (not after a timeout)
    outcome["interleaved"] = outcome.get("in_time", False) and ("result" in outcome or "error" in outcome)


def test_rag_chunking_on_another_thread_does_not_unpad_a_batch_being_encoded(embedder):
    """The failure of the issue: thread B chunks between thread A's padding setup and A's encoding."""
    alone = chunk(embedder)
    with paused_at_encode_batch(embedder.model.tokenizer._tokenizer, lambda: chunk(embedder)) as outcome:
        vectors, _ = embedder.encode(BATCH, 2)
    assert outcome["interleaved"], "the chunker ran while the encoder was at encode_batch"
    assert "error" not in outcome and outcome["result"] == alone
    assert vectors.shape == (2, 384)


def test_rag_encoding_on_another_thread_does_not_truncate_chunking(embedder):
    """The silent twin: thread A encodes (truncation at 256 tokens) while B is about to cut a
    message longer than that; B's chunks must still cover the whole message in 64-token pieces."""
    alone = chunk(embedder)
    assert max(u.chunks for u in alone) > 4, "the long message has more than 256 tokens"
    with paused_at_encode_batch(embedder.chunk_tokenizer()._tokenizer, lambda: embedder.encode(BATCH, 2)) as outcome:
        during = chunk(embedder)
    assert outcome["interleaved"] and "error" not in outcome
    assert during == alone
    assert "".join(u.text for u in during if u.message_index == 0) == LONG


def test_rag_each_thread_chunks_with_its_own_tokenizer(embedder):
    """One copy per thread, kept for the thread's life, and never the model's own tokenizer."""
    mine = embedder.chunk_tokenizer()
    assert embedder.chunk_tokenizer() is mine and mine is not embedder.model.tokenizer
    theirs: list[Any] = []
    thread = threading.Thread(target=lambda: theirs.append(embedder.chunk_tokenizer()))
    thread.start()
    thread.join()
    assert theirs[0] is not mine and theirs[0]._tokenizer is not mine._tokenizer
