"""Shared helpers for the rag tests: real LongMemEval items, an exact counter, prompt checks.

Items come from the ``longmemeval`` task plugin (through the registry) on the official files
in ../shared/data; prompts are counted by the embedded llama.cpp server's own tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core import PromptCounter, StrategyContext  # noqa: E402
from budgetbench_core.plugins import get_registry  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LONGMEMEVAL = ROOT.parent / "shared" / "data" / "longmemeval"
FILES = {"oracle": "longmemeval_oracle.json", "s": "longmemeval_s_sample.json"}


def longmemeval_items(split: str, limit: int | None) -> list:
    """Items of the official file for ``split`` (a round-robin selection across types with ``limit``)."""
    path = LONGMEMEVAL / FILES[split]
    if not path.exists():
        pytest.skip(f"LongMemEval data not found at {path} (see ../shared/data/README.md)")
    registry = get_registry()
    if "longmemeval" not in registry.names("task"):
        pytest.skip("the longmemeval task plugin (budgetbench-task-longmemeval) is not installed")
    task = registry.get("task", "longmemeval").obj(split=split, path=str(path))
    return list(task.load(limit, 0))


def start_counter():
    """(backend, counter): the embedded server and an exact PromptCounter on its tokenizer.

    Keep the backend referenced for as long as the counter is used: the server stops when
    the backend is released.
    """
    from budgetbench_core.builtin.local_backend import LocalBackend
    from budgetbench_core.builtin.tokenizers import ServerTokenizer

    backend = LocalBackend()
    backend.start()
    return backend, PromptCounter(ServerTokenizer(backend.server_url))


def context(item, budget: int, counter, run_dir: Path) -> StrategyContext:
    def no_auxiliary_calls(messages, max_tokens, purpose):
        raise AssertionError(f"retrieval strategies make no auxiliary calls (asked for {purpose!r})")

    return StrategyContext(item=item, budget=budget, counter=counter, complete=no_auxiliary_calls, seed=0,
                           run_dir=run_dir)


def strategy(name: str, **params):
    return get_registry().get("strategy", name).obj(**params)


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
