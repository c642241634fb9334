"""Agent episodes, the contract: a loop of model calls for one item, every call under the cell's budget.

An :class:`EpisodicTask` turns an item into an :class:`Episode`; the loop itself is the
engine's (``engine/episode_loop.py``). For each turn the harness
builds the turn's item (the episode's system prompt, the history so far, and the newest
message as the query), asks the strategy for the prompt, and gates, audits and sends it
with the same ``build_prompt`` and ``send`` (``engine/pipeline.py``) as a single-call cell: one
``prompt_audit`` per call (its ``call`` field is the turn index) and the served-count check
per call. The episode turns each reply into a :class:`Step` (the reply and what answered
it: a tool result, the user's next message), until it says it is done or ``max_turns`` is
reached.

The terminal row carries ``episode``: ``{reward, end_reason, turns, calls,
total_prompt_tokens, peak_prompt_tokens, tool_errors, served_counts_match, user_calls,
user_prompt_tokens, user_completion_tokens, outcome}``. ``end_reason`` is ``done``,
``max_turns``, ``violation`` (a call whose prompt did not fit: the episode stops there,
reward 0) or ``error``. Each turn is also written to ``episodes.jsonl`` (the reply, the
step, and the simulated user's calls, whose tokens are logged there and never budgeted).

Tool calls and their results are marked in message metadata (``exchange`` and
``exchange_part``: ``call`` or ``result``); an exchange is its call and every result after it
(a native call message with several tool calls has one ``tool`` message per call, as the
OpenAI chat form has it). A strategy must keep them together:
:func:`keep_exchanges` repairs a selection, and the runner refuses (error row) a prompt
that separates a result from its call. A marked message must be one the episode produced
(same role, text and mark): a tool call or result the strategy made up is a violation of
phase ``fabricated_tool_result`` (reward 0).

Native tool calls: an episode whose ``tools`` is set (tool schemas in OpenAI format) has them
sent with every agent call (``GenerationParams.tools``); the calls' counter renders them in
(``PromptCounter.with_tools``), so the strategy, the gate and the served-count audit all count
the tool block as the served template renders it. The episode may then put the calls in the
history as the chat form has them: an assistant message whose ``metadata["tool_calls"]`` is the
JSON text of its ``tool_calls`` array, and ``tool`` messages with ``metadata["tool_call_id"]``
(``Message.to_chat`` sends both, and every count renders them). Its ``step`` is then given the reply's
structured tool calls too: ``step(reply, tool_calls)``. A task that sets ``tools`` says so with
``EpisodicTask.native_tools()``, and a run on a backend without ``native_tools`` is refused.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .backends import GenerationParams
from .messages import TOOL_CALLS, Item, Message
from .sandbox import canonical_prompt
from .tasks import Task
from .tokenizers import PromptCounter

if TYPE_CHECKING:  # the channels are given one; a plugin worker importing this module needs no model client
    from .model_calls import ModelCaller

EXCHANGE = "exchange"
PART = "exchange_part"
EPISODE_LOG = "episodes.jsonl"


def exchange_of(message: Message) -> tuple[str, str] | None:
    """``(exchange id, "call" | "result")`` when ``message`` is one half of a tool exchange."""
    exchange, part = message.metadata.get(EXCHANGE), message.metadata.get(PART)
    return (str(exchange), str(part)) if exchange is not None and part in ("call", "result") else None


def keep_exchanges(kept: Sequence[Message], history: Sequence[Message], query: Message) -> list[Message]:
    """``kept`` (a selection of ``history``, in order) with no partial exchange. An exchange is
    its call followed by all its results (one per tool call of a native call message), in the
    history's order; a call, or results, without the rest of their exchange right beside them
    are dropped. When the query is a tool result, the rest of its exchange (the newest history
    messages) is kept right before it, even if that no longer fits (the runner then records a
    violation, never a split)."""
    sizes: dict[str, int] = {}
    for message in history:
        mark = exchange_of(message)
        if mark:
            sizes[mark[0]] = sizes.get(mark[0], 0) + 1
    kept = list(kept)
    out: list[Message] = []
    index = 0
    while index < len(kept):
        mark = exchange_of(kept[index])
        if not mark:
            out.append(kept[index])
            index += 1
            continue
        end = index + 1
        if mark[1] == "call":
            while end < len(kept) and exchange_of(kept[end]) == (mark[0], "result"):
                end += 1
            if end - index == sizes.get(mark[0], 0) and end - index > 1:
                out.extend(kept[index:end])
        index = end  # a result without its call right before it is dropped
    wanted = exchange_of(query)
    if wanted and wanted[1] == "result":
        tail = [m for m in history if (exchange_of(m) or ("", ""))[0] == wanted[0]]
        if tail and (len(out) < len(tail) or any(a is not b for a, b in zip(out[-len(tail) :], tail, strict=True))):
            out = [m for m in out if (exchange_of(m) or ("", ""))[0] != wanted[0]] + tail
    return out


def split_exchange(prompt: Sequence[Message]) -> str | None:
    """Why ``prompt`` separates a tool call from its results, or None when it does not: every
    result follows its call or another result of the same exchange, and every call is followed
    by a result. (A native call message's results are also checked against its calls' count.)"""
    for index, message in enumerate(prompt):
        mark = exchange_of(message)
        if not mark:
            continue
        before = exchange_of(prompt[index - 1]) if index else None
        if mark[1] == "result" and before not in ((mark[0], "call"), (mark[0], "result")):
            return f"message {index} is the result of tool call {mark[0]!r} without the call right before it"
        if mark[1] == "call":
            results = 0
            while index + 1 + results < len(prompt) and exchange_of(prompt[index + 1 + results]) == (
                mark[0],
                "result",
            ):
                results += 1
            if not results:
                return f"message {index} is tool call {mark[0]!r} without its result right after it"
            calls = native_calls(message)
            if calls and len(calls) != results:
                return f"message {index} makes {len(calls)} tool calls in exchange {mark[0]!r} but {results} results follow it"
    return None


def native_calls(message: Message) -> list[Any]:
    """The native tool calls an assistant message carries (``metadata["tool_calls"]``), or []."""
    text = message.metadata.get(TOOL_CALLS) if message.role == "assistant" else None
    if not isinstance(text, str) or not text:
        return []
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return []
    return calls if isinstance(calls, list) else []


@dataclass(frozen=True)
class Step:
    """What one agent reply led to. ``messages`` are appended to the history, the agent's
    reply first (as an assistant message) and then what answered it; the last one is the
    next turn's query. ``record`` is written to the turn log."""

    messages: tuple[Message, ...]
    done: bool = False
    tool_error: bool = False
    record: dict[str, Any] = field(default_factory=dict)


class UserChannel:
    """Model calls of a simulated user: through the harness's caller (temperature 0), counted
    and logged in ``episodes.jsonl``, never budgeted. ``limit`` is the largest prompt the
    served context holds; a longer prompt raises ``ValueError`` without a call."""

    def __init__(self, counter: PromptCounter, caller: ModelCaller, seed: int, limit: int) -> None:
        self._counter = counter
        self._caller = caller
        self._seed = seed
        self.limit = limit
        self.calls: list[dict[str, Any]] = []

    def count(self, messages: Sequence[Message]) -> int:
        return self._counter.count(canonical_prompt(list(messages)))

    def complete(self, messages: Sequence[Message], max_tokens: int) -> str:
        prompt = canonical_prompt(list(messages))
        tokens = self._counter.count(prompt)
        if tokens > self.limit:
            raise ValueError(
                f"user simulator prompt has {tokens} tokens, more than the served context holds ({self.limit})"
            )
        outcome = self._caller.call(prompt, GenerationParams(int(max_tokens), 0.0, self._seed))
        completion = outcome.completion
        self.calls.append(
            {
                "prompt_tokens": tokens,
                "served_prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "latency_s": completion.latency_s,
                "cached": outcome.cached,
                "completion": completion.text,
            }
        )
        return completion.text


class JudgeChannel(UserChannel):
    """The run's judge (``--judge-model``) for :meth:`Episode.judged`: like :class:`UserChannel`
    (temperature 0, counted with the run's tokenizer, each call kept in ``calls``, never
    budgeted), but through the judge's caller; ``model`` names it."""

    def __init__(self, counter: PromptCounter, caller: ModelCaller, seed: int, limit: int, model: str) -> None:
        super().__init__(counter, caller, seed, limit)
        self.model = model


class Episode:
    """One item's episode. ``system`` heads every prompt; ``opening()`` is the history before
    the agent's first turn (its last message is the first query)."""

    system: Message | None = None
    tools: list[dict[str, Any]] | None = None  # tool schemas sent natively with every agent call

    @abstractmethod
    def opening(self) -> list[Message]:
        """The messages before the first agent call (at least one)."""

    @abstractmethod
    def step(self, reply: str, tool_calls: list[dict[str, Any]] | None = None) -> Step:
        """The agent replied ``reply``: act on it and say what follows. ``tool_calls`` is given
        only to an episode with ``tools``: the reply's tool calls, each ``{"id", "name",
        "arguments"}`` (arguments as the JSON text the model wrote); an episode without tools
        may define ``step(self, reply)``."""

    @abstractmethod
    def outcome(self, end_reason: str) -> dict[str, Any]:
        """The grade once the episode ended (``reward`` in [0, 1] plus any detail); called for
        ``done`` and ``max_turns``, never after a violation or error (those score 0)."""

    def judged(self, outcome: dict[str, Any], judge: JudgeChannel) -> dict[str, Any]:
        """Figures from the run's judge, apart from the reward: called after ``outcome`` only
        when the run has ``--judge-model``; the keys returned are added to the outcome (never
        ``reward``). Default: none."""
        return {}


class EpisodicTask(Task):
    """A task whose items are episodes. ``max_turns`` bounds the agent calls of one episode and
    ``episode_timeout_s`` its wall time (task options ``max_turns`` and ``episode_timeout_s``
    override them); grading is the episode's ``outcome``, not a grader."""

    max_turns: ClassVar[int] = 30
    episode_timeout_s: ClassVar[float] = 3600.0
    outcome_version: ClassVar[str] = "1"

    @abstractmethod
    def episode(self, item: Item, user: UserChannel) -> Episode:
        """A fresh episode for ``item`` (a fresh environment: nothing carries over)."""

    def native_tools(self) -> bool:
        """Whether this task's episodes send tool schemas natively (``Episode.tools``): the run
        is then refused before any cell on a backend without ``Backend.native_tools``."""
        return False

    def turn_limit(self) -> int:
        return int(self.options.get("max_turns") or self.max_turns)

    def time_limit(self) -> float:
        """Seconds one episode may take, every turn included: past it the episode is an error row."""
        return float(self.options.get("episode_timeout_s") or self.episode_timeout_s)
