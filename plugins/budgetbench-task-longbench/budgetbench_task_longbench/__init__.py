"""LongBench v2 as a BudgetBench task: the ``longbench-v2`` task and the ``longbench-choice`` grader."""
