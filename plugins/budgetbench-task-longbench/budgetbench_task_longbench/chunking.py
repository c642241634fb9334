"""Fixed-size token chunks of a context, counted with tiktoken ``cl100k_base``.

The chunker is deliberately not the served model's tokenizer: chunk boundaries depend
only on the text and the chunk size, never on the model or the budget tier, so every
tier and every model sees the same retrievable units (the reference harness's defect 5).
Chunks are exact slices of the context: joined, they give the context back.
"""

from __future__ import annotations

from functools import lru_cache

from budgetbench_core import use_bundled_tiktoken_encodings

ENCODING = "cl100k_base"


@lru_cache(maxsize=1)
def encoding():
    use_bundled_tiktoken_encodings()
    import tiktoken

    try:
        return tiktoken.get_encoding(ENCODING)
    except Exception as exc:
        raise RuntimeError(
            f"tiktoken encoding {ENCODING} is not available offline ({exc}); set TIKTOKEN_CACHE_DIR to a folder "
            f"holding it (litellm ships one in litellm/litellm_core_utils/tokenizers)"
        ) from exc


def count_tokens(text: str) -> int:
    return len(encoding().encode(text, disallowed_special=()))


def chunk_text(text: str, chunk_tokens: int) -> tuple[list[str], int]:
    """``text`` cut every ``chunk_tokens`` tokens as exact character slices, and its token count.

    A cut that falls inside a multi-byte character (a token holding part of it) moves to
    the end of that character, so every chunk is valid text and the chunks join back to ``text``.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    tokens = encoding().encode(text, disallowed_special=())
    raw = text.encode("utf-8")
    chunks: list[str] = []
    start = position = 0
    for first in range(0, len(tokens), chunk_tokens):
        position += len(encoding().decode_bytes(tokens[first : first + chunk_tokens]))
        end = position
        while end < len(raw) and raw[end] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            end += 1
        if end > start:
            chunks.append(raw[start:end].decode("utf-8"))
            start = end
    return chunks, len(tokens)
