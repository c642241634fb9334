"""Built-in tokenizer specs: ``server``, ``tiktoken:``, ``hf:`` and ``gguf:``."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx

from budgetbench_core import (
    CountCache,
    Message,
    Tokenizer,
    TokenizerInfo,
    hookimpl,
    use_bundled_tiktoken_encodings,
)


def split_pieces(text: str, cuts: Sequence[Callable[[str], list[str]]]) -> tuple[list[str], int]:
    """The non-empty pieces of ``text`` between its special tokens, and how many were cut out.

    ``cuts`` split a piece at one special token each, applied in order (longest first, as
    llama.cpp and HF tokenizers cut a text).
    """
    pieces, found = [text], 0
    for cut in cuts:
        kept: list[str] = []
        for piece in pieces:
            parts = cut(piece)
            found += len(parts) - 1
            kept.extend(part for part in parts if part)
        pieces = kept
    return pieces, found


def _occurrences(text: str, specials: Sequence[str]) -> list[tuple[int, int]]:
    """Every (start, end) at which one of ``specials`` occurs in ``text``, overlaps included."""
    spans = []
    for special in specials:
        at = text.find(special)
        while at >= 0:
            spans.append((at, at + len(special)))
            at = text.find(special, at + 1)
    return spans


def content_frame(
    render: Callable[[Sequence[Message]], str],
    role: str,
    mark: str,
    boundaries: Callable[[str], list[tuple[int, int]]],
) -> tuple[str, str] | None:
    """The template text on either side of a ``role`` message's content, up to the nearest
    special-token ``boundaries`` (spans in the rendered text); None when ``mark`` does not
    occur exactly once in the rendered probe."""
    closing = Message("assistant" if role == "user" else "user", "q")
    rendered = render([Message(role, mark), closing])
    at = rendered.find(mark)
    if at < 0 or rendered.count(mark) != 1:
        return None
    end = at + len(mark)
    spans = boundaries(rendered)
    left = max((stop for start, stop in spans if stop <= at), default=0)
    right = min((start for start, stop in spans if start >= end), default=len(rendered))
    return rendered[left:at], rendered[end:right]


class GGUFVocabulary:
    """A GGUF model's BPE vocabulary in process (HF ``tokenizers``), for estimates only.

    Built for the pre-tokenisers whose llama.cpp rules it reproduces (``smollm``: digits
    one by one, then GPT-2's byte-level split). It agreed with the llama.cpp server on
    every one of the 27,733 LongMemEval_S messages; ``load`` checks it again on probe
    texts and gives up (None) when it disagrees or the libraries are missing, since the
    exact count of every prompt still comes from the server.
    """

    SUPPORTED = ("gpt2", "smollm")  # (tokenizer.ggml.model, tokenizer.ggml.pre)

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def load(cls, path: Path) -> GGUFVocabulary | None:
        try:
            from gguf import GGUFReader
            from tokenizers import AddedToken, Tokenizer as HFTokenizer, models, pre_tokenizers
        except ImportError:
            return None
        fields = GGUFReader(str(path)).fields
        kind = tuple(
            fields[k].contents() if k in fields else None for k in ("tokenizer.ggml.model", "tokenizer.ggml.pre")
        )
        if kind != cls.SUPPORTED:
            return None
        tokens = fields["tokenizer.ggml.tokens"].contents()
        types = fields["tokenizer.ggml.token_type"].contents()
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
        tokenizer = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
        # llama.cpp's special tokens: unknown, control and user-defined (token types 2, 3, 4)
        tokenizer.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types) if kind in (2, 3, 4)]
        )
        return cls(tokenizer)

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


class ServerTokenizer(Tokenizer):
    """Asks a llama.cpp server: ``/apply-template`` renders, ``/tokenize`` counts.

    Exact by construction: it is the served model's own template and vocabulary, and
    the same steps the server takes before it runs a chat completion.

    llama.cpp first cuts a prompt at its special tokens and then tokenises each piece of
    text between them on its own. Counting works the same way: the pieces of a rendered
    prompt are counted once each (cached, and the pieces not yet seen go to the server in
    one batched request), so a history's messages are tokenised once per run rather than
    once per budget tier. Whether the server really behaves so is checked once on probe
    texts (whitespace around special tokens, which some vocabularies strip); if it does
    not, every count sends the whole text, as before.
    """

    _MARK = "budgetbench-probe-7f3a"
    _PIECE_CACHE_SIZE = 1 << 18
    _PARALLEL_CHARS = 40_000

    def __init__(self, base_url: str, model_file: Path | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self._http = httpx.Client(base_url=self.base_url, timeout=60.0)
        # The embedded server listens on a port chosen per run: its model file names it, so rows of
        # identical runs are identical; a server named by URL is named by its URL.
        ident = f"embedded:{model_file.name}" if model_file is not None else self.base_url
        self.info = TokenizerInfo(id=f"server:{ident}", backend="llama.cpp-server", exact=True)
        self._lock = threading.Lock()
        self._prepare_lock = threading.Lock()
        self._pieces = CountCache(size=self._PIECE_CACHE_SIZE)
        self._specials: list[str] | None = None  # longest first; [] = count whole texts
        self._separator: int | None = None
        self._bos = 0
        self._frames: dict[str, tuple[str, str] | None] = {}
        self._model_file = model_file
        self._vocabulary: GGUFVocabulary | None = None
        self._pool: ThreadPoolExecutor | None = None

    def _post(self, path: str, payload: dict) -> dict:
        response = self._http.post(path, json=payload)
        if response.status_code != 200:
            raise ValueError(f"{self.base_url}{path} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    def render(self, messages: Sequence[Message]) -> str:
        return self._post("/apply-template", {"messages": [m.to_chat() for m in messages]})["prompt"]

    def render_with_tools(self, messages: Sequence[Message], tools: str) -> str:
        """The server's own rendering of a request with ``tools``, as its chat completion renders it."""
        body = {"messages": [m.to_chat() for m in messages], "tools": json.loads(tools)}
        return self._post("/apply-template", body)["prompt"]

    def _tokenize(self, content, add_special: bool = False) -> list:
        return self._post("/tokenize", {"content": content, "add_special": add_special, "parse_special": True})[
            "tokens"
        ]

    # ------------------------------------------------------------ piece-wise counting

    def _count_pieces(self, pieces: list[str]) -> int:
        return sum(self._pieces.count_all(pieces, self._count_new))

    def _count_new(self, pieces: list[str]) -> list[int]:
        """Counts of ``pieces``; a large batch is split in two concurrent requests, since
        the server tokenises each request on one thread."""
        total = sum(map(len, pieces))
        if len(pieces) < 2 or total < self._PARALLEL_CHARS:
            return self._count_batch(pieces)
        half, run = 0, 0
        while run < total / 2:
            run += len(pieces[half])
            half += 1
        half = min(half, len(pieces) - 1)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="server-tokenizer")
        second = self._pool.submit(self._count_batch, pieces[half:])
        return self._count_batch(pieces[:half]) + second.result()

    def _count_batch(self, pieces: list[str]) -> list[int]:
        """One /tokenize request for all ``pieces``, separated by a special token's id.

        The server tokenises each string of a mixed array on its own; the pieces hold no
        special token, so the separators mark where each piece's tokens end.
        """
        if len(pieces) == 1:
            return [len(self._tokenize(pieces[0]))]
        content: list = []
        for piece in pieces:
            content += [piece, self._separator]
        counts, run = [], 0
        for token in self._tokenize(content):
            if token == self._separator:
                counts.append(run)
                run = 0
            else:
                run += 1
        if len(counts) != len(pieces) or run:
            return [len(self._tokenize(p)) for p in pieces]
        return counts

    def _prepare(self) -> None:
        """Learn the template's special tokens and check that piece-wise counts are exact."""
        with self._prepare_lock:
            if self._specials is not None:
                return
            probe = self.render(
                [Message("system", "s"), Message("user", self._MARK), Message("assistant", "a"), Message("user", "q")]
            )
            tokens = self._post(
                "/tokenize", {"content": probe, "add_special": False, "parse_special": True, "with_pieces": True}
            )["tokens"]
            found: dict[str, int] = {}
            for token in tokens:
                piece = token.get("piece")
                if not isinstance(piece, str) or not piece or piece in found:
                    continue
                as_special = self._tokenize(piece)
                as_text = self._post("/tokenize", {"content": piece, "add_special": False, "parse_special": False})
                if as_special == [token["id"]] and as_text["tokens"] != as_special:
                    found[piece] = token["id"]  # a whole token only when special tokens are parsed
            specials = sorted(found, key=len, reverse=True)
            self._bos = len(self._tokenize("", add_special=True))
            self._separator = found[specials[-1]] if specials else None
            samples = [
                probe,
                "12345 67\n\n",
                "naïve café 👋🏽",
                *(f"{w}{s}{w}x{w}{s}{s}{w}" for s in specials for w in ("", " ", "\n", " \n\t ")),
            ]
            exact = bool(specials) and all(len(self._tokenize(t)) == self._split_count(t, specials) for t in samples)
            exact = exact and len(self._tokenize(probe, add_special=True)) == self._bos + self._split_count(
                probe, specials
            )
            if exact and self._model_file is not None:
                vocabulary = GGUFVocabulary.load(self._model_file)
                if vocabulary and all(vocabulary.count(t) == len(self._tokenize(t)) for t in samples):
                    self._vocabulary = vocabulary
            self._specials = specials if exact else []

    def _split_count(self, text: str, specials: list[str]) -> int:
        pieces, found = split_pieces(text, [partial(str.split, sep=special) for special in specials])
        return found + self._count_pieces(pieces)

    def count_text(self, text: str) -> int:
        self._prepare()
        if not self._specials:
            return len(self._tokenize(text))
        return self._split_count(text, self._specials)

    def count_rendered(self, prompt: str) -> int:
        self._prepare()
        if not self._specials:
            return len(self._tokenize(prompt, add_special=True))
        return self._bos + self._split_count(prompt, self._specials)

    def _frame(self, role: str) -> tuple[str, str] | None:
        """The template text on either side of a ``role`` message's content, up to the
        nearest special tokens: the piece the content is tokenised in."""
        if role not in self._frames:
            specials = self._specials or []
            self._frames[role] = content_frame(self.render, role, self._MARK, lambda text: _occurrences(text, specials))
        return self._frames[role]

    def count_in_message(self, role: str, content: str) -> int:
        """Tokens of ``content`` inside a ``role`` message: the piece it sits in (role
        header included), which is also the piece an exact count of a prompt looks up.

        With the model file at hand the estimate is made in process (one request per
        message would cost more than the tokenising); otherwise the server counts it and
        the exact count of a prompt then finds its pieces cached.
        """
        self._prepare()
        specials = self._specials
        frame = self._frame(role) if specials else None
        if frame is None or not specials:
            return self.count_text(content)
        piece = frame[0] + content + frame[1]
        if self._vocabulary is not None:
            counted = self._pieces.get(piece)  # the server's own count, when a prompt held the piece already
            return counted if counted is not None else self._vocabulary.count(piece)
        return self._split_count(piece, specials)


class TiktokenTokenizer(Tokenizer):
    """OpenAI encodings with OpenAI's published chat overhead (3 per message, 3 for the reply).

    Approximate: OpenAI does not publish its chat template, so rows are labelled so.
    The count is a sum over messages, so each message's tokens are cached for the whole
    run (``CountCache``, not a small LRU: at 128 cells in flight the prompts of 128 items
    would not fit one): encoding a 32K-token prompt again for every tier would cost tens
    of milliseconds.
    """

    PER_MESSAGE = 3
    REPLY_PRIMING = 3

    def __init__(self, encoding: str) -> None:
        use_bundled_tiktoken_encodings()
        import tiktoken

        try:
            self.encoding = tiktoken.get_encoding(encoding or "cl100k_base")
        except Exception as exc:
            raise ValueError(
                f"tiktoken encoding {encoding!r} is not available offline ({exc}); "
                f"set TIKTOKEN_CACHE_DIR to a folder holding it"
            ) from exc
        self.info = TokenizerInfo(id=f"tiktoken:{self.encoding.name}", backend="tiktoken", exact=False)
        self._counts = CountCache()

    def render(self, messages: Sequence[Message]) -> str:
        return (
            "".join(f"<|start|>{m.role}<|message|>{m.content}<|end|>" for m in messages)
            + "<|start|>assistant<|message|>"
        )

    def _encoded_length(self, text: str) -> int:
        # special-token text counted as text: encode(text, disallowed_special=()), ~5% faster
        return len(self.encoding.encode_ordinary(text))

    def count_text(self, text: str) -> int:
        return self._counts.count(text, self._encoded_length)

    def count(self, messages: Sequence[Message]) -> int:
        return self.REPLY_PRIMING + sum(
            self.PER_MESSAGE + self.count_text(m.role) + self.count_text(m.content) for m in messages
        )

    _MARKERS = re.compile(r"<\|start\|>|<\|message\|>|<\|end\|>")

    def count_rendered(self, prompt: str) -> int:
        """A prompt ``render`` made: one token per marker, the text between them as text, so
        that it equals ``count`` of the messages (unless a content holds a marker's text)."""
        parts = self._MARKERS.split(prompt)
        return len(parts) - 1 + sum(self.count_text(p) for p in parts if p)


def _alternation(tokens: Sequence[str]) -> re.Pattern[str] | None:
    """A pattern matching ``tokens`` leftmost-longest (the longest alternative first, as the
    matcher of HF ``tokenizers`` does), or None for no tokens."""
    ordered = sorted(set(t for t in tokens if t), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None


def _has_setting(config, key: str, value) -> bool:
    """Whether a tokenizer.json section (nested dicts and lists) sets ``key`` to ``value``."""
    if isinstance(config, dict):
        return config.get(key) == value or any(_has_setting(v, key, value) for v in config.values())
    if isinstance(config, list):
        return any(_has_setting(v, key, value) for v in config)
    return False


class HuggingFaceTokenizer(Tokenizer):
    """A transformers tokenizer with its chat template, from a local folder or a GGUF file.

    HF ``tokenizers`` first cuts a text at its added tokens (special tokens on the raw text,
    then the others on the normalised pieces) and encodes each piece between them on its
    own. Where that makes a piece-wise count equal the whole count, a rendered prompt is
    counted as its added tokens plus the cached counts of its pieces, so each message is
    encoded once per run rather than once per prompt. That needs a fast tokenizer whose
    added tokens take no whitespace from their neighbours (``lstrip``/``rstrip``) and match
    anywhere (not ``single_word``), whose normalised added tokens meet no normaliser, and
    whose pre-tokeniser treats no piece differently (Metaspace ``prepend_scheme: first``
    does); probe texts must then agree, and the first real prompts are counted both ways.
    Otherwise, or after any disagreement (a warning says so), it counts whole texts.
    """

    _MARK = "budgetbench-probe-7f3a"
    _CHECKED_PROMPTS = 8  # the first rendered prompts are also counted whole, and compared
    _PROBED_TOKENS = 64

    def __init__(self, source: str, gguf_file: str | None = None) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise ValueError("hf: and gguf: tokenizers need transformers: pip install transformers") from exc
        kind = "gguf" if gguf_file else "hf"
        try:
            if gguf_file:
                self._tok = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
            else:
                self._tok = AutoTokenizer.from_pretrained(source)
        except Exception as exc:
            raise ValueError(
                f"{kind} tokenizer {source!r}{' / ' + gguf_file if gguf_file else ''} could not be loaded: {exc}"
            ) from exc
        if not getattr(self._tok, "chat_template", None):
            raise ValueError(
                f"{kind} tokenizer {source!r} has no chat template, so prompts cannot be counted as served"
            )
        ident = os.path.join(source, gguf_file) if gguf_file else source
        # transformers rebuilds a GGUF's tokenizer by conversion, and that can differ from
        # llama.cpp's own: 113,891 vs 113,583 tokens on a LongMemEval_S history. Only the
        # model's original tokenizer (hf:) is labelled exact.
        self.info = TokenizerInfo(id=f"{kind}:{ident}", backend=f"transformers-{kind}", exact=kind == "hf")
        self._pieces = CountCache()
        self._prepare_lock = threading.Lock()
        self._lock = threading.Lock()
        self._patterns: list[re.Pattern[str]] | None = None  # [] = count whole texts
        self._checks_left = self._CHECKED_PROMPTS
        self._frames: dict[str, tuple[str, str] | None] = {}

    def render(self, messages: Sequence[Message]) -> str:
        return str(
            self._tok.apply_chat_template([m.to_chat() for m in messages], tokenize=False, add_generation_prompt=True)
        )  # a str with tokenize=False

    def render_with_tools(self, messages: Sequence[Message], tools: str) -> str:
        """The model's template with ``tools`` (exact where the server renders the same template)."""
        return str(
            self._tok.apply_chat_template(
                [m.to_chat() for m in messages], tools=json.loads(tools), tokenize=False, add_generation_prompt=True
            )
        )

    def _whole(self, text: str) -> int:
        return len(self._tok(text, add_special_tokens=False)["input_ids"])

    def _batch(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self._tok(texts, add_special_tokens=False)["input_ids"]]

    # ------------------------------------------------------------ piece-wise counting

    def _piecewise(self, text: str, patterns: list[re.Pattern[str]]) -> int:
        pieces, found = split_pieces(text, [pattern.split for pattern in patterns])
        return found + sum(self._pieces.count_all(pieces, self._batch))

    def _cut_patterns(self) -> list[re.Pattern[str]]:
        """The patterns that cut a text as this tokenizer does, or [] when a piece-wise count
        could differ from the whole count."""
        backend = getattr(self._tok, "backend_tokenizer", None)
        if backend is None or getattr(self._tok, "split_special_tokens", False):
            return []
        if getattr(backend, "encode_special_tokens", False):
            return []
        config = json.loads(backend.to_str())
        added = [t for t in config.get("added_tokens") or [] if t.get("content")]
        if not added or any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added):
            return []
        raw = [t["content"] for t in added if not t.get("normalized")]
        normalised = [t["content"] for t in added if t.get("normalized")]
        if normalised and config.get("normalizer") is not None:
            return []
        if _has_setting(config.get("pre_tokenizer"), "prepend_scheme", "first"):
            return []
        patterns = [p for p in (_alternation(raw), _alternation(normalised)) if p is not None]
        probe = self.render(
            [Message("system", "s"), Message("user", self._MARK), Message("assistant", "a"), Message("user", "q")]
        )
        tokens = sorted({t["content"] for t in added}, key=lambda t: (t not in probe, t))[: self._PROBED_TOKENS]
        samples = [
            probe,
            "12345 67\n\n",
            "naïve café 👋🏽",
            *(f"{w}{t}{w}x{w}{t}{t}{w}" for t in tokens for w in ("", " ", "\n", " \n\t ")),
        ]
        if all(self._whole(t) == self._piecewise(t, patterns) for t in samples):
            return patterns
        return []

    def _prepare(self) -> list[re.Pattern[str]]:
        with self._prepare_lock:
            if self._patterns is None:
                self._patterns = self._cut_patterns()
            return self._patterns

    def _give_up(self, text: str, piecewise: int, whole: int) -> None:
        import warnings

        with self._prepare_lock:
            self._patterns = []
        warnings.warn(
            f"{self.info.id}: a piece-wise count ({piecewise}) differed from the whole count ({whole}) "
            f"of a {len(text)}-character text; whole texts are counted from now on",
            RuntimeWarning,
            stacklevel=3,
        )

    def count_text(self, text: str) -> int:
        patterns = self._prepare()
        if not patterns:
            return self._whole(text)
        return self._piecewise(text, patterns)

    def count_rendered(self, prompt: str) -> int:
        patterns = self._prepare()
        if not patterns:
            return self._whole(prompt)
        tokens = self._piecewise(prompt, patterns)
        with self._lock:
            check, self._checks_left = self._checks_left > 0, self._checks_left - 1
        if check:
            whole = self._whole(prompt)
            if whole != tokens:
                self._give_up(prompt, tokens, whole)
                return whole
        return tokens

    def _frame(self, role: str, patterns: list[re.Pattern[str]]) -> tuple[str, str] | None:
        """The template text on either side of a ``role`` message's content, up to the
        nearest added tokens: the piece the content is encoded in."""
        if role not in self._frames:
            self._frames[role] = content_frame(
                self.render, role, self._MARK, lambda text: [m.span() for p in patterns for m in p.finditer(text)]
            )
        return self._frames[role]

    def count_in_message(self, role: str, content: str) -> int:
        """Tokens of ``content`` inside a ``role`` message for estimates: the piece it sits
        in (role header included), the piece an exact count of a prompt looks up."""
        patterns = self._prepare()
        frame = self._frame(role, patterns) if patterns else None
        if frame is None:
            return self.count_text(content)
        return self._piecewise(frame[0] + content + frame[1], patterns)


# The first line of each factory's docstring is what `list-plugins` and `describe` show: the spec
# form and what its argument means.


def server_tokenizer(argument: str, backend) -> ServerTokenizer:
    """server[:URL]: asks a llama.cpp server to render and count (exact for its model); URL defaults to --api-base or the embedded server."""
    base = argument or getattr(backend, "server_url", None) or getattr(backend, "api_base", None)
    if not base:
        raise ValueError("the server tokenizer needs a llama.cpp server: use --api-base or server:http://host:port")
    # The embedded server's model file gives in-process estimates; a server named by URL may serve another model.
    model_file = getattr(backend, "model_path", None) if not argument else None
    return ServerTokenizer(base, model_file=model_file)


def gguf_tokenizer(argument: str, backend) -> HuggingFaceTokenizer:
    """gguf:FILE: transformers' reading of a local .gguf file's vocabulary and template; approximate (server is exact)."""
    path = Path(argument)
    if not path.is_file():
        raise ValueError(f"gguf tokenizer: file not found: {argument}")
    return HuggingFaceTokenizer(str(path.parent), gguf_file=path.name)


def tiktoken_tokenizer(argument: str, backend) -> TiktokenTokenizer:
    """tiktoken:ENCODING: an OpenAI encoding (cl100k_base, o200k_base, ...) plus OpenAI's published chat overhead; approximate."""
    return TiktokenTokenizer(argument)


def hf_tokenizer(argument: str, backend) -> HuggingFaceTokenizer:
    """hf:MODEL: a transformers tokenizer and its chat template, from a Hugging Face model name or a local folder."""
    return HuggingFaceTokenizer(argument)


@hookimpl
def register_tokenizers(register):
    register("server", server_tokenizer)
    register("tiktoken", tiktoken_tokenizer)
    register("hf", hf_tokenizer)
    register("gguf", gguf_tokenizer)
