"""mem0 as a BudgetBench memory system (``mem0``)."""

from .plugin import Mem0

__all__ = ["Mem0"]
