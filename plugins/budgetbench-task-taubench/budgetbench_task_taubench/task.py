"""The ``tau-bench`` task: each tau2 task is one agent episode, graded on the final database.

Options: ``domain`` (retail, airline, mock; default retail), ``split`` (train, test, base;
default test, or base for mock), ``path`` (a folder in upstream's layout; default
``$BUDGETBENCH_DATA_DIR/taubench/<domain>``), ``user`` (llm or scripted; default llm),
``max_turns`` (agent calls per episode, default 30) and ``guidelines`` (the user simulator's
guidelines file; default ``simulation_guidelines.md`` next to the domain folder).

An episode opens as upstream's does (the agent greets, the user answers); every agent reply
is one JSON action (see ``actions``): a tool call runs on the episode's fresh environment and
its result is the next message; a message to the user is answered by the simulated user; a
malformed action is answered with the reason, as a tool error. It ends when the user sends a
stop token, the agent's message contains ``###STOP###``, or after 10 tool errors (upstream's
limit; reward 0), or at ``max_turns`` (reward 0).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from budgetbench_core import (
    Episode,
    EpisodicTask,
    Item,
    JudgeChannel,
    Message,
    Step,
    TaskDataError,
    UserChannel,
    balanced,
    data_dir,
)

from .actions import RESPOND, InvalidAction, parse_action, respond, system_prompt
from .domain import DOMAINS, Domain, TaskRecord, load_domain
from .grading import grade, initial_environment, initial_events
from .judging import judge_assertions
from .users import STOP_TOKENS, LLMUser, ScriptedUser

GREETING = "Hi! How can I help you today?"  # upstream's first agent message
MAX_ERRORS = 10
AGENT_STOP = "###STOP###"


def _result_text(name: str, content: str) -> str:
    return f"Tool {name} returned:\n{content}"


class TauEpisode(Episode):
    """One tau2 task played out: environment, simulated user, trajectory for the grade."""

    def __init__(self, domain: Domain, record: TaskRecord, system: Message, user: Any) -> None:
        self.domain = domain
        self.record = record
        self.system = system
        self.user = user
        self.env = initial_environment(domain, record)
        self.events = initial_events(record)  # the grade's view of the trajectory
        self.errors = 0
        self.transferred = False
        self.ended = "user_stop"

    def _history_messages(self) -> list[Message]:
        """The task's initial message history (mock), in the action format."""
        out: list[Message] = []
        for index, event in enumerate(self.events):
            if "tool_call" in event:
                call = event["tool_call"]
                out.append(
                    Message(
                        "assistant",
                        _action_text(call["name"], call["arguments"]),
                        {"exchange": f"h{index}", "exchange_part": "call", "session_id": f"h{index}"},
                    )
                )
            elif event["role"] == "tool":
                out.append(
                    Message(
                        "user",
                        _result_text("(earlier call)", event["content"]),
                        {"exchange": f"h{index - 1}", "exchange_part": "result", "session_id": f"h{index - 1}"},
                    )
                )
            elif event["role"] == "assistant":
                out.append(Message("assistant", respond(event["content"]), {"session_id": f"h{index}"}))
            else:
                out.append(Message("user", event["content"], {"session_id": f"h{index}"}))
        return out

    def opening(self) -> list[Message]:
        earlier = self._history_messages()
        first = self.user.opening(GREETING)
        self.events += [{"role": "assistant", "content": GREETING}, {"role": "user", "content": first}]
        return [
            *earlier,
            Message("assistant", respond(GREETING), {"session_id": "greeting"}),
            Message("user", first, {"session_id": "turn-0"}),
        ]

    def step(self, reply: str) -> Step:
        turn = len(self.events)
        try:
            action = parse_action(reply)
        except InvalidAction as exc:
            return self._tool_error(turn, reply, f"Error: invalid action: {exc}")
        if action.name == RESPOND:
            content = action.arguments["content"]
            self.events.append({"role": "assistant", "content": content})
            said = Message("assistant", reply, {"session_id": f"turn-{turn}", "kind": "message"})
            if AGENT_STOP in content:
                self.ended = "agent_stop"
                return Step((said,), done=True, record={"kind": "agent_stop"})
            answer = self.user.reply(content, self.transferred) or STOP_TOKENS[0]
            self.events.append({"role": "user", "content": answer})
            heard = Message("user", answer, {"session_id": f"turn-{turn + 1}", "kind": "user"})
            done = any(token in answer for token in STOP_TOKENS)
            return Step((said, heard), done=done, record={"kind": "message", "user": answer})
        self.events.append({"role": "assistant", "tool_call": {"name": action.name, "arguments": action.arguments}})
        result = self.env.call(action.name, action.arguments)
        self.events.append({"role": "tool", "content": result.content, "error": result.error})
        if action.name == "transfer_to_human_agents" and not result.error:
            self.transferred = True
        if result.error:
            self.errors += 1
        done = self.errors >= MAX_ERRORS
        if done:
            self.ended = "too_many_errors"
        mark = {"exchange": f"t{turn}", "session_id": f"exchange-{turn}", "tool": action.name}
        return Step(
            (
                Message("assistant", reply, {**mark, "exchange_part": "call"}),
                Message(
                    "user",
                    _result_text(action.name, result.content),
                    {**mark, "exchange_part": "result", "error": result.error},
                ),
            ),
            done=done,
            tool_error=result.error,
            record={
                "kind": "tool",
                "name": action.name,
                "arguments": action.arguments,
                "content": result.content,
                "error": result.error,
            },
        )

    def _tool_error(self, turn: int, reply: str, text: str) -> Step:
        self.errors += 1
        done = self.errors >= MAX_ERRORS
        if done:
            self.ended = "too_many_errors"
        mark = {"exchange": f"t{turn}", "session_id": f"exchange-{turn}", "tool": None}
        return Step(
            (
                Message("assistant", reply, {**mark, "exchange_part": "call"}),
                Message("user", text, {**mark, "exchange_part": "result", "error": True}),
            ),
            done=done,
            tool_error=True,
            record={"kind": "invalid_action", "content": text},
        )

    def outcome(self, end_reason: str) -> dict[str, Any]:
        ended = self.ended if end_reason == "done" else end_reason
        graded = grade(self.domain, self.record, self.env, self.events, ended)
        return {**graded, "ended": ended, "tool_errors": self.errors}

    def judged(self, outcome: dict[str, Any], judge: JudgeChannel) -> dict[str, Any]:
        """The task's NL assertions judged on the conversation, never part of the reward."""
        return {"nl_assertions": judge_assertions(self.record.nl_assertions, self.events, judge)}


def _action_text(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


class TauBench(EpisodicTask):
    name = "tau-bench"
    default_grader = "exact-match"  # unused: an episode is graded by its outcome (the tau2 reward)
    max_output_tokens = 256
    max_turns = 30
    outcome_version = "2"  # 2: nl_assertions judged with --judge-model, null without
    description = "tau2-bench retail/airline/mock: tool-agent-user episodes graded on the final database state."

    def __init__(
        self,
        domain: str = "retail",
        split: str | None = None,
        path: str | None = None,
        user: str = "llm",
        max_turns: int | str = 30,
        guidelines: str | None = None,
        **options: Any,
    ) -> None:
        if options:
            raise ValueError(
                f"tau-bench: unknown options {sorted(options)}; known: domain, split, path, user, max_turns, guidelines"
            )
        if domain not in DOMAINS:
            raise ValueError(f"tau-bench: domain must be one of {', '.join(DOMAINS)}, got {domain!r}")
        if user not in ("llm", "scripted"):
            raise ValueError(f"tau-bench: user must be llm or scripted, got {user!r}")
        if int(max_turns) <= 0:
            raise ValueError(f"tau-bench: max_turns must be a positive integer, got {max_turns!r}")
        split = split or ("base" if domain == "mock" else "test")
        super().__init__(
            domain=domain, split=split, path=path, user=user, max_turns=int(max_turns), guidelines=guidelines
        )
        self.folder = Path(path) if path else data_dir() / "taubench" / domain
        self._domain: Domain | None = None

    @property
    def domain(self) -> Domain:
        if self._domain is None:
            self._domain = load_domain(self.options["domain"], self.folder)
        return self._domain

    def _system(self) -> Message:
        tools = type(self.domain.environment().tools).specs()
        return Message("system", system_prompt(self.domain.policy, tools))

    def load(self, limit: int | None, seed: int) -> Iterator[Item]:
        records = self.domain.split(self.options["split"])
        if limit is not None:
            records = balanced(records, limit, seed, lambda r: "all", self.name)
        system = self._system()
        for record in records:
            opening = ScriptedUser(record.scenario).opening(GREETING) if self.options["user"] == "scripted" else None
            query = Message("user", opening or "(the simulated user opens the conversation)")
            yield Item(
                id=record.id,
                history=(Message("assistant", respond(GREETING)),),
                query=query,
                system=system,
                category=self.options["domain"],
                answer={"actions": [a.name for a in record.actions or ()], "reward_basis": list(record.reward_basis)},
                metadata={"domain": self.options["domain"], "split": self.options["split"]},
            )

    def _guidelines(self) -> str:
        path = (
            Path(self.options["guidelines"])
            if self.options["guidelines"]
            else self.folder.parent / "simulation_guidelines.md"
        )
        if not path.is_file():
            raise TaskDataError(
                f"tau-bench: user simulator guidelines not found at {path}; pass --task-option "
                f"guidelines=<file> (upstream's data/tau2/user_simulator/simulation_guidelines.md)"
            )
        return path.read_text(encoding="utf-8")

    def episode(self, item: Item, user: UserChannel) -> TauEpisode:
        record = self.domain.task(item.id)
        simulated = (
            ScriptedUser(record.scenario)
            if self.options["user"] == "scripted"
            else LLMUser(record.scenario, self._guidelines(), user)
        )
        return TauEpisode(self.domain, record, item.system, simulated)

    def manifest_notes(self) -> dict[str, Any]:
        notes = {
            **super().manifest_notes(),
            "data_folder": str(self.folder),
            "action_format": "json-act",
            "user_simulator": self.options["user"],
            "reward": "tau2 reward by reward_basis; NL_ASSERTION apart (nl_assertions: judged with --judge-model)",
        }
        if self._domain is not None:
            notes["tasks_in_split"] = len(self._domain.split(self.options["split"]))
        return notes
