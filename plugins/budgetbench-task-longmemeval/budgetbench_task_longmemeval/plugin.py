"""The distribution's one entry point: the task and its dataset, the graders, the ``longmemeval`` commands."""

from .export import register_commands
from .graders import register_graders
from .task import register_datasets, register_tasks

__all__ = ["register_commands", "register_datasets", "register_graders", "register_tasks"]
