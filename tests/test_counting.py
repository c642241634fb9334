"""Exact counting: our rendered-prompt count equals what the embedded server reports."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from budgetbench_core import CountCache, GenerationParams, Message, PromptCounter
from budgetbench_core.builtin.tokenizers import (
    GGUFVocabulary,
    HuggingFaceTokenizer,
    ServerTokenizer,
    TiktokenTokenizer,
    server_tokenizer,
)

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
        context = StrategyContext(
            item=item, budget=budget, counter=counter, complete=None, seed=0, scratch_dir=Path(".")
        )
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


# ----------------------------------------------------------------- caches a strategy cannot poison


class Sly(str):
    """A string that claims to equal every string, with the hash of the one it imitates."""

    imitated: str

    def __new__(cls, value: str, imitated: str = "") -> Sly:
        self = super().__new__(cls, value)
        self.imitated = imitated
        return self

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash(self.imitated)

    def encode(self, *args, **kwargs) -> bytes:  # type: ignore[override]
        return self.imitated.encode(*args, **kwargs)

    def split(self, *args, **kwargs):  # type: ignore[override]
        return [self.imitated]


def test_count_cache_counts_each_text_once_and_keeps_a_bound():
    cache = CountCache(size=4, recent_chars=10)
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return len(text)

    texts = [f"text number {i}" for i in range(10)]
    assert [cache.count(t, count) for t in texts + texts[-3:]] == [len(t) for t in texts + texts[-3:]]
    assert seen == texts  # the newest three were still cached
    assert cache.count_all(["a", "bb", "a", texts[0]], lambda ts: [len(t) for t in ts]) == [1, 2, 1, len(texts[0])]
    assert len(cache._by_digest) <= 4 and cache._recent_chars <= 10
    with pytest.raises(ValueError, match="counted 1 texts where 2"):
        cache.count_all(["x", "yy"], lambda ts: [1])


def test_a_str_subclass_cannot_poison_the_counts():
    """A strategy's string that equals everything and digests like another text is counted
    as its own value; the real text keeps its own count."""
    tokenizer = TiktokenTokenizer("cl100k_base")
    counter = PromptCounter(tokenizer)
    real = "the real message " * 50
    fake = Sly("short", imitated=real)
    assert counter.content_tokens(fake) == counter.content_tokens("short")
    assert counter.content_tokens(real) == len(tokenizer.encoding.encode(real))
    assert counter.message_tokens(Message("user", fake)) < counter.message_tokens(Message("user", real))
    assert tokenizer.count_text(fake) == tokenizer.count_text("short")


def test_a_prompt_counted_through_a_strategys_objects_does_not_change_the_gates_count():
    """``fit`` counts the strategy's own objects; what it caches is the count of their stored
    fields, so the runner's count of the canonical prompt is never another prompt's."""
    from budgetbench_core.gate import gate

    class Lying(Message):
        def to_chat(self):  # what a server would be sent, if the tokenizer asked the object
            return {"role": "user", "content": "tiny"}

    counter = PromptCounter(TiktokenTokenizer("cl100k_base"))
    real = [Message("system", "s"), Message("user", "a long question " * 200)]
    fresh = TiktokenTokenizer("cl100k_base").count(real)
    shadowed = Message("user", real[1].content)
    object.__setattr__(shadowed, "to_chat", lambda: {"role": "user", "content": "tiny"})
    for attempt in (
        [real[0], Lying("user", real[1].content)],
        [real[0], shadowed],
        [real[0], Message("user", Sly(real[1].content, imitated=real[1].content))],
    ):
        assert counter.count(attempt) == fresh
    assert counter.count([Message("system", "s"), Message("user", Sly("tiny", imitated=real[1].content))]) < fresh
    assert gate(list(real), 10**6, counter).tokens == fresh
    with pytest.raises(TypeError, match="Message objects"):
        counter.count(["not a message"])  # type: ignore[list-item]

    class Recording(TiktokenTokenizer):
        given: list = []

        def count(self, messages):
            self.given.extend(messages)
            return super().count(messages)

    recording = PromptCounter(Recording("cl100k_base"))
    own = [Message("user", "a strategy's own message")]
    recording.count(own)
    # the tokenizer counts copies: changing the strategy's object afterwards (from another
    # thread, say) cannot change what was stored under the key it was read with
    assert [type(m) for m in Recording.given] == [Message] and Recording.given[0] is not own[0]


def test_tiktoken_encodes_each_text_once_however_many_items_are_in_flight():
    """The old 8192-entry LRU re-encoded whole prompts once 128 items' messages were in flight."""

    class Counted(TiktokenTokenizer):
        encoded: list[str] = []

        def _encoded_length(self, text: str) -> int:
            self.encoded.append(text)
            return super()._encoded_length(text)

    tokenizer = Counted("cl100k_base")
    prompts = [[Message("user", f"item {i} message {j}") for j in range(100)] for i in range(120)]
    first = [tokenizer.count(p) for p in prompts]
    encoded = len(tokenizer.encoded)
    assert [tokenizer.count(p) for p in prompts] == first
    assert len(tokenizer.encoded) == encoded == 12_000 + 1  # every content once, and the role
    assert first[0] == 3 + sum(3 + 1 + len(tokenizer.encoding.encode(m.content)) for m in prompts[0])


# ----------------------------------------------------------------- hf: piece-wise counting, checked against whole counts


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer and chat template as an hf: folder (transformers' conversion of the
    embedded model's GGUF), built once, offline."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from budgetbench_core.builtin.local_backend import default_model_path

    model = default_model_path()
    folder = tmp_path_factory.mktemp("hf-smollm2")
    AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def hf_tokenizer(hf_folder):
    tokenizer = HuggingFaceTokenizer(str(hf_folder))
    assert tokenizer._prepare(), "SmolLM2's tokenizer meets every condition for piece-wise counting"
    tokenizer._checks_left = 0  # what is tested is the piece-wise count itself, not its first-prompt guard
    return tokenizer


def test_hf_piecewise_count_equals_the_whole_count_on_the_corpora(hf_tokenizer):
    checked = 0
    for name, texts in corpus_texts(300_000).items():
        rng = random.Random(name)
        for start in range(0, len(texts), 12):
            prompt = [
                Message("system", "Answer from the sessions."),
                *(Message(rng.choice(["user", "assistant"]), t) for t in texts[start : start + 12]),
                Message("user", "Q?"),
            ]
            rendered = hf_tokenizer.render(prompt)
            assert hf_tokenizer.count(prompt) == hf_tokenizer._whole(rendered), name
            checked += 1
    assert checked > 40


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(
        st.one_of(
            TEXTS,
            st.sampled_from(SPECIALS + ["<|im_start|>user", "<jupyter_code>", "<|im_end|><|im_start|>"]),
            st.sampled_from([" ", "\n", "\n\n", " \t", "12", "3", "٣", "ǅ", "👋🏽", "\u00a0", "\r\n"]),
        ),
        max_size=12,
    ),
    role=st.sampled_from(["system", "user", "assistant"]),
)
def test_hf_piecewise_count_equals_the_whole_count_around_added_tokens(hf_tokenizer, parts, role):
    content = "".join(parts)
    assert hf_tokenizer.count_text(content) == hf_tokenizer._whole(content)
    prompt = [Message(role, content), Message("user", content or "q")]
    assert hf_tokenizer.count(prompt) == hf_tokenizer._whole(hf_tokenizer.render(prompt))


def _edited_folder(source: Path, target: Path, edit) -> Path:
    import shutil

    shutil.copytree(source, target)
    config = json.loads((target / "tokenizer.json").read_text(encoding="utf-8"))
    edit(config)
    (target / "tokenizer.json").write_text(json.dumps(config), encoding="utf-8")
    return target


def test_hf_counts_whole_texts_when_the_tokenizer_could_count_pieces_differently(hf_folder, tmp_path):
    """Added tokens that take whitespace from their neighbours, or a pre-tokeniser that
    treats the first piece differently: piece-wise counting is off and counts stay exact."""

    def strip_whitespace(config):
        for token in config["added_tokens"]:
            token["rstrip"] = True

    def metaspace_first(config):
        config["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}

    for name, edit in (("rstrip", strip_whitespace), ("metaspace", metaspace_first)):
        tokenizer = HuggingFaceTokenizer(str(_edited_folder(hf_folder, tmp_path / name, edit)))
        assert tokenizer._prepare() == [], name
        prompt = [Message("system", "s  "), Message("user", " <|im_end|>  x \n"), Message("user", "q")]
        assert tokenizer.count(prompt) == tokenizer._whole(tokenizer.render(prompt)), name


def test_hf_a_piecewise_count_that_disagrees_is_caught_by_the_first_prompt_checks(hf_folder):
    """Not silent: when a real prompt's piece-wise count differs from its whole count, the
    whole count is returned, a warning says so, and whole texts are counted from then on."""
    tokenizer = HuggingFaceTokenizer(str(hf_folder))
    assert tokenizer._prepare()
    right = tokenizer._batch
    tokenizer._batch = lambda texts: [n + 1 for n in right(texts)]  # a vocabulary quirk the probes missed
    prompt = [Message("system", "s"), Message("user", "a question that was never seen")]
    whole = tokenizer._whole(tokenizer.render(prompt))
    with pytest.warns(RuntimeWarning, match="differed from the whole count"):
        assert tokenizer.count(prompt) == whole
    assert tokenizer._prepare() == []
    assert tokenizer.count([Message("user", "another one")]) == tokenizer._whole(
        tokenizer.render([Message("user", "another one")])
    )


def test_hf_a_five_tier_sweep_encodes_each_message_once(hf_folder):
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
    tokenizer = HuggingFaceTokenizer(str(hf_folder))
    counter = PromptCounter(tokenizer)
    counter.estimate([Message(r, "") for r in ("system", "user", "assistant")])
    encoded: list[str] = []
    batch = tokenizer._batch
    tokenizer._batch = lambda texts: (encoded.extend(texts), batch(texts))[1]
    prompts = []
    for budget in [2048, 4096, 8192, 16384, 32768]:
        context = StrategyContext(
            item=item, budget=budget, counter=counter, complete=None, seed=0, scratch_dir=Path(".")
        )
        prompts.append(Truncation().apply(item.history, budget, context))
        assert counter.count(prompts[-1]) <= budget
    largest = tokenizer.render(prompts[-1])
    assert counter.count(prompts[-1]) == tokenizer._whole(largest)
    assert len(encoded) == len(set(encoded)), "a piece was encoded twice"
    assert sum(map(len, encoded)) <= 1.05 * len(largest), "messages were encoded again at a later tier"


@settings(max_examples=150, deadline=None)
@given(
    history=st.lists(
        st.tuples(
            st.sampled_from(["system", "user", "assistant"]),
            st.lists(
                st.one_of(
                    TEXTS, st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", " ", "\n\n", "12", "👋🏽", "<|im_end|>"])
                ),
                max_size=8,
            ).map("".join),
        ),
        max_size=8,
    )
)
def test_tiktoken_count_of_the_rendered_prompt_equals_its_count_of_the_messages(history):
    """``count_rendered(render(m)) == count(m)``: the markers one token each, special-token text
    in a content counted as text (as OpenAI counts a user's text)."""
    tokenizer = TiktokenTokenizer("cl100k_base")
    messages = [Message(role, content) for role, content in history if not tokenizer._MARKERS.search(content)]
    assert tokenizer.count_rendered(tokenizer.render(messages)) == tokenizer.count(messages)
    for _, content in history:
        assert tokenizer.count_text(content) == len(tokenizer.encoding.encode(content, disallowed_special=()))


def test_admit_counts_only_the_plain_prompt_canonical_prompt_built():
    """``admit`` skips the copy ``gate`` makes, so it takes nothing a plugin could still hold."""
    from budgetbench_core.gate import admit, gate
    from budgetbench_core.sandbox import canonical_prompt

    class Sub(Message):
        pass

    counter = PromptCounter(TiktokenTokenizer("cl100k_base"))
    messages = [Message("system", "s", {"session_id": "a"}), Message("user", "q?")]
    dropped: list[str] = []
    prompt = canonical_prompt(messages, dropped)
    via_gate, via_admit = gate(messages, 100, counter), admit(prompt, 100, counter, dropped)
    assert (via_admit.tokens, via_admit.chat_json, via_admit.prompt) == (
        via_gate.tokens,
        via_gate.chat_json,
        via_gate.prompt,
    )
    for wrong in (list(prompt), (Sub("user", "q?"),), ("q?",)):
        with pytest.raises(TypeError, match="use gate"):
            admit(wrong, 100, counter)  # type: ignore[arg-type]
