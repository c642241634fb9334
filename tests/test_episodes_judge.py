"""Episode.judged: called only with --judge-model, its calls through the judge, never the reward."""

from __future__ import annotations

import types

from budgetbench_core import Episode, EpisodicTask, Item, Message, RunConfig, Step, final_rows, hookimpl, run
from budgetbench_core.testing import FaultServer, registry_with


class Echo(Episode):
    system = Message("system", "Say anything.")

    def __init__(self, figures: str) -> None:
        self.figures = figures

    def opening(self):
        return [Message("user", "Hello")]

    def step(self, reply):
        return Step((Message("assistant", reply), Message("user", "Bye")), done=True)

    def outcome(self, end_reason):
        return {"reward": 0.5}

    def judged(self, outcome, judge):
        if self.figures == "reward":
            return {"reward": 1.0}  # refused: the judge never changes the reward
        reply = judge.complete([Message("user", "Judge this")], 4)
        return {"judged": {"raw": reply, "model": judge.model, "calls": len(judge.calls), "seen": outcome["reward"]}}


class EchoTask(EpisodicTask):
    name = "echo-episode"
    default_grader = "exact-match"
    max_output_tokens = 4

    def load(self, limit, seed):
        yield Item(id="one", history=(), query=Message("user", "Hello"), answer=None)

    def episode(self, item, user):
        return Echo(self.options.get("figures", "judged"))


@hookimpl
def register_tasks(register):
    register(EchoTask)


def _run(tmp_path, name, server, **more):
    config = RunConfig(
        task="echo-episode",
        strategies=["full_context"],
        budgets=[200],
        out=tmp_path / name,
        model="openai/fault-model",
        api_base=server.url,
        tokenizer="tiktoken:cl100k_base",
        **more,
    )
    run(config, registry=registry_with(types.SimpleNamespace(register_tasks=register_tasks)))
    (row,) = final_rows(tmp_path / name).values()
    return row


def test_judged_only_with_a_judge_and_never_the_reward(tmp_path):
    with FaultServer() as server:
        plain = _run(tmp_path, "plain", server)
        assert server.completions() == 1  # the agent's call only
        judged = _run(tmp_path, "judged", server, judge_model="openai/fault-model")
        assert server.completions() == 3  # the agent's call, then the judge's
        refused = _run(
            tmp_path, "refused", server, judge_model="openai/fault-model", task_options={"figures": "reward"}
        )
    assert "judged" not in plain["episode"]["outcome"] and plain["quality"] == 0.5
    figure = judged["episode"]["outcome"]["judged"]
    assert figure == {"raw": "Judge", "model": "openai/fault-model", "calls": 1, "seen": 0.5}
    assert judged["verdict"]["judged"] == figure and judged["quality"] == judged["episode"]["reward"] == 0.5
    assert judged["aux_calls"] == 0
    assert refused["event"] == "error" and refused["phase"] == "grading" and "reward" in refused["cause"]
