"""The distribution's one entry point: the ``locomo`` task and its dataset, the two graders."""

from budgetbench_core import hookimpl

from .graders import register_graders
from .task import LoCoMo

__all__ = ["register_graders", "register_tasks"]


@hookimpl
def register_tasks(register):
    register(LoCoMo)
