"""The hooks plugins implement. Each takes a ``register`` callback (or the click group)."""

import pluggy

hookspec = pluggy.HookspecMarker("budgetbench")
hookimpl = pluggy.HookimplMarker("budgetbench")


@hookspec
def register_strategies(register):
    """Register MemoryStrategy or MemorySystem subclasses: ``register(StrategyClass)``."""


@hookspec
def register_tasks(register):
    """Register Task subclasses: ``register(TaskClass)``."""


@hookspec
def register_graders(register):
    """Register Grader subclasses: ``register(GraderClass)``."""


@hookspec
def register_backends(register):
    """Register Backend subclasses: ``register(BackendClass)``."""


@hookspec
def register_tokenizers(register):
    """Register tokenizer spec prefixes: ``register("prefix", factory)``.

    ``factory(argument, backend)`` returns a Tokenizer for the spec ``prefix:argument``;
    ``backend`` is the started Backend (the ``server`` spec asks its server).
    """


@hookspec
def register_commands(cli):
    """Add click commands to the ``budgetbench`` group: ``@cli.command()``."""
