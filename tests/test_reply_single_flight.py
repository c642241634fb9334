"""Cells asking the same prompt at once make one model call: the others wait for its reply
(the reply cache's key), so a thread run never pays twice for one prompt."""

from __future__ import annotations

import os
import threading

from budgetbench_core import GenerationParams, Message
from budgetbench_core.cache import ResponseCache
from budgetbench_core.model_calls import ModelCaller
from budgetbench_core.plugins import get_registry
from budgetbench_core.testing import FaultServer


def test_the_same_prompt_asked_at_once_is_sent_once(tmp_path):
    with FaultServer(latency_s=0.3) as server:
        backend = get_registry().resolve_backend("openai/fault-model").obj("openai/fault-model", api_base=server.url)
        backend.start()
        cache = ResponseCache(tmp_path / "cache.sqlite", os.urandom(32))
        caller = ModelCaller(backend, cache, max_connections=8, retries=0)
        prompt = (Message("user", "the same question"),)
        outcomes = []

        def ask() -> None:
            outcomes.append(caller.call(prompt, GenerationParams(8, 0.0, 0)))

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        other = caller.call((Message("user", "another question"),), GenerationParams(8, 0.0, 0))
        cache.close()
        backend.stop()
    assert len(outcomes) == 6 and len({o.completion.text for o in outcomes}) == 1
    assert sorted(o.cached for o in outcomes) == [False] + [True] * 5
    assert len(server.requests) == 2 and caller.calls_made == 2 and not other.cached
