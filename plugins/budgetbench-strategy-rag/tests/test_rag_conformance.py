"""rag and lean_retrieval pass the conformance kit that every plugin author runs."""

from __future__ import annotations

import pytest
from budgetbench_strategy_rag.strategies import LeanRetrieval, Rag


@pytest.mark.parametrize("strategy", [Rag, LeanRetrieval], ids=lambda s: s.name)
def test_rag_strategies_pass_the_conformance_kit(budgetbench_kit, strategy):
    budgetbench_kit.assert_conforms(strategy)
