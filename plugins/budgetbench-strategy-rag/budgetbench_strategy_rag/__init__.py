"""BudgetBench retrieval strategies: ``rag`` (dense) and ``lean_retrieval`` (dense + BM25 + recency)."""

from __future__ import annotations

from importlib import metadata

from budgetbench_core import hookimpl

from .strategies import LeanRetrieval, Rag

__version__ = metadata.version("budgetbench-strategy-rag")
__all__ = ["LeanRetrieval", "Rag", "register_strategies"]


@hookimpl
def register_strategies(register):
    register(Rag)
    register(LeanRetrieval)
