"""The ``llmlingua2`` strategy: LLMLingua-2 token-classification compression of the history.

LLMLingua-2 keeps the words its classifier rates most worth keeping, at a requested
rate. It counts tokens with its own tokenizer (tiktoken cl100k), not the served model's,
so the harness re-counts every compressed prompt exactly and, when it is still over
the budget, compresses again at a lower rate, for at most ``max_tries`` attempts; only
then is the over-budget prompt returned (the runner records it as a violation).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

from budgetbench_core import MemoryStrategy, Message, Regime, StrategyContext, hookimpl, use_bundled_tiktoken_encodings

DEFAULT_MODEL = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
# llmlingua 0.2.2 picks its word-merging rules by these substrings of the model name.
SUPPORTED_FAMILIES = ("bert-base-multilingual-cased", "xlm-roberta-large")
HEADER = "Compressed conversation history (LLMLingua-2: low-information words were removed):"
# llmlingua2 turns rate r into a percentile int(100 * (1 - r) + 1); r <= 0 would ask for 101.
MIN_RATE = 0.001
SHRINK = 0.9


class _CachedClassifier:
    """The classifier's output for a chunk does not depend on the rate, so tiers and retries reuse it."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.outputs: dict[str, Any] = {}

    def __call__(self, input_ids, attention_mask):
        key = hashlib.blake2b(
            input_ids.cpu().numpy().tobytes() + attention_mask.cpu().numpy().tobytes(), digest_size=16
        ).hexdigest()
        if key not in self.outputs:
            self.outputs[key] = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return self.outputs[key]


def session_texts(history: Sequence[Message], context: StrategyContext) -> list[str]:
    """One plain-text transcript per session, dated when the task gives dates."""
    sessions = dataclasses.replace(context.item, history=tuple(history)).sessions()
    texts = []
    for number, session in enumerate(sessions, 1):
        title = f"Session {number}" + (f" ({session.date})" if session.date else "") + ":"
        texts.append("\n".join([title, *(f"{m.role}: {m.content}" for m in session.messages)]))
    return texts


class LLMLingua2(MemoryStrategy):
    """Params: ``model`` (name or local folder), ``device`` (cpu), ``max_tries`` (4),
    ``headroom`` (share of the room the first attempt aims at, 0.9), ``force_tokens``
    (kept at any rate, default none), ``context_level_filter`` (drop whole sessions first)."""

    name = "llmlingua2"
    regime = Regime.AUXILIARY_MODEL
    description = "LLMLingua-2 compression of the history toward the budget, re-counted exactly."

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        device: str = "cpu",
        max_tries: int = 4,
        headroom: float = 0.9,
        force_tokens: Sequence[str] = (),
        context_level_filter: bool = False,
        **params: Any,
    ) -> None:
        super().__init__(
            model=model,
            device=device,
            max_tries=max_tries,
            headroom=headroom,
            force_tokens=list(force_tokens),
            context_level_filter=context_level_filter,
            **params,
        )
        if not any(family in str(model) for family in SUPPORTED_FAMILIES):
            raise ValueError(
                f"llmlingua2 model {model!r}: llmlingua 0.2.2 only handles models whose name or folder contains "
                f"one of {SUPPORTED_FAMILIES} (it chooses its word-merging rules by that name)"
            )
        if int(max_tries) < 1 or not 0 < float(headroom):
            raise ValueError(f"llmlingua2: max_tries must be >= 1 and headroom > 0, got {max_tries}, {headroom}")
        self.model_name = str(model)
        self.device = device
        self.max_tries = int(max_tries)
        self.headroom = float(headroom)
        self.force_tokens = list(force_tokens)
        self.context_level_filter = bool(context_level_filter)
        self._compressor: Any = None
        self._classifier: _CachedClassifier | None = None
        self._item_id: str | None = None

    def read_paths(self) -> list[str]:
        """A local model folder given as ``model`` is read in the confined worker."""
        return [self.model_name] if os.path.isdir(self.model_name) else []

    def _load(self) -> Any:
        if self._compressor is None:
            use_bundled_tiktoken_encodings()
            from llmlingua import PromptCompressor

            try:
                compressor = PromptCompressor(model_name=self.model_name, use_llmlingua2=True, device_map=self.device)
            except Exception as exc:
                raise RuntimeError(
                    f"llmlingua2 could not load model {self.model_name!r} on {self.device!r}: {type(exc).__name__}: {exc}. "
                    f"Pass a local folder with --strategy-param llmlingua2.model=<path> when the hub is unreachable."
                ) from exc
            self._classifier = _CachedClassifier(compressor.model)
            compressor.model = self._classifier
            self._compressor = compressor
        return self._compressor

    def reset(self) -> None:
        if self._classifier is not None:
            self._classifier.outputs.clear()
        self._item_id = None

    def apply(self, history, budget, context):
        full = context.frame(list(history))
        if not history or (context.counter.estimate(full) <= budget and context.counter.count(full) <= budget):
            context.audit["llmlingua2"] = {
                "compressed": False,
                "reason": "the whole history fits" if history else "there is no history",
            }
            return full
        if self._item_id != context.item.id:
            self.reset()
            self._item_id = context.item.id

        def frame(text: str) -> list[Message]:
            return context.frame([Message("user", f"{HEADER}\n{text}", {"source_id": "llmlingua2"})])

        texts = session_texts(history, context)
        original = context.counter.content_tokens("\n\n".join(texts))
        fixed = context.counter.count(frame(""))
        room = budget - fixed
        audit: dict[str, Any] = {
            "compressed": True,
            "model": self.model_name,
            "original_tokens": original,
            "room_tokens": room,
            "attempts": [],
        }
        context.audit["llmlingua2"] = audit
        if room <= 0:
            audit["reason"] = "system prompt, header and query alone fill the budget"
            return frame("")
        compressor = self._load()
        rate = max(MIN_RATE, min(1.0, self.headroom * room / original))
        prompt = frame("")
        for _ in range(self.max_tries):
            started = time.perf_counter()
            result = compressor.compress_prompt(
                texts, rate=rate, force_tokens=self.force_tokens, use_context_level_filter=self.context_level_filter
            )
            seconds = time.perf_counter() - started
            prompt = frame(result["compressed_prompt"])
            exact = context.counter.count(prompt)
            used = exact - fixed
            audit["attempts"].append(
                {
                    "rate": rate,
                    "seconds": seconds,
                    "prompt_tokens": exact,
                    "history_tokens": used,
                    "compressor_origin_tokens": result["origin_tokens"],
                    "compressor_compressed_tokens": result["compressed_tokens"],
                    "compressor_ratio": result["ratio"],
                }
            )
            if exact <= budget or rate <= MIN_RATE:  # fits, or no lower rate left to try
                break
            rate = max(MIN_RATE, rate * min(1.0, room / max(used, 1)) * SHRINK)
        audit.update(
            {
                "prompt_tokens": exact,
                "within_budget": exact <= budget,
                "compression_ratio": original / max(used, 1),
                "compression_s": sum(a["seconds"] for a in audit["attempts"]),
            }
        )
        return prompt


@hookimpl
def register_strategies(register):
    register(LLMLingua2)
