"""What crosses between the harness and a strategy's worker for a cell: a long history's token
counts a block at a time, as the strategy needs them (not the whole history for every item), and
a prompt's history messages as references to the harness's own copy, never to anything else."""

from __future__ import annotations

import types

import pytest

from budgetbench_core import MemoryStrategy, Message, Regime, RunConfig, hookimpl, run
from budgetbench_core.builtin.synthetic_memory import SyntheticMemory
from budgetbench_core.builtin.tokenizers import TiktokenTokenizer
from budgetbench_core.host import wire
from budgetbench_core.host.worker import HISTORY_BLOCK
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer, registry_with


class RecordingTiktoken(TiktokenTokenizer):
    """cl100k_base, recording every message text the harness counts (it lives in the harness)."""

    counted: list[str] = []

    def count_in_message(self, role: str, content: str) -> int:
        RecordingTiktoken.counted.append(content)
        return super().count_in_message(role, content)


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


PLUGIN = types.SimpleNamespace(
    register_tokenizers=hookimpl(lambda register: register("recording", lambda arg, backend: RecordingTiktoken(arg))),
    register_strategies=hookimpl(lambda register: register(ForgedReference)),
)


def frames_run(tmp_path, strategy: str, params=None, history_tokens: int = 600):
    out = tmp_path / "run"
    with FaultServer() as server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=[strategy],
                budgets=[300],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="recording:cl100k_base",
                task_options={"items": 2, "history_tokens": history_tokens},
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
    rows = frames_run(tmp_path, "truncation", history_tokens=20_000)
    assert [r["event"] for r in rows] == ["result", "result"]
    histories = [len(item.history) for item in SyntheticMemory(items=2, history_tokens=20_000).load(None, 0)]
    assert min(histories) > 4 * HISTORY_BLOCK  # the run's items: far more messages than one block
    counted = set(RecordingTiktoken.counted)
    assert 0 < len(counted) <= 2 * (HISTORY_BLOCK + 8), len(counted)  # the newest block of each item, and the prompts


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
    received = wire.prompt_from_wire(sent, history)
    assert received[1] is history[1] and received[0] == new
    with pytest.raises(wire.WireError, match="no history message"):
        wire.prompt_from_wire([{"history": True}], history)  # a bool is not a position
