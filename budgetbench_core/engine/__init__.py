"""The engine: what runs a cell, and what it is given to run one. Private to the core.

A run is set up once (``run_plugins``: the task, grader, backends and tokenizer its config
names; ``services``: everything a cell needs, built the same way by the driver and by a
remote worker), then its items are taken in (``intake``) and its units run (``units``:
``pipeline`` for a single-call cell, ``episode_loop`` for an agent episode). Nothing here
imports the runner or the CLI; ``scheduling`` hands units to an executor.
"""
