"""Shared fixtures for the core tests: the real embedded model and its exact tokenizer.

They are the public ones from ``budgetbench_core.testing`` (a pytest plugin), under the
names the core tests use.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def local_backend(budgetbench_backend):
    return budgetbench_backend


@pytest.fixture(scope="session")
def server_counter(budgetbench_counter):
    """PromptCounter over SmolLM2's own template and vocabulary (exact)."""
    return budgetbench_counter
