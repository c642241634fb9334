"""Shared fixtures for the core tests: the real embedded model and its exact tokenizer."""

from __future__ import annotations

import pytest

from budgetbench_core import PromptCounter
from budgetbench_core.builtin.local_backend import LocalBackend
from budgetbench_core.builtin.tokenizers import ServerTokenizer


@pytest.fixture(scope="session")
def local_backend():
    backend = LocalBackend(max_concurrency=1)
    backend.start()
    yield backend
    backend.stop()


@pytest.fixture(scope="session")
def server_counter(local_backend):
    """PromptCounter over SmolLM2's own template and vocabulary (exact)."""
    return PromptCounter(ServerTokenizer(local_backend.server_url))
