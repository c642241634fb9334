"""The rag tests count with the embedded model's exact tokenizer (``budgetbench_core.testing``)."""

import pytest


@pytest.fixture(scope="module")
def counter(budgetbench_counter):
    return budgetbench_counter
