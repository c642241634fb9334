"""Async model calls on the shared event loop: deadlines that cancel, the connection limit,
untrusted coroutines contained, a blocked loop named, and the one serialisation of a prompt."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path

import pytest

from budgetbench_core import Backend, Completion, GenerationParams, Message, TransportError
from budgetbench_core.builtin.litellm_backend import LiteLLMBackend
from budgetbench_core.cache import ResponseCache
from budgetbench_core.event_loop import shared_loop
from budgetbench_core.failfast import FailFast
from budgetbench_core.gate import chat_json
from budgetbench_core.messages import SentMessages
from budgetbench_core.model_calls import CallFailed, ModelCaller
from budgetbench_core.testing import FaultServer

MESSAGES = [Message("system", "Be brief."), Message("user", "Where is Paris?")]
PARAMS = GenerationParams(8, 0.0, 1)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "hooks.md"


def completion(text: str = "ok") -> Completion:
    return Completion(text=text, prompt_tokens=None, completion_tokens=None, latency_s=0.0)


class Scripted(Backend):
    """An async third-party backend whose coroutine is given by the test."""

    name = "scripted"

    def __init__(self, behaviour, **options):
        super().__init__("scripted/model", **options)
        self.behaviour = behaviour

    async def acomplete(self, messages, params):
        return await self.behaviour(messages, params)

    def complete(self, messages, params):
        raise AssertionError("the harness must await acomplete, not call complete")


def caller(backend: Backend, **options) -> ModelCaller:
    options.setdefault("retries", 0)
    options.setdefault("max_connections", 4)
    return ModelCaller(backend, None, options.pop("max_connections"), backoff_s=0.01, **options)


def test_the_documented_async_backend_runs_through_the_harness():
    block = DOCS.read_text(encoding="utf-8").split("A minimal async backend:", 1)[1]
    code = re.search(r"```python\n(.*?)```", block, flags=re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(DOCS), "exec"), namespace)
    backend = namespace["EchoBackend"]("echo-async/x")
    assert backend.async_calls()
    outcome = caller(backend).call(MESSAGES, PARAMS)
    assert outcome.completion.text == "Where is"[: PARAMS.max_tokens] and outcome.attempts == 1
    assert backend.complete(MESSAGES, PARAMS).text == outcome.completion.text  # its sync path


def test_a_coroutine_past_its_deadline_is_cancelled():
    cancelled = threading.Event()

    async def hang(messages, params):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return completion()

    with pytest.raises(CallFailed, match="no complete reply within the total deadline of 0.3 s"):
        caller(Scripted(hang), timeout_s=0.3).call(MESSAGES, PARAMS)
    assert cancelled.wait(10), "the coroutine was abandoned, not cancelled"


def test_a_trickling_server_is_cut_at_the_deadline_on_the_direct_client():
    with FaultServer(rate=1.0, faults=("trickle",), trickle_s=0.2) as server:
        backend = LiteLLMBackend("openai/fault-model", api_base=server.url, timeout_s=0.8)
        assert backend.async_calls()
        with pytest.raises(CallFailed, match="total deadline of 0.8 s") as failed:
            caller(backend).call(MESSAGES, PARAMS)
        assert "event loop" not in str(failed.value)  # a slow server, not a blocked loop
        assert server.completions() == 1


def test_the_connection_limit_holds_even_for_a_coroutine_that_ignores_cancellation():
    state = {"inflight": 0, "most": 0, "starts": 0}
    first_ended = []

    async def slow(messages, params):
        state["inflight"] += 1
        state["most"] = max(state["most"], state["inflight"])
        state["starts"] += 1
        nth = state["starts"]
        try:
            try:
                await asyncio.sleep(0.6 if nth == 1 else 0.05)
            except asyncio.CancelledError:
                await asyncio.sleep(0.5)  # swallows the cancel: still holding the server
            return completion()
        finally:
            state["inflight"] -= 1
            if nth == 1:
                first_ended.append(True)

    limited = caller(Scripted(slow), max_connections=1, timeout_s=0.3)
    with pytest.raises(CallFailed):
        limited.call(MESSAGES, PARAMS)  # its coroutine lives on past the deadline
    started_second = state["starts"]
    limited.timeout_s = 30
    limited.call(MESSAGES, PARAMS)
    assert started_second == 1 and first_ended and state["most"] == 1

    parallel = caller(Scripted(slow), max_connections=3, timeout_s=30)
    state.update(most=0, starts=10)
    threads = [threading.Thread(target=parallel.call, args=(MESSAGES, PARAMS)) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert state["most"] == 3 and state["starts"] == 22


def test_a_call_that_finds_no_free_connection_says_so_and_is_never_sent():
    starts = []
    holding = threading.Event()

    async def hold(messages, params):
        starts.append(messages[-1].content)
        holding.set()
        await asyncio.sleep(1.0)
        return completion(messages[-1].content)

    limited = caller(Scripted(hold), max_connections=1, timeout_s=30)
    first = threading.Thread(target=limited.call, args=(MESSAGES, PARAMS))
    first.start()
    assert holding.wait(30)
    limited.timeout_s = 0.3
    waiting = [Message("user", "never sent")]
    with pytest.raises(CallFailed) as failed:
        limited.call(waiting, PARAMS)
    assert "no connection free within the total deadline of 0.3 s" in str(failed.value)
    assert "1 calls to this model still in flight; nothing sent" in str(failed.value)
    first.join(30)
    limited.timeout_s = 30
    assert limited.call([Message("user", "after")], PARAMS).completion.text == "after"
    assert starts == [MESSAGES[-1].content, "after"]  # the call that gave up waiting never started later


def test_direct_client_sends_the_chat_json_it_is_given_and_keys_the_cache_by_it(tmp_path):
    seen: list[list[dict]] = []

    def reply(messages):
        seen.append(messages)
        return "Paris"

    with FaultServer(reply=reply) as server:
        backend = LiteLLMBackend("openai/fault-model", api_base=server.url, timeout_s=10)
        cache = ResponseCache(tmp_path / "cache.sqlite", os.urandom(32))
        calls = ModelCaller(backend, cache, 2, retries=0)
        sent = chat_json(MESSAGES).replace("Where is Paris?", "Where is Rome?")
        first = calls.call(MESSAGES, PARAMS, chat_json=sent)
        assert seen[-1][-1]["content"] == "Where is Rome?"  # the body is the given JSON, not re-serialised
        assert calls.call(MESSAGES, PARAMS, chat_json=sent).cached
        fresh = calls.call(MESSAGES, PARAMS)  # without chat_json: serialised here, another key
        assert not fresh.cached and seen[-1][-1]["content"] == "Where is Paris?" and len(seen) == 2
        assert calls.call(MESSAGES, PARAMS, chat_json=chat_json(MESSAGES)).cached
        assert first.completion.text == "Paris"
        cache.close()


def test_a_lone_surrogate_is_sent_as_an_escape():
    backend = LiteLLMBackend("openai/x", api_base="http://127.0.0.1:9/v1")
    messages = [Message("user", "broken \ud800 text")]
    body = backend._direct_body(SentMessages(messages, chat_json(messages)), PARAMS)
    assert b"\\ud800" in body


class Junk:
    text = "looks like a completion"


async def _raise_value(messages, params):
    raise ValueError("boom")


async def _raise_system_exit(messages, params):
    raise SystemExit(3)


async def _raise_own_cancel(messages, params):
    raise asyncio.CancelledError("mine")


async def _return_junk(messages, params):
    return Junk()


class SyncScripted(Backend):
    """The same behaviour on the sync path (``complete`` on a sandbox thread)."""

    name = "scripted"

    def __init__(self, behaviour, **options):
        super().__init__("scripted/model", **options)
        self.behaviour = behaviour

    def complete(self, messages, params):
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(self.behaviour(messages, params))
        finally:
            loop.close()


@pytest.mark.parametrize(
    "behaviour,expected",
    [
        (_raise_value, "ValueError: boom (not retried)"),
        (_raise_system_exit, "SystemExit: 3 (not retried)"),
        (_raise_own_cancel, "CancelledError: mine (not retried)"),
        (
            _return_junk,
            "backend 'scripted' returned an unusable completion: backend returned Junk, not Completion (not retried)",
        ),
    ],
)
def test_whatever_a_coroutine_raises_or_returns_is_contained_as_on_the_sync_path(behaviour, expected):
    failures = {}
    for backend in (Scripted(behaviour), SyncScripted(behaviour)):
        assert backend.async_calls() is isinstance(backend, Scripted)
        with pytest.raises(CallFailed) as failed:
            caller(backend).call(MESSAGES, PARAMS)
        failures[type(backend).__name__] = (str(failed.value), failed.value.attempts)
    assert failures["Scripted"] == failures["SyncScripted"] == (expected, 1)
    assert caller(Scripted(lambda m, p: _ok())).call(MESSAGES, PARAMS).completion.text == "ok"  # the loop lives on


async def _ok():
    return completion()


def test_a_system_exit_raised_in_a_plugin_callback_does_not_stop_the_loop():
    def leave():
        raise SystemExit("from a callback")

    async def schedules(messages, params):
        asyncio.get_running_loop().call_soon(leave)
        return completion("scheduled")

    loop = shared_loop()
    assert caller(Scripted(schedules)).call(MESSAGES, PARAMS).completion.text == "scheduled"
    assert caller(Scripted(lambda m, p: _ok()), timeout_s=30).call(MESSAGES, PARAMS).completion.text == "ok"
    assert loop.thread.is_alive() and "SystemExit escaped a callback on the event loop" in loop.escaped


def test_an_acomplete_that_is_no_coroutine_is_an_unusable_completion():
    class Sync(Backend):
        name = "not-async"

        def acomplete(self, messages, params):  # type: ignore[override]  # the plugin's mistake
            return completion()

        def complete(self, messages, params):
            return completion()

    with pytest.raises(CallFailed, match="'not-async' returned an unusable completion: acomplete returned Completion"):
        caller(Sync("x")).call(MESSAGES, PARAMS)


def test_transport_errors_of_a_coroutine_are_retried():
    attempts = []

    async def flaky(messages, params):
        attempts.append(1)
        if len(attempts) < 3:
            raise TransportError("HTTP 503: busy", retry_after=0.01)
        return completion("late")

    outcome = caller(Scripted(flaky), retries=4).call(MESSAGES, PARAMS)
    assert outcome.completion.text == "late" and outcome.attempts == 3


def test_a_coroutine_that_blocks_the_loop_is_named_and_does_not_hang_the_run():
    blocking_now = threading.Event()

    async def blocking(messages, params):
        blocking_now.set()
        time.sleep(3)  # the plugin's bug: the whole loop waits
        return completion()

    class Blocker(Scripted):
        name = "blocker"

    failures: dict[str, str] = {}

    def blocked_call():
        with pytest.raises(CallFailed) as failed:
            caller(Blocker(blocking), timeout_s=1.5).call(MESSAGES, PARAMS)
        failures["blocker"] = str(failed.value)

    thread = threading.Thread(target=blocked_call)
    thread.start()
    assert blocking_now.wait(30)
    with pytest.raises(CallFailed) as bystander:  # another backend on the same loop, sent while it is held
        caller(Scripted(lambda m, p: _ok()), timeout_s=1.2).call(MESSAGES, PARAMS)
    thread.join(30)
    for message in (failures["blocker"], str(bystander.value)):
        assert "no complete reply within the total deadline" in message
        assert "the shared event loop has not run for" in message and "backend 'blocker' blocks it" in message
    assert caller(Scripted(lambda m, p: _ok()), timeout_s=30).call(MESSAGES, PARAMS).completion.text == "ok"


def test_a_blocking_callback_is_told_apart_from_a_blocking_call():
    blocking_now = threading.Event()

    def stuck():
        blocking_now.set()
        time.sleep(2.5)

    async def schedules(messages, params):
        asyncio.get_running_loop().call_soon(stuck)
        return completion("scheduled")

    assert caller(Scripted(schedules)).call(MESSAGES, PARAMS).completion.text == "scheduled"
    assert blocking_now.wait(30)
    with pytest.raises(CallFailed, match="has not run for .* s and no model call holds it"):
        caller(Scripted(lambda m, p: _ok()), timeout_s=1.2).call(MESSAGES, PARAMS)


def test_a_refused_key_costs_one_call_on_the_async_path():
    with FaultServer(route_default=(401, {"error": {"message": "bad key"}})) as server:
        backend = LiteLLMBackend("openai/fault-model", api_base=server.url, timeout_s=10)
        fail_fast = FailFast()
        calls = ModelCaller(backend, None, 8, retries=3, fail_fast=fail_fast)
        errors: list[str] = []

        def one():
            try:
                calls.call(MESSAGES, PARAMS)
            except CallFailed as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert server.completions() == 1 and fail_fast.fatal and len(errors) == 8


def test_a_blocking_call_from_the_loop_thread_is_refused():
    loop = shared_loop()

    async def inner():
        pending = asyncio.sleep(0)
        try:
            return loop.run(pending)
        finally:
            pending.close()

    with pytest.raises(RuntimeError, match="never return"):
        loop.run(inner(), timeout=10)


def test_the_memoised_cache_key_head_keeps_parameters_of_another_type_apart():
    from budgetbench_core.cache import cache_key

    as_float = cache_key("m", None, "[]", GenerationParams(8, 0.0, 1))
    as_int = cache_key("m", None, "[]", GenerationParams(8, 0, 1))  # equal to 0.0, serialised as 0
    assert as_float != as_int and cache_key("m", None, "[]", GenerationParams(8, 0.0, 1)) == as_float


class OwnDeadline(Scripted):
    """A backend that chooses its attempts' total deadline (as the embedded server does: none)."""

    def __init__(self, behaviour, deadline, **options):
        super().__init__(behaviour, **options)
        self.deadline = deadline

    def total_deadline_s(self, configured):
        return self.deadline


def test_a_backend_without_a_total_deadline_outlives_the_timeout_and_shows_in_flight():
    from budgetbench_core.model_calls import calls_in_flight

    release = threading.Event()

    async def waits(messages, params):
        while not release.is_set():
            await asyncio.sleep(0.01)
        return completion("late")

    unbounded = caller(OwnDeadline(waits, None), timeout_s=0.05)
    bounded = caller(OwnDeadline(waits, 30.0), timeout_s=0.05)
    outcomes = []
    threads = [
        threading.Thread(target=lambda c=c: outcomes.append(c.call(MESSAGES, PARAMS))) for c in (unbounded, bounded)
    ]
    for thread in threads:
        thread.start()
    while len(calls_in_flight()) < 2:
        time.sleep(0.01)
    flying = sorted(calls_in_flight(), key=lambda c: c.remaining_s is None)
    assert flying[0].remaining_s is not None and 0 < flying[0].remaining_s <= 30.0  # the backend's 30 s, not 0.05
    assert flying[1].remaining_s is None  # no total deadline
    time.sleep(0.2)  # four times the configured timeout: neither attempt is cut
    release.set()
    for thread in threads:
        thread.join(60)
    assert [o.completion.text for o in outcomes] == ["late", "late"] and all(o.attempts == 1 for o in outcomes)
    assert calls_in_flight() == []


class SlowToAnswer(OwnDeadline):
    """Takes 50 ms to say it has no total deadline and that it is async (plugin code on a busy
    machine: the questions go to a worker thread, which may wait for the interpreter lock)."""

    def total_deadline_s(self, configured):
        time.sleep(0.05)
        return None

    def async_calls(self):
        time.sleep(0.05)
        return True


def test_a_backends_answers_about_itself_are_not_bound_by_a_short_call_timeout():
    """Old code: both questions were bound by the call's timeout, so a 1 ms timeout (the embedded
    server's test of a call outliving it) failed the call before it was sent on a busy machine."""

    async def fine(messages, params):
        await asyncio.sleep(0.05)
        return completion("sent")

    outcome = caller(SlowToAnswer(fine, None), timeout_s=0.001).call(MESSAGES, PARAMS)
    assert outcome.completion.text == "sent" and outcome.attempts == 1


def test_a_total_deadline_that_is_not_seconds_is_refused_naming_the_backend():
    async def fine(messages, params):
        return completion()

    with pytest.raises(CallFailed, match=r"total_deadline_s\(\) returned 'soon', not seconds or None"):
        caller(OwnDeadline(fine, "soon")).call(MESSAGES, PARAMS)
