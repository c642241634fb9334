"""Exact counting: our rendered-prompt count equals what the embedded server reports."""

from __future__ import annotations

import random

import pytest
from pathlib import Path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgetbench_core import GenerationParams, Message

TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=0, max_size=60)
MESSAGES = st.lists(st.tuples(st.sampled_from(["user", "assistant"]), TEXTS), min_size=0, max_size=8)


def test_served_count_audit_agrees_on_embedded_model(local_backend, server_counter):
    """The count we enforce is the count the server actually processed (usage.prompt_tokens)."""
    prompts = [
        [Message("user", "What is the capital of France?")],
        [Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello! 👋"), Message("user", "Café?")],
        [Message("system", "x"), *[Message("user" if i % 2 else "assistant", f"turn {i} " * i) for i in range(12)],
         Message("user", "Summarise.")],
    ]
    for prompt in prompts:
        completion = local_backend.complete(prompt, GenerationParams(max_tokens=4))
        assert completion.prompt_tokens == server_counter.count(prompt)


def test_defect_11_template_tokens_are_counted(server_counter):
    """Content-only counting is wrong (defect 11): the template adds tokens per message."""
    prompt = [Message("system", "Be brief."), Message("user", "Hello there")]
    content_only = sum(server_counter.content_tokens(m.content) for m in prompt)
    assert server_counter.count(prompt) > content_only + 4


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=MESSAGES, system=TEXTS, query=TEXTS)
def test_estimate_matches_exact_count_for_chatml(server_counter, history, system, query):
    """SmolLM2's template is additive, so the linear estimate equals the exact count."""
    prompt = [Message("system", system), *(Message(r, c) for r, c in history), Message("user", query)]
    estimate, exact = server_counter.estimate(prompt), server_counter.count(prompt)
    # Token merges across a message boundary can only make the exact count smaller.
    assert exact <= estimate <= exact + len(prompt)


def test_fit_never_returns_an_over_budget_prompt(server_counter):
    rng = random.Random(7)
    history = [Message("user", " ".join(rng.choice(["alpha", "beta", "γάμμα", "δ"]) for _ in range(rng.randint(1, 40))))
               for _ in range(30)]
    frame = lambda kept: [Message("system", "s"), *kept, Message("user", "q")]  # noqa: E731
    for budget in (30, 64, 128, 300):
        kept, exact = server_counter.fit(frame, history, budget)
        assert exact == server_counter.count(frame(kept)) and exact <= budget
