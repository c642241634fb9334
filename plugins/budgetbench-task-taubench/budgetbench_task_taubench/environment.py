"""A domain environment: a fresh database, its tools, and upstream's call and hash semantics.

``Environment.call`` is what the agent's tool call does: the tool's return value as text,
or ``Error: <message>`` when it raised (any exception, as upstream; state already changed
before the failure stays changed). ``db_hash`` is upstream's ``get_db_hash``: SHA-256 of
``json.dumps(db.model_dump(), sort_keys=True, default=str)``, so it can be compared with
hashes computed by tau2-bench itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .toolkit import Toolkit, tool_output


@dataclass(frozen=True)
class ToolResult:
    content: str
    error: bool


def dict_hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def merge(base: dict, update: dict) -> dict:
    """``base`` updated recursively by ``update`` (dicts merge, anything else replaces), as
    upstream's addict-based ``update_db``."""
    for key, value in update.items():
        if key in base and isinstance(base[key], dict) and isinstance(value, dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


class Environment:
    """One episode's world. ``tools`` act for the agent, ``user_tools`` (mock, telecom) for the user."""

    def __init__(
        self,
        build: Callable[[], tuple[Toolkit, Toolkit | None]],
        pristine: Callable[[], tuple[str, str | None]] | None = None,
        sync: Callable[[Toolkit, Toolkit], None] | None = None,
    ) -> None:
        """``build`` makes the toolkits (validating the database takes ~0.1 s for airline, so it
        runs at the first call); ``pristine`` gives the untouched databases' hashes, so an
        environment nobody wrote to is hashed without building it; ``sync`` is upstream's
        ``sync_tools`` (telecom: the phone learns the line's state), run after every successful
        tool call and task function, as upstream."""
        self._build = build
        self._kits: tuple[Toolkit, Toolkit | None] | None = None
        self._snapshot = pristine
        self._dirty = pristine is None
        self._sync = sync

    def _ready(self) -> tuple[Toolkit, Toolkit | None]:
        if self._kits is None:
            self._kits = self._build()
            self.sync()
        return self._kits

    def sync(self) -> None:
        """Upstream's ``sync_tools`` (nothing outside telecom)."""
        if self._sync is not None:
            tools, user_tools = self._ready()
            self._sync(tools, user_tools)

    @property
    def tools(self) -> Toolkit:
        return self._ready()[0]

    @property
    def user_tools(self) -> Toolkit | None:
        return self._ready()[1]

    def _touch(self) -> None:
        self._dirty = True

    def _toolkit(self, requestor: str) -> Toolkit:
        if requestor == "assistant":
            return self.tools
        if requestor == "user":
            if self.user_tools is None:
                raise ValueError("User tools not available")
            return self.user_tools
        raise ValueError(f"Invalid requestor: {requestor}")

    def call(self, name: str, arguments: dict[str, Any], requestor: str = "assistant") -> ToolResult:
        """Run one tool call; never raises (the agent sees the error text instead)."""
        try:
            kit = self._toolkit(requestor)
            if kit.is_write(name):
                self._touch()  # even a failing write may have changed something
            value = kit.use_tool(name, **arguments)
            self.sync()
        except Exception as exc:  # every failure is shown to the agent, as upstream
            value, error = f"Error: {exc}", True
        else:
            error = False
        return ToolResult(tool_output(value), error)

    def has_tool(self, name: str) -> bool:
        return any(kit is not None and kit.has_tool(name) for kit in (self.tools, self.user_tools))

    def is_write(self, name: str) -> bool:
        for kit in (self.tools, self.user_tools):
            if kit is not None and kit.has_tool(name):
                return kit.is_write(name)
        return True

    def run_function(self, env_type: str, func_name: str, arguments: dict[str, Any]) -> Any:
        """A task's initialisation action or assertion: any method of either toolkit, raising on failure."""
        kit = self.tools if env_type == "assistant" else self.user_tools if env_type == "user" else None
        if env_type not in ("assistant", "user"):
            raise ValueError(f"Invalid environment type: {env_type}")
        self._touch()
        value = getattr(kit, func_name)(**arguments)
        self.sync()
        return value

    def update_db(self, which: str, update: dict) -> None:
        self._touch()
        kit = self.tools if which == "agent" else self.user_tools
        kit.db = type(kit.db).model_validate(merge(kit.db.model_dump(), update))

    def db_hash(self) -> str:
        return dict_hash(self.tools.db.model_dump())

    def user_db_hash(self) -> str | None:
        return None if self.user_tools is None else dict_hash(self.user_tools.db.model_dump())

    def snapshot(self) -> tuple[str, str | None]:
        """Both database hashes (the user's is None outside mock)."""
        if not self._dirty:
            return self._snapshot()
        return self.db_hash(), self.user_db_hash()
