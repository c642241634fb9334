"""Exact counting: our rendered-prompt count equals what the embedded server reports."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgetbench_core import GenerationParams, Message, PromptCounter
from budgetbench_core.builtin.tokenizers import GGUFVocabulary, ServerTokenizer, server_tokenizer

TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=0, max_size=60)
MESSAGES = st.lists(st.tuples(st.sampled_from(["user", "assistant"]), TEXTS), min_size=0, max_size=8)


def test_served_count_audit_agrees_on_embedded_model(local_backend, server_counter):
    """The count we enforce is the count the server actually processed (usage.prompt_tokens)."""
    prompts = [
        [Message("user", "What is the capital of France?")],
        [
            Message("system", "Be brief."),
            Message("user", "Hi"),
            Message("assistant", "Hello! 👋"),
            Message("user", "Café?"),
        ],
        [
            Message("system", "x"),
            *[Message("user" if i % 2 else "assistant", f"turn {i} " * i) for i in range(12)],
            Message("user", "Summarise."),
        ],
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
    history = [
        Message("user", " ".join(rng.choice(["alpha", "beta", "γάμμα", "δ"]) for _ in range(rng.randint(1, 40))))
        for _ in range(30)
    ]
    frame = lambda kept: [Message("system", "s"), *kept, Message("user", "q")]  # noqa: E731
    for budget in (30, 64, 128, 300):
        kept, exact = server_counter.fit(frame, history, budget)
        assert exact == server_counter.count(frame(kept)) and exact <= budget


# ----------------------------------------------------------------- piece-wise counting, checked against the server

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>assistant\n", "<repo_name>"]
FULL = os.environ.get("BUDGETBENCH_COUNTING_FULL") == "1"  # every LongMemEval_S message, ~30 s


def corpus_texts(limit_chars: int) -> dict[str, list[str]]:
    """Texts from each shared corpus, up to ``limit_chars`` characters per corpus."""
    if not DATA.is_dir():
        pytest.skip(f"{DATA} is absent: the shared test corpora are needed")
    sources: dict[str, list[str]] = {}
    for name in ("longmemeval_s_sample", "longmemeval_oracle"):
        records = json.loads((DATA / "longmemeval" / f"{name}.json").read_text(encoding="utf-8"))
        sources[name] = [t["content"] for r in records for s in r["haystack_sessions"] for t in s] + [
            r["question"] for r in records
        ]
    longbench = json.loads((DATA / "longbench_v2" / "longbench_v2_short_sample.json").read_text(encoding="utf-8"))
    sources["longbench_v2"] = [
        chunk for r in longbench for chunk in (r["context"][i : i + 4000] for i in range(0, len(r["context"]), 4000))
    ]
    swe = [json.loads(line) for line in (DATA / "swebench" / "swebench_verified_mini.jsonl").read_text().splitlines()]
    sources["swebench"] = [
        r[k] for r in swe for k in ("problem_statement", "patch", "test_patch", "hints_text") if r[k]
    ]
    sources["taubench"] = [p.read_text(encoding="utf-8") for p in sorted((DATA / "taubench").glob("*/*.md"))]
    picked = {}
    for name, texts in sources.items():
        rng = random.Random(name)
        rng.shuffle(texts)
        out, used = [], 0
        for text in texts:
            if used >= limit_chars:
                break
            out.append(text)
            used += len(text)
        picked[name] = out
    return picked


def server_whole(base_url: str, text: str, add_special: bool) -> int:
    """The server's own count of a whole text: the reference the piece-wise count must equal."""
    response = httpx.post(
        base_url + "/tokenize", json={"content": text, "add_special": add_special, "parse_special": True}, timeout=120
    )
    return len(response.json()["tokens"])


def test_piecewise_count_equals_the_servers_on_the_corpora(local_backend):
    """Prompts from every shared corpus, counted piece by piece (cached, batched), equal
    the server's count of the whole rendered prompt."""
    tokenizer = ServerTokenizer(local_backend.server_url)
    checked = 0
    for name, texts in corpus_texts(300_000).items():
        rng = random.Random(name)
        for start in range(0, len(texts), 12):
            chunk = texts[start : start + 12]
            prompt = [
                Message("system", "Answer from the sessions."),
                *(Message(rng.choice(["user", "assistant"]), t) for t in chunk),
                Message("user", "Q?"),
            ]
            rendered = tokenizer.render(prompt)
            assert tokenizer.count_rendered(rendered) == server_whole(local_backend.server_url, rendered, True), name
            checked += 1
    assert checked > 40


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(
        st.one_of(TEXTS, st.sampled_from(SPECIALS), st.sampled_from([" ", "\n", "\n\n", " \t", "12", "3"])), max_size=12
    ),
    role=st.sampled_from(["system", "user", "assistant"]),
)
def test_piecewise_count_equals_the_servers_around_special_tokens(local_backend, server_counter, parts, role):
    """Contents holding special-token text, whitespace next to it, digits: a piece-wise
    count that cut the prompt differently from llama.cpp would disagree here."""
    content = "".join(parts)
    tokenizer = server_counter.tokenizer
    assert tokenizer.count_text(content) == server_whole(local_backend.server_url, content, False)
    rendered = tokenizer.render([Message(role, content), Message("user", content or "q")])
    assert tokenizer.count_rendered(rendered) == server_whole(local_backend.server_url, rendered, True)


def test_in_process_vocabulary_agrees_with_the_server_on_the_corpora(local_backend):
    """The GGUF vocabulary used for in-process estimates counts every corpus text as the
    server does (every LongMemEval_S message with BUDGETBENCH_COUNTING_FULL=1)."""
    vocabulary = GGUFVocabulary.load(local_backend.model_path)
    assert vocabulary is not None
    tokenizer = ServerTokenizer(local_backend.server_url)
    texts = corpus_texts(30_000_000 if FULL else 200_000)
    if FULL:
        texts = {"longmemeval_s_sample": texts["longmemeval_s_sample"]}
    tokenizer.count_text("")  # the probe: batched counts need the separator it learns
    for name, sample in texts.items():
        sample = [*sample, *(f"{t} <|im_end|>\n{t[:50]}" for t in sample[:20])]
        served = [n for i in range(0, len(sample), 400) for n in tokenizer._count_batch(sample[i : i + 400])]
        local = [vocabulary.count(t) for t in sample]
        wrong = [t[:60] for t, a, b in zip(sample, local, served) if a != b]
        assert not wrong, f"{name}: {len(wrong)} of {len(sample)} texts counted differently, e.g. {wrong[:3]}"


def test_a_five_tier_sweep_tokenises_each_message_once(local_backend):
    """Truncation at five tiers over a long history, with the tokenizer a run builds: the
    server tokenises each message once (not once per tier) in a handful of requests, and
    every count is still the server's count of the whole prompt."""
    if not DATA.is_dir():
        pytest.skip(f"{DATA} is absent")
    from budgetbench_core import Item, StrategyContext
    from budgetbench_core.builtin.strategies import Truncation

    record = json.loads((DATA / "longmemeval" / "longmemeval_s_sample.json").read_text(encoding="utf-8"))[0]
    history = tuple(Message(t["role"], t["content"]) for s in record["haystack_sessions"] for t in s)
    item = Item(
        id="x",
        history=history,
        query=Message("user", record["question"]),
        answer="",
        system=Message("system", "Answer from the sessions."),
    )
    tokenizer = server_tokenizer("", local_backend)
    counter = PromptCounter(tokenizer)
    counter.estimate([Message(r, "") for r in ("system", "user", "assistant")])  # once per run
    sent = []
    tokenizer._http.event_hooks["request"].append(
        lambda request: sent.append(json.loads(request.content)) if request.url.path == "/tokenize" else None
    )
    tiers = [2048, 4096, 8192, 16384, 32768]
    prompts = []
    for budget in tiers:
        context = StrategyContext(item=item, budget=budget, counter=counter, complete=None, seed=0, run_dir=Path("."))
        prompt = Truncation().apply(item.history, budget, context)
        assert counter.count(prompt) <= budget
        prompts.append(prompt)
    largest = tokenizer.render(prompts[-1])
    assert counter.count(prompts[-1]) == server_whole(local_backend.server_url, largest, True)
    tokenised = sum(
        len(p)
        for body in sent
        for p in (body["content"] if isinstance(body["content"], list) else [body["content"]])
        if isinstance(p, str)
    )
    assert len(sent) <= 2 * len(tiers)
    assert tokenised <= 1.05 * len(largest), "messages were tokenised again at a later tier"
