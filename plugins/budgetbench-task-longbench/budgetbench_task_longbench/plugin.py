"""Registers the ``longbench-v2`` task and the ``longbench-choice`` grader."""

from budgetbench_core import hookimpl

from .grader import LongBenchChoice
from .task import LongBenchV2


@hookimpl
def register_tasks(register):
    register(LongBenchV2)


@hookimpl
def register_graders(register):
    register(LongBenchChoice)
