"""What crosses between the harness and a strategy's worker for a cell: a long history's token
counts a block at a time, as the strategy needs them (not the whole history for every item), and
a prompt's history messages as references to the harness's own copy, never to anything else."""

from __future__ import annotations

import types

import pytest

from budgetbench_core import Item, MemoryStrategy, Message, Regime, RunConfig, Task, hookimpl, run
from budgetbench_core.builtin.synthetic_memory import SyntheticMemory
from budgetbench_core.builtin.tokenizers import TiktokenTokenizer
from budgetbench_core.host import remote, wire
from budgetbench_core.host.worker import HISTORY_BLOCK_CHARS
from budgetbench_core.runlog import final_rows, iter_events
from budgetbench_core.testing import FaultServer, registry_with


class RecordingTiktoken(TiktokenTokenizer):
    """cl100k_base, recording every message text the harness counts (it lives in the harness)."""

    counted: list[str] = []

    def count_in_message(self, role: str, content: str) -> int:
        RecordingTiktoken.counted.append(content)
        return super().count_in_message(role, content)


class Tokens(int):
    """A count that is an int, but not exactly one (an enum's, a library's own type)."""


class IntLikeCounts(TiktokenTokenizer):
    """cl100k_base, whose per-message counts are ``Tokens``."""

    def count_in_message(self, role: str, content: str) -> int:
        return Tokens(super().count_in_message(role, content))


class ForgedReference(MemoryStrategy):
    """Keeps the newest messages, but its worker sends a reference it chose (``forged``)."""

    name = "forged-reference"
    regime = Regime.LOCAL_ONLY

    def __init__(self, forged: int = -1, **params):
        super().__init__(forged=forged, **params)
        self.forged = forged

    def apply(self, history, budget, context):
        wire.prompt_to_wire = lambda messages, history_at: [{"history": self.forged}]
        return context.frame(list(history[-2:]))


class ReferenceBomb(MemoryStrategy):
    """Sends a few bytes that stand for gigabytes: 20,000 references to a 2,000-character history
    message, as its prompt (``via="prompt"``) or in a count request (``via="count"``)."""

    name = "reference-bomb"
    regime = Regime.LOCAL_ONLY

    def __init__(self, via: str = "prompt", **params):
        super().__init__(via=via, **params)
        self.via = via

    def apply(self, history, budget, context):
        bomb = [history[0]] * 20_000
        if self.via == "count":
            context.audit["tokens"] = context.counter.count(context.frame(bomb))
        return context.frame(bomb)


class FrameBomb(MemoryStrategy):
    """Asks the harness to count one text of 24 MB: over any frame a small view's worker may send."""

    name = "frame-bomb"
    regime = Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        context.audit["tokens"] = context.counter.content_tokens("word " * (24 * 1024 * 1024 // 5))
        return context.frame(list(history[-2:]))


class LongMessages(Task):
    """Two items of 100 history messages of 2,000 characters each (a long-session dataset's shape)."""

    name, default_grader = "frames-long-messages", "exact-match"

    def load(self, limit, seed):
        for item in range(2):
            history = tuple(
                Message("user" if n % 2 == 0 else "assistant", f"item {item} turn {n}: " + "word " * 398)
                for n in range(100)
            )
            yield Item(f"long-{item}", history, Message("user", "What was said?"), "nothing")


class CountsNewTexts(MemoryStrategy):
    """Counts 40 new texts in one call and 40 others one at a time; keeps what it was told."""

    name = "counts-new-texts"
    regime = Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        batch = [f"batch line {i}: " + "word " * i for i in range(40)]
        single = [f"single line {i}: " + "word " * i for i in range(40)]
        context.audit["batch"] = context.counter.contents_tokens(batch)
        context.audit["single"] = [context.counter.content_tokens(t) for t in single]
        return context.frame([])


PLUGIN = types.SimpleNamespace(
    register_tasks=hookimpl(lambda register: register(LongMessages)),
    register_tokenizers=hookimpl(
        lambda register: [
            register("recording", lambda arg, backend: RecordingTiktoken(arg)),
            register("int-like", lambda arg, backend: IntLikeCounts(arg)),
        ]
    ),
    register_strategies=hookimpl(
        lambda register: [register(s) for s in (ForgedReference, CountsNewTexts, ReferenceBomb, FrameBomb)]
    ),
)


def frames_run(
    tmp_path,
    strategy: str,
    params=None,
    history_tokens: int = 600,
    task: str = "synthetic-memory",
    tokenizer: str = "recording:cl100k_base",
):
    out = tmp_path / "run"
    with FaultServer() as server:
        run(
            RunConfig(
                task=task,
                strategies=[strategy],
                budgets=[300],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer=tokenizer,
                task_options={"items": 2, "history_tokens": history_tokens} if task == "synthetic-memory" else {},
                strategy_params={strategy: params or {}},
                max_concurrency=1,
                retries=0,
            ),
            registry=registry_with(PLUGIN, distribution="frames-test"),
        )
    return list(final_rows(out).values())


def test_a_long_historys_counts_cross_only_for_the_blocks_a_strategy_reads(tmp_path):
    """Old code: the worker asked for every history message's count at each new item, so the
    harness counted all of a long history to keep its newest few messages (LongMemEval_S: 115K
    tokens for a 2K prompt)."""
    RecordingTiktoken.counted.clear()
    rows = frames_run(tmp_path, "truncation", history_tokens=40_000)
    assert [r["event"] for r in rows] == ["result", "result"]
    items = list(SyntheticMemory(items=2, history_tokens=40_000).load(None, 0))
    texts = {m.content for item in items for m in item.history}
    longest = max(len(t) for t in texts)
    assert min(sum(len(m.content) for m in item.history) for item in items) > 4 * HISTORY_BLOCK_CHARS
    counted = [t for t in set(RecordingTiktoken.counted) if t in texts]
    # the newest block of each item: at least HISTORY_BLOCK_CHARS, less than one message more
    assert 0 < sum(len(t) for t in counted) < 2 * (HISTORY_BLOCK_CHARS + longest), len(counted)


def test_what_is_counted_beyond_what_a_strategy_reads_is_bounded_in_text_not_in_messages(tmp_path):
    """Blocks are cut by characters: with long messages, a block of 64 messages (the previous
    code) was 128,000 characters counted to keep two messages at budget 300."""
    RecordingTiktoken.counted.clear()
    rows = frames_run(tmp_path, "truncation", task="frames-long-messages")
    assert [r["event"] for r in rows] == ["result", "result"]
    texts = {m.content for item in LongMessages().load(None, 0) for m in item.history}
    counted = [t for t in set(RecordingTiktoken.counted) if t in texts]
    assert 0 < sum(len(t) for t in counted) < 2 * (HISTORY_BLOCK_CHARS + 2_100), len(counted)


def test_texts_counted_together_cross_in_one_request_and_count_as_the_harness_counts(tmp_path, monkeypatch):
    """``counter.contents_tokens`` in a worker is one round trip for all its texts (checkpoint
    counted each candidate line alone: 6 of its 7.7 round trips per cell); the counts are the
    harness's tokenizer's, as ``content_tokens`` one at a time."""
    asked = []
    answer = remote.RemoteStrategy._answer
    monkeypatch.setattr(
        remote.RemoteStrategy, "_answer", lambda self, r, c: (asked.append(r["req"]), answer(self, r, c))[1]
    )
    frames_run(tmp_path, "counts-new-texts")
    audits = [e for e in iter_events(tmp_path / "run") if e["event"] == "prompt_audit"]
    assert len(audits) == 2
    tokenizer = TiktokenTokenizer("cl100k_base")
    for audit in audits:
        assert audit["strategy_audit"]["batch"] == [
            tokenizer.count_text(f"batch line {i}: " + "word " * i) for i in range(40)
        ]
        assert audit["strategy_audit"]["single"] == [
            tokenizer.count_text(f"single line {i}: " + "word " * i) for i in range(40)
        ]
    # the second item is served by the first's worker, reset: its counter keeps these counts, so only the first asks
    assert asked.count("count_texts") == 1 and asked.count("count_text") == 40


@pytest.mark.parametrize("forged", [-1, 10**6])
def test_a_history_reference_outside_the_item_is_an_error_row_naming_the_strategy(tmp_path, forged):
    """A worker names history messages by position; -1 (Python's last item) and a position past
    the end are refused, never resolved to some message."""
    rows = frames_run(tmp_path, "forged-reference", {"forged": forged})
    assert len(rows) == 2 and all(r["event"] == "error" for r in rows), rows
    for row in rows:
        assert "forged-reference" in row["cause"] and "no history message" in row["cause"], row["cause"]


def test_a_reference_is_the_harnesss_own_message_and_nothing_else_crosses_as_text():
    history = (Message("user", "first", {"session_id": "s1"}), Message("assistant", "second", {"session_id": "s2"}))
    new = Message("user", "a checkpoint")
    sent = wire.prompt_to_wire([new, history[1]], {id(m): i for i, m in enumerate(history)})
    assert sent == [new.to_dict(), {"history": 1}]
    text = wire.ViewText(Item("i", history, Message("user", "q"), None))
    assert text.history == [5, 6] and text.limit == wire.PROMPT_TEXT_FACTOR * 12 + wire.PROMPT_TEXT_FLOOR
    received = wire.prompt_from_wire(sent, history, text)
    assert received[1] is history[1] and received[0] == new
    with pytest.raises(wire.WireError, match="no history message"):
        wire.prompt_from_wire([{"history": True}], history, text)  # a bool is not a position
    text.limit = 17
    with pytest.raises(wire.WireError, match="more than 17 characters"):
        wire.prompt_from_wire([{"history": 0}] * 4, history, text)  # 4 x "first": 20 characters


def test_a_frame_carries_any_text_exactly():
    """A worker's frames are ASCII JSON, the harness's are marshalled: either way accents, CJK,
    emoji and a lone surrogate (text a dataset may hold) arrive as they were sent."""
    from multiprocessing import Pipe

    ours, theirs = Pipe()
    texts = ["café", "日本語のテキスト", "emoji 🧠 and \U0001f600", "lone \ud800 surrogate", 'quote " \\ \n\t']
    wire.send(ours, {"texts": texts})
    assert wire.receive(theirs) == {"texts": texts}
    wire.send_to_worker(ours, {"texts": texts, "view": {"history": [{"role": "user", "metadata": {"n": 1.5}}]}})
    assert wire.receive_from_harness(theirs) == {
        "texts": texts,
        "view": {"history": [{"role": "user", "metadata": {"n": 1.5}}]},
    }


@pytest.mark.parametrize("via", ["prompt", "count"])
def test_references_standing_for_more_text_than_the_view_holds_are_refused_uncounted(tmp_path, via):
    """A 300 KB frame of references to one 2,000-character message stands for 40M characters.
    Old code rendered and tokenised all of it in the harness (a violation row, seconds of CPU
    per cell; a 14 MB frame would have been gigabytes); now it is refused before anything counts
    it, an error row naming the strategy, and the run goes on."""
    RecordingTiktoken.counted.clear()
    rows = frames_run(tmp_path, "reference-bomb", {"via": via}, task="frames-long-messages")
    assert [r["event"] for r in rows] == ["error", "error"], rows
    for row in rows:
        assert "reference-bomb" in row["cause"] and "characters" in row["cause"], row["cause"]
    assert sum(len(t) for t in RecordingTiktoken.counted) < 1_000_000


def test_a_frame_far_larger_than_what_a_worker_was_sent_ends_it_unread(tmp_path):
    """Old code read and counted a 24 MB text a worker sent for a 40 KB view (frames were bounded
    at 256 MB, which decode into gigabytes); now the frame is refused unread, the worker is ended
    and its cell is an error row naming the strategy; the next item gets a new worker."""
    RecordingTiktoken.counted.clear()
    rows = frames_run(tmp_path, "frame-bomb")
    assert [r["event"] for r in rows] == ["error", "error"], rows
    for row in rows:
        assert "frame-bomb" in row["cause"] and "over the limit" in row["cause"], row["cause"]
    assert max(map(len, RecordingTiktoken.counted), default=0) < 1_000_000


def test_a_receiver_refuses_a_frame_over_its_limit_and_reads_no_more():
    from multiprocessing import Pipe

    ours, theirs = Pipe()
    sent = wire.send(ours, {"text": "x" * 2_000})
    assert sent > 2_000 and wire.reply_limit(sent) == wire.REPLY_FRAME_FLOOR
    with pytest.raises(wire.FrameTooLarge, match="over the limit of 1,000 bytes"):
        wire.receive(theirs, 1_000)


def test_a_parameter_that_is_not_plain_data_is_a_clear_error_naming_the_strategy(tmp_path):
    """The harness's frames to a worker carry plain data only: a parameter of a class (a Path
    given through the Python API) fails the strategy's start with its name, no worker left."""
    from budgetbench_core.host.pool import PluginHost, PluginHostError
    from budgetbench_core.testing import tokenizer_for

    host = PluginHost(tokenizer_for("tiktoken:cl100k_base").info.to_dict(), tmp_path / "workers")
    try:
        with pytest.raises(
            PluginHostError, match=r"strategy 'truncation': a frame for the worker holds more than plain"
        ):
            host.new_strategy("truncation", {"where": tmp_path}, 0.0, None)
        assert all(not w.alive() for w in host._workers)
    finally:
        host.close()


def test_a_tokenizers_int_like_counts_reach_the_worker_as_ints(tmp_path):
    """The harness's answers to a worker are plain data: a count of an int subclass crosses as
    its int (without that, the answer could not be sent and the strategy's cells failed)."""
    rows = frames_run(tmp_path, "truncation", history_tokens=2_000, tokenizer="int-like:cl100k_base")
    assert [r["event"] for r in rows] == ["result", "result"], rows
