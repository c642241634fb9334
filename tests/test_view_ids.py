"""A strategy's view carries an opaque item id: a dataset's ids can carry its labels
(LongMemEval's ``_abs`` suffix marks the abstention questions), so the item's own id never
reaches a strategy, while a strategy still tells its items apart and finds the same id at
every tier of an item."""

from __future__ import annotations

import types

import pytest

from budgetbench_core import Item, Message, RunConfig, Task, hookimpl, run
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.runlog import iter_events
from budgetbench_core.testing import FaultServer, registry_with, strategy_context

IDS = ["q-001_abs", "q-002", "q-003_abs", "gpt4_q-004"]


class LabelledIds(Task):
    """Four items whose ids say what kind of question each is, as LongMemEval's do."""

    name, default_grader = "labelled-ids", "exact-match"

    def load(self, limit, seed):
        for item_id in IDS:
            history = (Message("user", f"note for {item_id[:5]}"), Message("assistant", "noted"))
            yield Item(item_id, history, Message("user", "What was noted?"), "nothing")


class IdSpy(Truncation):
    """Reports the id its view carries."""

    name = "id-spy"

    def apply(self, history, budget, context):
        context.audit["view_id"] = context.item.id
        return super().apply(history, budget, context)


PLUGIN = types.SimpleNamespace(
    register_tasks=hookimpl(lambda register: register(LabelledIds)),
    register_strategies=hookimpl(lambda register: register(IdSpy)),
)


def seen_ids(tmp_path, name: str, isolation: str) -> dict[str, set[str]]:
    out = tmp_path / name
    with FaultServer() as server:
        run(
            RunConfig(
                task="labelled-ids",
                strategies=["id-spy"],
                budgets=[300, 400],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                max_concurrency=1,
                retries=0,
                isolation=isolation,
            ),
            registry=registry_with(PLUGIN, distribution="view-ids-test"),
        )
    seen: dict[str, set[str]] = {}
    for event in iter_events(out):
        if event["event"] == "prompt_audit":
            seen.setdefault(event["item_id"], set()).add(event["strategy_audit"]["view_id"])
    return seen


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_a_view_carries_an_opaque_id_the_same_at_every_tier_and_new_in_every_run(tmp_path, isolation):
    """Old code: the view's id was the item's (``q-001_abs``), a label a strategy could act on."""
    first, second = seen_ids(tmp_path, "first", isolation), seen_ids(tmp_path, "second", isolation)
    assert sorted(first) == sorted(IDS)
    for ids in first.values():
        assert len(ids) == 1, ids  # one id at both tiers of an item
        (view_id,) = ids
        assert not any(part in view_id for part in ("abs", "gpt4", "q-0")), view_id
    assert len({next(iter(ids)) for ids in first.values()}) == len(IDS)  # items told apart
    # keyed by the run's secret, not a fixed hash of the public id: another run's ids differ
    assert all(first[i] != second[i] for i in IDS)


def test_the_testing_helpers_view_has_an_opaque_id_stable_within_the_process():
    """Old code: ``testing.strategy_context`` gave plugin authors' tests the item's own id, where
    a run gives an opaque one (a strategy tested on ids it never sees in a run)."""
    item = Item("q-003_abs", (Message("user", "hello"),), Message("user", "which?"), "gold")
    first, again = (strategy_context(item, 100, None, ".").item.id for _ in range(2))
    assert first == again != item.id and first.startswith("item-") and "abs" not in first
    other = Item("q-004", item.history, item.query, "gold")
    assert strategy_context(other, 100, None, ".").item.id not in (first, other.id)
