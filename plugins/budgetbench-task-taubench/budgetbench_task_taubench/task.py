"""The ``tau-bench`` task: each tau2 task is one agent episode, graded as upstream grades it.

Options (docs/plugins/taubench.md): ``domain`` (retail, airline, telecom, mock), ``split``,
``path``, ``user`` (llm or scripted), ``max_steps`` (200) and ``max_errors`` (10), upstream's
``DEFAULT_MAX_STEPS`` and ``DEFAULT_MAX_ERRORS``, ``max_turns`` (agent calls; default
``max_steps``), ``guidelines`` (the user simulator's guidelines file) and ``tools`` (``json``:
tools described in the system prompt, JSON actions; ``native``: the tool schemas sent with
every agent call and the model's tool calls as actions, ``native.py``).

An episode opens as upstream's does (the agent greets, the user answers). Each agent reply is
parsed by ``actions.parse_reply``: tool calls run on the episode's environment and their
results are the next message; a message goes to the simulated user, whose own tool calls
(telecom's phone, mock's inbox) run on the environment as the user's and are answered to the
user alone; a reply that is no action is answered with the reason, as a tool error. Steps are
counted as upstream's orchestrator counts them (each agent message, user message and batch
of tool results), and the episode ends as upstream's does: a stop token (the user's, or the
agent's ``###STOP###``), ``max_steps`` or ``max_errors`` (reward 0), or an empty user reply or
a user prompt that outgrows the served context (``user_error``, reward 0: upstream raises).
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
    Param,
    Step,
    TaskDataError,
    UserChannel,
    balanced,
    data_dir,
)

from .actions import (
    AGENT_STOP,
    RESPOND,
    Action,
    InvalidAction,
    describe_tools,
    parse_reply,
    respond,
    system_prompt,
    user_action,
)
from .domain import DOMAINS, Domain, TaskRecord, load_domain
from .grading import grade, initial_environment, initial_events
from .judging import judge_assertions
from .native import arguments_text, call_ids, native_actions, native_exchange, native_system_prompt, tool_schemas
from .users import STOP_TOKENS, LLMUser, ScriptedUser

GREETING = "Hi! How can I help you today?"  # upstream's first agent message
MAX_STEPS, MAX_ERRORS = 200, 10  # upstream's DEFAULT_MAX_STEPS, DEFAULT_MAX_ERRORS
USER_MAX_TOKENS = 4096  # a bound for the simulated user's reply (upstream sets none)
PACKAGED = Path(__file__).parent / "data"


def _result_text(name: str, content: str) -> str:
    return f"Tool {name} returned:\n{content}"


class TauEpisode(Episode):
    """One tau2 task played out: environment, simulated user, step and error counts, trajectory."""

    def __init__(
        self,
        domain: Domain,
        record: TaskRecord,
        system: Message,
        user: Any,
        max_steps: int,
        max_errors: int,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.domain = domain
        self.record = record
        self.system = system
        self.tools = tools  # native mode: the schemas sent with every agent call
        self.user = user
        self.max_steps, self.max_errors = max_steps, max_errors
        self.env = initial_environment(domain, record)
        self.user_tools = set(type(self.env.user_tools).specs()) if self.env.user_tools is not None else set()
        self.events = initial_events(record)  # the grade's view of the trajectory
        self.steps = self.errors = 0
        self.transferred = False
        self.ended: str | None = None
        self.user_note = ""

    def _history_messages(self) -> list[Message]:
        """The task's initial message history (mock), in the action format."""
        out: list[Message] = []
        for index, event in enumerate(self.events):
            if "tool_call" in event and self.tools:  # native: the call and its result as upstream sends them
                call = event["tool_call"]
                answer = self.events[index + 1] if index + 1 < len(self.events) else {"content": "", "error": False}
                mark = {"exchange": f"h{index}", "session_id": f"h{index}"}
                calls = [(f"h{index}", call["name"], arguments_text(call["arguments"]))]
                out.extend(native_exchange(mark, "", calls, [(answer["content"], bool(answer.get("error")))]))
            elif event["role"] == "tool" and self.tools:
                continue  # sent with its call
            elif "tool_call" in event:
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
                out.append(Message("assistant", self._said(event["content"]), {"session_id": f"h{index}"}))
            else:
                out.append(Message("user", event["content"], {"session_id": f"h{index}"}))
        return out

    def _said(self, content: str) -> str:
        """An agent message to the user as the agent's history has it: plain text in native
        mode, a ``respond`` action in JSON mode."""
        return content if self.tools else respond(content)

    def _limit(self) -> bool:
        """Upstream's termination check (after a step not addressed to the environment)."""
        if self.steps >= self.max_steps:
            self.ended = "max_steps"
        if self.errors >= self.max_errors:
            self.ended = "too_many_errors"
        return self.ended is not None

    def _user_turn(self, ask: Any) -> str | None:
        """The user's next message to the agent, running its tool calls; None when the episode ended."""
        try:
            text = ask()
            while True:
                self.steps += 1
                call = user_action(text, self.user_tools) if self.user_tools else None
                if call is None:
                    break
                self.events.append({"role": "user", "tool_call": {"name": call.name, "arguments": call.arguments}})
                result = self.env.call(call.name, call.arguments, "user")
                self.events.append(
                    {"role": "tool", "content": result.content, "error": result.error, "requestor": "user"}
                )
                self.errors += int(result.error)
                self.steps += 1
                if self._limit():
                    return None
                text = self.user.tool_result(call.name, result.content)
        except ValueError as exc:  # the user's prompt outgrew the served context
            self.ended, self.user_note = "user_error", str(exc)
            return None
        if not text.strip():
            self.ended, self.user_note = "user_error", "the simulated user sent an empty message"
            return None
        self.events.append({"role": "user", "content": text})
        if any(token in text for token in STOP_TOKENS):
            self.ended = "user_stop"
        elif self._limit():
            return None
        return text

    def opening(self) -> list[Message]:
        earlier = self._history_messages()
        self.events.append({"role": "assistant", "content": GREETING})
        first = self._user_turn(lambda: self.user.opening(GREETING))
        return [
            *earlier,
            Message("assistant", self._said(GREETING), {"session_id": "greeting"}),
            Message(
                "user", first if first is not None else "(the user ended the conversation)", {"session_id": "turn-0"}
            ),
        ]

    def step(self, reply: str, tool_calls: list[dict[str, Any]] | None = None) -> Step:
        turn = len(self.events)
        if self.tools and tool_calls:  # kept so a playback (replay.py) makes the same step
            return self._recorded(self._step(turn, reply, tool_calls), tool_calls)
        return self._step(turn, reply, tool_calls)

    @staticmethod
    def _recorded(step: Step, tool_calls: list[dict[str, Any]]) -> Step:
        return Step(step.messages, step.done, step.tool_error, {**step.record, "tool_calls": tool_calls})

    def _step(self, turn: int, reply: str, tool_calls: list[dict[str, Any]] | None) -> Step:
        if self.ended is not None:  # the user ended it before the agent's first turn
            return Step(
                (Message("assistant", reply, {"session_id": f"turn-{turn}"}),), done=True, record={"kind": "ended"}
            )
        self.steps += 1
        try:
            actions = native_actions(reply, tool_calls or []) if self.tools else parse_reply(reply)
        except InvalidAction as exc:
            if self.tools and tool_calls:  # the calls as the model made them, each answered by the error
                return self._native_error(turn, reply, tool_calls, f"Error: invalid action: {exc}")
            return self._tool_error(turn, reply, f"Error: invalid action: {exc}")
        if actions[0].name == RESPOND:
            return self._message(turn, reply, actions[0].arguments["content"])
        return self._tools(turn, reply, actions, call_ids(tool_calls, turn) if self.tools and tool_calls else None)

    def _message(self, turn: int, reply: str, content: str) -> Step:
        self.events.append({"role": "assistant", "content": content})
        said = Message("assistant", reply, {"session_id": f"turn-{turn}", "kind": "message"})
        if AGENT_STOP in content:
            self.ended = "agent_stop"
            return Step((said,), done=True, record={"kind": "agent_stop"})
        if self._limit():
            return Step((said,), done=True, record={"kind": "message", "ended": self.ended})
        answer = self._user_turn(lambda: self.user.reply(content, self.transferred))
        if answer is None:
            return Step((said,), done=True, record={"kind": "message", "ended": self.ended})
        heard = Message("user", answer, {"session_id": f"turn-{turn + 1}", "kind": "user"})
        return Step((said, heard), done=self.ended is not None, record={"kind": "message", "user": answer})

    def _tools(self, turn: int, reply: str, actions: tuple[Action, ...], ids: list[str] | None = None) -> Step:
        results = []
        for action in actions:
            self.events.append({"role": "assistant", "tool_call": {"name": action.name, "arguments": action.arguments}})
            result = self.env.call(action.name, action.arguments)
            self.events.append({"role": "tool", "content": result.content, "error": result.error})
            self.transferred = self.transferred or (action.name == "transfer_to_human_agents" and not result.error)
            self.errors += int(result.error)
            results.append((action, result))
        self.steps += 1  # the environment's answer: one step for the batch, as upstream
        done = self._limit()
        mark = {"exchange": f"t{turn}", "session_id": f"exchange-{turn}", "tool": actions[0].name}
        error = any(r.error for _, r in results)
        if ids is not None:  # native: the assistant's tool_calls and a tool message per call, as upstream
            calls = [(i, a.name, arguments_text(a.arguments)) for i, (a, _) in zip(ids, results, strict=True)]
            messages = native_exchange(mark, reply, calls, [(r.content, r.error) for _, r in results])
        else:
            text = "\n\n".join(_result_text(a.name, r.content) for a, r in results)
            messages = (
                Message("assistant", reply, {**mark, "exchange_part": "call"}),
                Message("user", text, {**mark, "exchange_part": "result", "error": error}),
            )
        return Step(
            messages,
            done=done,
            tool_error=error,
            record={
                "kind": "tool",
                "calls": [
                    {"name": a.name, "arguments": a.arguments, "content": r.content, "error": r.error}
                    for a, r in results
                ],
            },
        )

    def _native_error(self, turn: int, reply: str, tool_calls: list[dict[str, Any]], text: str) -> Step:
        """Native calls that could not be run (arguments not a JSON object): the calls as made,
        each answered by ``text`` in its tool message."""
        self.errors += 1
        self.steps += 1
        done = self._limit()
        mark = {"exchange": f"t{turn}", "session_id": f"exchange-{turn}", "tool": None}
        ids = call_ids(tool_calls, turn)
        calls = [(i, str(c["name"]), str(c["arguments"] or "")) for i, c in zip(ids, tool_calls, strict=True)]
        return Step(
            native_exchange(mark, reply, calls, [(text, True)] * len(calls)),
            done=done,
            tool_error=True,
            record={"kind": "invalid_action", "content": text},
        )

    def _tool_error(self, turn: int, reply: str, text: str) -> Step:
        self.errors += 1
        self.steps += 1
        done = self._limit()
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
        ended = (self.ended or "user_stop") if end_reason == "done" else end_reason
        graded = grade(self.domain, self.record, self.env, self.events, ended)
        extra = {"user_error": self.user_note} if ended == "user_error" else {}
        return {**graded, "ended": ended, "tool_errors": self.errors, "steps": self.steps, **extra}

    def judged(self, outcome: dict[str, Any], judge: JudgeChannel) -> dict[str, Any]:
        """The task's NL assertions judged on the conversation, never part of the reward."""
        return {"nl_assertions": judge_assertions(self.record.nl_assertions, self.events, judge)}


def _action_text(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


OPTIONS = ("domain", "split", "path", "user", "max_steps", "max_errors", "max_turns", "guidelines", "tools")


class TauBench(EpisodicTask):
    """tau2-bench: each task is one agent episode (tools, a policy, a simulated user), graded as
    upstream grades it (the tau2 reward: database state, communicated info, actions, NL assertions).

    The data is upstream's: ``$BUDGETBENCH_DATA_DIR/taubench/<domain>/`` or the ``path`` option;
    docs/plugins/taubench.md lists what differs from upstream's orchestrator and why."""

    name = "tau-bench"
    default_grader = "exact-match"  # unused: an episode is graded by its outcome (the tau2 reward)
    max_output_tokens = 4096  # upstream sets no cap; the harness needs one to size the served context
    max_turns = MAX_STEPS
    outcome_version = "3"  # 3: upstream's step and error limits, user tools, lenient action parsing
    description = "tau2-bench retail/airline/telecom/mock: tool-agent-user episodes graded as upstream grades them."
    # help for `budgetbench describe` (the defaults come from the signature)
    parameters = {
        "domain": Param(help=f"the tau2 domain: {', '.join(DOMAINS)}"),
        "split": Param(help="train, test or base (all tasks); default test (base for mock)"),
        "path": Param(help="a domain folder in upstream's layout (default $BUDGETBENCH_DATA_DIR/taubench/<domain>)"),
        "user": Param(help="llm (the served model plays the customer) or scripted"),
        "max_steps": Param(
            help="steps per episode, counted as upstream's orchestrator does (upstream's DEFAULT_MAX_STEPS)"
        ),
        "max_errors": Param(help="failed tool calls and invalid actions before the episode ends (upstream's default)"),
        "max_turns": Param(help="agent calls per episode, a harness bound (default: max_steps)"),
        "guidelines": Param(
            help="the user simulator's guidelines file (default: upstream's, beside the domain folder)"
        ),
        "tools": Param(
            help="json (tools described in the prompt, JSON actions) or native (tool schemas sent as upstream "
            "sends them; needs a backend with native tool calls)"
        ),
    }

    def __init__(
        self,
        domain: str = "retail",
        split: str | None = None,
        path: str | None = None,
        user: str = "llm",
        max_steps: int | str = MAX_STEPS,
        max_errors: int | str = MAX_ERRORS,
        max_turns: int | str | None = None,
        guidelines: str | None = None,
        tools: str = "json",
        **options: Any,
    ) -> None:
        if options:
            raise ValueError(f"tau-bench: unknown options {sorted(options)}; known: {', '.join(OPTIONS)}")
        if domain not in DOMAINS:
            raise ValueError(f"tau-bench: domain must be one of {', '.join(DOMAINS)}, got {domain!r}")
        if user not in ("llm", "scripted"):
            raise ValueError(f"tau-bench: user must be llm or scripted, got {user!r}")
        if tools not in ("json", "native"):
            raise ValueError(f"tau-bench: tools must be json or native, got {tools!r}")
        limits = {"max_steps": max_steps, "max_errors": max_errors, "max_turns": max_turns or max_steps}
        for key, value in limits.items():
            if not str(value).isdigit() or int(value) <= 0:
                raise ValueError(f"tau-bench: {key} must be a positive integer, got {value!r}")
        split = split or ("base" if domain == "mock" else "test")
        super().__init__(
            domain=domain,
            split=split,
            path=path,
            user=user,
            **{k: int(v) for k, v in limits.items()},
            guidelines=guidelines,
            tools=tools,
        )
        self.folder = Path(path) if path else data_dir() / "taubench" / domain
        self._domain: Domain | None = None
        self._schemas: list[dict[str, Any]] | None = None

    @property
    def domain(self) -> Domain:
        if self._domain is None:
            self._domain = load_domain(self.options["domain"], self.folder)
        return self._domain

    def native_tools(self) -> bool:
        return self.options["tools"] == "native"

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The agent's tool schemas in native mode (None in JSON mode), built once."""
        if self.native_tools() and self._schemas is None:
            self._schemas = tool_schemas(type(self.domain.environment().tools))
        return self._schemas

    def _system(self) -> Message:
        if self.native_tools():
            return Message("system", native_system_prompt(self.domain.policy))
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
                history=(Message("assistant", GREETING if self.native_tools() else respond(GREETING)),),
                query=query,
                system=system,
                category=self.options["domain"],
                answer={"actions": [a.name for a in record.actions or ()], "reward_basis": list(record.reward_basis)},
                metadata={"domain": self.options["domain"], "split": self.options["split"]},
            )

    def _guidelines(self, with_tools: bool) -> str:
        """The guidelines file: the option, else upstream's file beside the domain folder (the tools
        variant, which the shared data lacks, falls back to the copy shipped in this package)."""
        name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
        given = self.options["guidelines"]
        path = Path(given) if given else self.folder.parent / name
        if not given and with_tools and not path.is_file():
            path = PACKAGED / name
        if not path.is_file():
            raise TaskDataError(
                f"tau-bench: user simulator guidelines not found at {path}; run `budgetbench data fetch tau-bench` "
                f"or pass --task-option guidelines=<file> (upstream's data/tau2/user_simulator/{name})"
            )
        return path.read_text(encoding="utf-8")

    def episode(self, item: Item, user: UserChannel) -> TauEpisode:
        record = self.domain.task(item.id)
        user_kit = DOMAINS[self.options["domain"]][2]
        if self.options["user"] == "scripted":
            simulated: Any = ScriptedUser(record.scenario)
        else:
            tools = describe_tools(user_kit[1].specs()) if user_kit else None
            simulated = LLMUser(record.scenario, self._guidelines(tools is not None), user, USER_MAX_TOKENS, tools)
        return TauEpisode(
            self.domain,
            record,
            item.system,
            simulated,
            self.options["max_steps"],
            self.options["max_errors"],
            self.tool_schemas(),
        )

    def manifest_notes(self) -> dict[str, Any]:
        notes = {
            **super().manifest_notes(),
            "data_folder": str(self.folder),
            "action_format": "native tool calls" if self.native_tools() else "json-act",
            "tools_mode": self.options["tools"],
            "user_simulator": self.options["user"],
            "max_steps": self.options["max_steps"],
            "max_errors": self.options["max_errors"],
            "reward": "tau2 reward by reward_basis; NL_ASSERTION apart (nl_assertions: judged with --judge-model)",
        }
        if self._domain is not None:
            notes["tasks_in_split"] = len(self._domain.split(self.options["split"]))
        return notes
