"""Preflight asks a backend what it knows (``Backend.preflight``, ``counts_on_own_server``) and
never decides by its name; an async-only backend subclasses the public ``AsyncBackend``."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import pytest

from budgetbench_core import AsyncBackend, Backend, BackendCheck, Completion, GenerationParams, Message, hookimpl
from budgetbench_core.preflight import PreflightError, preflight
from budgetbench_core.run_config import RunConfig
from budgetbench_core.testing import registry_with


class SmallServer(Backend):
    """A vendor backend that knows its server's window and has one problem to report."""

    name = "small-server"
    broken = False

    def preflight(self, flag, full, judge=False, prompts_only=False):
        problems = [f"{flag} {self.model}: the vendor server is in maintenance"] if self.broken else []
        return BackendCheck(1500, "the vendor's /info", problems=problems, passed=["vendor server answered"])

    def complete(self, messages, params):
        raise AssertionError("preflight must not call the model")


class BrokenServer(SmallServer):
    name = "broken-server"
    broken = True


def registry():
    plugin = types.SimpleNamespace(
        register_backends=hookimpl(lambda register: [register(SmallServer), register(BrokenServer)]),
        resolve_backend=hookimpl(lambda model: model.split("/", 1)[0] if "/" in model else None),
    )
    return registry_with(plugin, distribution="vendor-backend")


def config(model, **options):
    return RunConfig(task="synthetic-memory", strategies=["truncation"], out=Path("unused"), model=model, **options)


def test_the_backends_own_context_decides_the_budgets():
    found = preflight(config("small-server/m", budgets=[1024]), registry(), budgets_given=True, full=False)
    assert found.context.tokens == 1500 and found.context.source == "the vendor's /info"
    with pytest.raises(
        PreflightError, match=r"budget 2048 does not fit the model's context \(1500 tokens, from the vendor's /info\)"
    ):
        preflight(config("small-server/m", budgets=[2048]), registry(), budgets_given=True, full=False)
    chosen = preflight(config("small-server/m"), registry(), budgets_given=False, full=False, max_output=64)
    assert chosen.budgets == [1436]  # no default tier fits: the window less the output


def test_a_backends_problem_is_reported_as_its_own_line():
    with pytest.raises(PreflightError) as refused:
        preflight(config("broken-server/m", budgets=[512]), registry(), budgets_given=True, full=False)
    assert refused.value.problems == ["--model broken-server/m: the vendor server is in maintenance"]


class Echo(AsyncBackend):
    name = "echo-async-only"

    async def acomplete(self, messages, params):
        await asyncio.sleep(0)
        return Completion(messages[-1].content, None, None, 0.0)


def test_an_async_only_backend_answers_sync_callers_through_the_shared_loop():
    backend = Echo("echo")
    assert backend.async_calls()
    reply = backend.complete((Message("user", "hello"),), GenerationParams(8, 0.0, 0))
    assert reply.text == "hello"
    with pytest.raises(TypeError):

        class Incomplete(AsyncBackend):  # no acomplete: cannot be made
            name = "incomplete"

        Incomplete("x")
