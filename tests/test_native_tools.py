"""Native tool calls: the tool schemas are part of the prompt, so they are counted (as the served
template renders them), cached and sent; a backend that cannot send them refuses the run."""

from __future__ import annotations

import json
import types
from pathlib import Path

import jinja2
import pytest

from budgetbench_core import Backend, EpisodicTask, GenerationParams, Item, Message, hookimpl
from budgetbench_core.builtin.litellm_backend import LiteLLMBackend
from budgetbench_core.builtin.local_backend import SMOLLM2_TOOLS_TEMPLATE, LocalBackend, default_model_path
from budgetbench_core.cache import cache_key
from budgetbench_core.engine.run_plugins import RunPlugins
from budgetbench_core.run_config import RunConfig, RunConfigError
from budgetbench_core.testing import registry_with

TOOLS = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "get_user_details",
                "description": "Get the details of a user.",
                "parameters": {
                    "type": "object",
                    "properties": {"user_id": {"type": "string", "description": "The user id."}},
                    "required": ["user_id"],
                },
            },
        }
    ]
)
PROMPT = (Message("system", "You are a retail agent."), Message("user", "My user id is u1. What is my name?"))


def test_the_cache_key_holds_the_tool_schemas():
    chat = json.dumps([m.to_chat() for m in PROMPT])
    plain = cache_key("m", None, chat, GenerationParams(16, 0.0, 0))
    with_tools = cache_key("m", None, chat, GenerationParams(16, 0.0, 0, TOOLS))
    other_tools = cache_key("m", None, chat, GenerationParams(16, 0.0, 0, TOOLS.replace("user id", "customer id")))
    assert len({plain, with_tools, other_tools}) == 3


class NoTools(Backend):
    name = "no-tools-server"

    def complete(self, messages, params):
        raise AssertionError("a refused run calls no model")


class NativeTask(EpisodicTask):
    name, default_grader, max_output_tokens = "native-tools-task", "exact-match", 8

    def load(self, limit, seed):
        yield Item(id="1", history=(), query=Message("user", "hi"), answer="")

    def episode(self, item, user):
        raise AssertionError("a refused run starts no episode")

    def native_tools(self):
        return True


def test_a_backend_without_native_tools_refuses_a_task_that_needs_them():
    plugin = types.SimpleNamespace(
        register_backends=hookimpl(lambda register: register(NoTools)),
        register_tasks=hookimpl(lambda register: register(NativeTask)),
        resolve_backend=hookimpl(lambda model: "no-tools-server" if model.startswith("no-tools/") else None),
    )
    config = RunConfig(task="native-tools-task", strategies=["truncation"], out=Path("unused"), model="no-tools/m")
    with pytest.raises(RunConfigError, match=r"backend 'no-tools-server' \(--model no-tools/m\) cannot send them"):
        RunPlugins(config, registry_with(plugin))
    assert LocalBackend.native_tools and LiteLLMBackend.native_tools and not Backend.native_tools


def test_without_tools_the_served_template_renders_as_smollm2s_own():
    from gguf import GGUFReader

    field = GGUFReader(str(default_model_path())).fields["tokenizer.chat_template"]
    own = bytes(field.parts[field.data[0]]).decode("utf-8")
    for messages in (PROMPT, PROMPT[1:], (*PROMPT, Message("assistant", "Hi"), Message("user", "and?"))):
        chat = [m.to_chat() for m in messages]
        rendered = [
            jinja2.Template(t).render(messages=chat, add_generation_prompt=True) for t in (own, SMOLLM2_TOOLS_TEMPLATE)
        ]
        assert rendered[0] == rendered[1]


def test_the_tool_block_is_counted_as_the_server_renders_and_counts_it(budgetbench_backend, budgetbench_counter):
    with_tools = budgetbench_counter.with_tools(TOOLS)
    counted, plain = with_tools.count(PROMPT), budgetbench_counter.count(PROMPT)
    assert counted > plain + 50  # the schemas are in the prompt
    assert "get_user_details" in with_tools.tokenizer.render(PROMPT)
    served = budgetbench_backend.complete(PROMPT, GenerationParams(1, 0.0, 0, TOOLS))
    assert served.prompt_tokens == counted and served.tool_calls is not None
    assert budgetbench_backend.complete(PROMPT, GenerationParams(1, 0.0, 0)).prompt_tokens == plain
