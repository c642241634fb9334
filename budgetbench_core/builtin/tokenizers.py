"""Built-in tokenizer specs: ``server``, ``tiktoken:``, ``hf:`` and ``gguf:``."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import httpx

from budgetbench_core import Message, Tokenizer, TokenizerInfo, hookimpl, use_bundled_tiktoken_encodings


class ServerTokenizer(Tokenizer):
    """Asks a llama.cpp server: ``/apply-template`` renders, ``/tokenize`` counts.

    Exact by construction: it is the served model's own template and vocabulary, and
    the same steps the server takes before it runs a chat completion.
    """

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self._http = httpx.Client(base_url=self.base_url, timeout=60.0)
        self.info = TokenizerInfo(id=f"server:{self.base_url}", backend="llama.cpp-server", exact=True)

    def _post(self, path: str, payload: dict) -> dict:
        response = self._http.post(path, json=payload)
        if response.status_code != 200:
            raise ValueError(f"{self.base_url}{path} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    def render(self, messages: Sequence[Message]) -> str:
        return self._post("/apply-template", {"messages": [m.to_chat() for m in messages]})["prompt"]

    def _tokens(self, text: str, add_special: bool) -> int:
        return len(self._post("/tokenize", {"content": text, "add_special": add_special, "parse_special": True})["tokens"])

    def count_text(self, text: str) -> int:
        return self._tokens(text, add_special=False)

    def count_rendered(self, prompt: str) -> int:
        return self._tokens(prompt, add_special=True)


class TiktokenTokenizer(Tokenizer):
    """OpenAI encodings with OpenAI's published chat overhead (3 per message, 3 for the reply).

    Approximate: OpenAI does not publish its chat template, so rows are labelled so.
    The count is a sum over messages, so each message's tokens are cached: encoding a
    32K-token prompt again for every tier would cost tens of milliseconds.
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
        self._cached_count = functools.lru_cache(maxsize=8192)(self._encoded_length)

    def render(self, messages: Sequence[Message]) -> str:
        return "".join(f"<|start|>{m.role}<|message|>{m.content}<|end|>" for m in messages) + "<|start|>assistant<|message|>"

    def _encoded_length(self, text: str) -> int:
        return len(self.encoding.encode(text, disallowed_special=()))

    def count_text(self, text: str) -> int:
        return self._cached_count(text)

    def count(self, messages: Sequence[Message]) -> int:
        return self.REPLY_PRIMING + sum(
            self.PER_MESSAGE + self.count_text(m.role) + self.count_text(m.content) for m in messages
        )


class HuggingFaceTokenizer(Tokenizer):
    """A transformers tokenizer with its chat template, from a local folder or a GGUF file."""

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
            raise ValueError(f"{kind} tokenizer {source!r}{' / ' + gguf_file if gguf_file else ''} could not be loaded: {exc}") from exc
        if not getattr(self._tok, "chat_template", None):
            raise ValueError(f"{kind} tokenizer {source!r} has no chat template, so prompts cannot be counted as served")
        ident = os.path.join(source, gguf_file) if gguf_file else source
        # transformers rebuilds a GGUF's tokenizer by conversion, and that can differ from
        # llama.cpp's own: 113,891 vs 113,583 tokens on a LongMemEval_S history. Only the
        # model's original tokenizer (hf:) is labelled exact.
        self.info = TokenizerInfo(id=f"{kind}:{ident}", backend=f"transformers-{kind}", exact=kind == "hf")

    def render(self, messages: Sequence[Message]) -> str:
        return self._tok.apply_chat_template([m.to_chat() for m in messages], tokenize=False, add_generation_prompt=True)

    def count_text(self, text: str) -> int:
        return len(self._tok(text, add_special_tokens=False)["input_ids"])


def server_tokenizer(argument: str, backend) -> ServerTokenizer:
    base = argument or getattr(backend, "server_url", None) or getattr(backend, "api_base", None)
    if not base:
        raise ValueError("the server tokenizer needs a llama.cpp server: use --api-base or server:http://host:port")
    return ServerTokenizer(base)


def gguf_tokenizer(argument: str, backend) -> HuggingFaceTokenizer:
    path = Path(argument)
    if not path.is_file():
        raise ValueError(f"gguf tokenizer: file not found: {argument}")
    return HuggingFaceTokenizer(str(path.parent), gguf_file=path.name)


@hookimpl
def register_tokenizers(register):
    register("server", server_tokenizer)
    register("tiktoken", lambda argument, backend: TiktokenTokenizer(argument))
    register("hf", lambda argument, backend: HuggingFaceTokenizer(argument))
    register("gguf", gguf_tokenizer)
