"""SWE-bench Verified as a BudgetBench task, with a patch-similarity proxy grader and an official-format export."""
