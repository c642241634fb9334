"""LongMemEval for BudgetBench: the official files, the official judge, hypothesis export.

Modules: ``loader`` reads and checks the official JSON, ``formatting`` renders a record
as one Item for every strategy, ``task`` registers the task, ``judge_prompts`` holds the
official judge prompts, ``graders`` the judge and a diagnostic match grader,
``metrics`` the official accuracy summaries, ``export`` the ``budgetbench longmemeval``
commands.
"""
