"""The reliability tests' fault-injecting loopback server is the public one in
``budgetbench_core.testing`` (plugins' tests use the same); this name is kept for their imports."""

from budgetbench_core.loopback import Request  # noqa: F401
from budgetbench_core.testing import (  # noqa: F401
    EXTRA_FAULTS,
    FAULTS,
    NO_COMPLETION,
    USAGE_OFFSET,
    FaultServer,
    default_reply,
    messages_hash,
)
