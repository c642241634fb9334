"""LoCoMo as a BudgetBench task: the ``locomo`` task, the ``locomo-f1`` and ``locomo-judge`` graders."""
