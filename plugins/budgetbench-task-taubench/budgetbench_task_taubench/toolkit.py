"""Tool registration and the tool-call semantics every domain shares.

A toolkit is a class whose tool methods are marked with :func:`tool`. The class and method
names and the parameter names are upstream's, because a call with a wrong or missing
argument is answered with Python's own ``TypeError`` text (``RetailTools.get_order_details()
got an unexpected keyword argument 'id'``), which names them. Arguments reach the method
unvalidated, as upstream: a wrong type fails (or not) wherever the method first uses it.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel

READ, WRITE, GENERIC = "read", "write", "generic"


def tool(kind: str, description: str, parameters: dict[str, str] | None = None) -> Callable:
    """Mark a method as a tool. ``kind`` is read, write or generic (only write tools change the
    database, so only they are replayed); ``description`` and ``parameters`` (name -> what to pass)
    are what the agent is told."""

    def mark(function: Callable) -> Callable:
        function.tool_kind = kind
        function.tool_description = description
        function.tool_parameters = dict(parameters or {})
        return function

    return mark


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: str
    description: str
    parameters: dict[str, str]
    required: tuple[str, ...]


class Toolkit:
    """Tools over one database (``self.db``, a pydantic model)."""

    def __init__(self, db: BaseModel) -> None:
        self.db = db

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Tools a class body takes from elsewhere (:mod:`.generic`) become the class's own copies,
        named by it, because Python's ``TypeError`` text for a wrong call names the method's owner."""
        super().__init_subclass__(**kwargs)
        for name, function in list(vars(cls).items()):
            qualname = f"{cls.__qualname__}.{name}"
            if isinstance(function, types.FunctionType) and hasattr(function, "tool_kind"):
                if function.__qualname__ != qualname:
                    setattr(cls, name, _owned_copy(function, qualname))

    @classmethod
    def specs(cls) -> dict[str, ToolSpec]:
        """The tools of this class in name order, as the agent is told about them."""
        import inspect

        out = {}
        for name in sorted(dir(cls)):
            function = getattr(cls, name)
            if not callable(function) or not hasattr(function, "tool_kind"):
                continue
            signature = inspect.signature(function)
            required = tuple(
                p
                for p, value in signature.parameters.items()
                if p != "self" and value.default is inspect.Parameter.empty
            )
            out[name] = ToolSpec(
                name, function.tool_kind, function.tool_description, function.tool_parameters, required
            )
        return out

    def has_tool(self, name: str) -> bool:
        return hasattr(getattr(type(self), name, None), "tool_kind")

    def is_write(self, name: str) -> bool:
        return self.has_tool(name) and getattr(type(self), name).tool_kind == WRITE

    def use_tool(self, name: str, **arguments: Any) -> Any:
        if not self.has_tool(name):
            raise ValueError(f"Tool '{name}' not found.")
        return getattr(self, name)(**arguments)


def _owned_copy(function: types.FunctionType, qualname: str) -> types.FunctionType:
    copy = types.FunctionType(
        function.__code__.replace(co_qualname=qualname),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__qualname__ = qualname
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__annotations__ = dict(function.__annotations__)
    copy.__doc__ = function.__doc__
    copy.__dict__.update(function.__dict__)
    return copy


def calculate_expression(expression: str) -> str:
    """Upstream's calculator: digits, + - * / ( ) . and spaces, evaluated without builtins."""
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ValueError("Invalid characters in expression")
    return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))  # noqa: S307 - checked above


def _plain(value: Any) -> Any:
    """Upstream's conversion of a tool's return value before ``json.dumps``: models become
    their dump, bare numbers inside containers become strings, dates ISO text."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    raise ValueError(f"Unsupported type: {type(value)}")


def tool_output(value: Any) -> str:
    """The text the agent reads for a tool's return value (strings pass unchanged)."""
    if isinstance(value, str):
        return value
    return json.dumps(_plain(value), default=str)
