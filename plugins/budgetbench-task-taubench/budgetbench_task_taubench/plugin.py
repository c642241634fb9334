"""Registers the ``tau-bench`` task."""

from budgetbench_core import hookimpl

from .task import TauBench


@hookimpl
def register_tasks(register):
    register(TauBench)
