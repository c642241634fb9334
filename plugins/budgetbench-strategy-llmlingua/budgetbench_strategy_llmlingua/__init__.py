"""LLMLingua-2 compression as a BudgetBench strategy (``llmlingua2``)."""

from .plugin import LLMLingua2

__all__ = ["LLMLingua2"]
