"""Shared helpers for the rag tests: real LongMemEval items and prompt checks.

Items come from the ``longmemeval`` task plugin (through the registry) on the official files
in ../shared/data; prompts are counted by the embedded llama.cpp server's own tokenizer
(the ``budgetbench_counter`` fixture of ``budgetbench_core.testing``).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core.testing import registered, shared_data, strategy_context  # noqa: E402

FILES = {"oracle": "longmemeval_oracle.json", "s": "longmemeval_s_sample.json"}


def longmemeval_items(split: str, limit: int | None) -> list:
    """Items of the official file for ``split`` (a round-robin selection across types with ``limit``)."""
    path = shared_data(f"longmemeval/{FILES[split]}")
    task = registered("task", "longmemeval").obj(split=split, path=str(path))
    return list(task.load(limit, 0))


def context(item, budget: int, counter, run_dir: Path):
    """Retrieval strategies make no auxiliary calls: the context refuses them."""
    return strategy_context(item, budget, counter, run_dir)


def strategy(name: str, **params):
    return registered("strategy", name).obj(**params)


def gold_turn_in_prompt(item, prompt) -> bool | None:
    """Whether a has_answer turn (or a chunk of one) is in the prompt; None when the item has none."""
    gold = {(m.metadata["session_id"], m.metadata["turn"]) for m in item.history if m.metadata.get("has_answer")}
    if not gold:
        return None
    return bool(gold & {(m.metadata.get("session_id"), m.metadata.get("turn")) for m in prompt})


_shared_store: Path | None = None


def shared_store() -> str:
    """One persistent qdrant folder for this test process.

    Indexes are named by a fingerprint of model, chunking and history, so every test file
    and both strategies reuse the index of a LongMemEval_S history instead of embedding
    its ~115K tokens again.
    """
    global _shared_store
    if _shared_store is None:
        import atexit
        import shutil
        import tempfile

        _shared_store = Path(tempfile.mkdtemp(prefix="budgetbench-rag-test-"))
        atexit.register(shutil.rmtree, _shared_store, True)
    return f"path={_shared_store}"
