"""Property: a built-in strategy never hands over a prompt above the budget when one that
fits exists, counted exactly with a real chat template.

The tokenizer is SmolLM2's own (vocabulary and Jinja chat template read from the GGUF
the embedded model ships in, through transformers): exact, and not additive, since the
template inserts a default system prompt when an item has none. Histories mix languages,
emoji, blank messages and literal template tokens. ``summary_buffer`` is in: its
summariser answers with as many tokens as it is allowed (the worst case for its minimum
summary section, defect 10), and each summary prompt must pass the runner's own gate.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from budgetbench_core import AuxiliaryBudgetError, Item, Message, PromptCounter, StrategyContext
from budgetbench_core.builtin.strategies import Checkpoint, FullContext, Recency, SummaryBuffer, Truncation
from budgetbench_core.gate import gate

CASES = 10_000
STRATEGIES = (Truncation, Recency, Checkpoint, FullContext, SummaryBuffer)
EXAMPLES = CASES // len(STRATEGIES)
WORDS = [
    "the",
    "dog",
    "Lisbon",
    "moved",
    "on",
    "2023-04-01",
    "favourite",
    "tea",
    "is",
    "my",
    "name",
    "Amara",
    "Привет",
    "東京の天気",
    "🍕🚲",
    "👩‍👩‍👧‍👦",
    "ünïcödé",
    "12,50 €",
    "<|im_end|>",
    "<|im_start|>user",
    "\n",
    "\t",
    "  ",
    "?",
    "—",
    "supercalifragilistic",
    "0x7f",
    '{"json": true}',
]


@pytest.fixture(scope="module")
def smollm2_tokenizer(budgetbench_counter):
    """SmolLM2's own template and vocabulary, asked of the embedded llama.cpp server: exact.

    (transformers' conversion of the GGUF, ``gguf:``, is not: it counted 192 where the server
    counted 191 on a prompt with ``<|im_start|>`` inside a message.)
    """
    tokenizer = budgetbench_counter.tokenizer
    assert tokenizer.info.exact
    return tokenizer


text = st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join)
message = st.builds(
    lambda role, content, session: Message(role, content, {"session_id": f"s{session}"}),
    st.sampled_from(["user", "assistant"]),
    text,
    st.integers(0, 6),
)
items = st.builds(
    lambda history, query, system: Item(
        "prop",
        tuple(sorted(history, key=lambda m: m.metadata["session_id"])),
        Message("user", query),
        None,
        Message("system", system) if system else None,
    ),
    st.lists(message, max_size=24),
    text,
    st.none() | text.filter(bool),
)


@pytest.mark.slow
def test_no_admitted_prompt_over_budget(smollm2_tokenizer, tmp_path):
    counter = PromptCounter(smollm2_tokenizer)
    cases: Counter[str] = Counter()

    def auxiliary_calls(cls, budget):
        def no_auxiliary_calls(messages, max_tokens, purpose):
            raise AssertionError(f"{cls.name} makes no model calls")

        def worst_case_summary(messages, max_tokens, purpose):
            gated = gate(messages, budget, counter)
            if not gated.admitted:  # what the runner does: the call is not sent
                raise AuxiliaryBudgetError(f"{purpose}: {gated.tokens} > {budget}", gated.tokens)
            cases["summary_buffer auxiliary calls"] += 1
            return " ".join(["memo"] * max_tokens)

        return worst_case_summary if cls is SummaryBuffer else no_auxiliary_calls

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(item=items, permille=st.lists(st.integers(-150, 1000), min_size=len(STRATEGIES), max_size=len(STRATEGIES)))
    def check(item, permille):
        floor = smollm2_tokenizer.count(item.frame([]))  # system prompt + query alone
        whole = smollm2_tokenizer.count(item.frame(list(item.history)))
        # Budgets mostly between the floor and a little above the whole history, where choices matter.
        span = whole + 20 - floor
        for cls, budget in zip(STRATEGIES, (max(1, floor + span * p // 1000) for p in permille)):
            context = StrategyContext(
                item=item,
                budget=budget,
                counter=counter,
                complete=auxiliary_calls(cls, budget),
                seed=0,
                scratch_dir=tmp_path,
            )
            prompt = cls().apply(item.history, budget, context)
            exact = smollm2_tokenizer.count(prompt)  # counted afresh, no cache
            assert prompt[-1] == item.query and (item.system is None or prompt[0] == item.system)
            if cls is FullContext:
                assert prompt == item.frame(list(item.history))
                cases["full_context " + ("admitted" if exact <= budget else "violation")] += 1
            elif exact <= budget:
                cases[cls.name + " admitted"] += 1
            else:  # over budget only when nothing at all could be kept
                assert floor > budget and prompt == item.frame([]), (cls.name, budget, exact, floor)
                cases[cls.name + " violation"] += 1

    check()
    assert cases["summary_buffer auxiliary calls"] > 0  # summaries were really made and composed
    cases.pop("summary_buffer auxiliary calls")
    assert sum(cases.values()) >= CASES
    admitted = sum(n for name, n in cases.items() if name.endswith("admitted"))
    assert admitted > CASES // 2  # the budgets were mostly reachable: the property was really exercised
    print("budget property cases:", dict(sorted(cases.items())))
