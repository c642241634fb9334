"""The metering gateway: a plugin's own OpenAI client, pointed at it, is counted, budgeted,
attributed to its cell and phase, and cut off when its token is revoked; and pricing."""

from __future__ import annotations

import base64
import http.client
import json
import math
import struct
import threading
import time
from collections.abc import Iterator

import openai
import pytest

from budgetbench_core import Message
from budgetbench_core.builtin.litellm_backend import LiteLLMBackend, _litellm
from budgetbench_core.host.gateway import MeteringGateway
from budgetbench_core.host.pricing import PriceError, parse_price, price_for
from budgetbench_core.model_calls import ModelCaller
from budgetbench_core.testing import FaultServer, tokenizer_for
from budgetbench_core.tokenizers import PromptCounter

QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is Paris in France?"}]


@pytest.fixture(scope="module")
def counter() -> PromptCounter:
    return PromptCounter(tokenizer_for("tiktoken:cl100k_base"))


def served_count(counter: PromptCounter):
    return lambda messages: counter.count([Message(m["role"], m["content"]) for m in messages])


class Harness:
    """A gateway whose forward is the harness's model caller on a loopback fake server."""

    def __init__(self, server: FaultServer, counter: PromptCounter, **options) -> None:
        backend = LiteLLMBackend("openai/fault-model", api_base=server.url, timeout_s=10)
        caller = ModelCaller(backend, None, 4, retries=0)
        self.server = server
        self.records: list = []
        self.gateway = MeteringGateway(
            lambda messages, params: caller.call(messages, params).completion,
            counter.count,
            self.records.append,
            **options,
        )
        self.url = self.gateway.start()

    def client(self, token: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.url_for(token), api_key="unused", max_retries=2)


@pytest.fixture
def harness(counter) -> Iterator[Harness]:
    with FaultServer(count_prompt=served_count(counter)) as server:
        harness = Harness(server, counter)
        yield harness
        harness.gateway.stop()


def test_a_plugins_own_client_is_counted_and_attributed_to_its_cell_and_phase(harness, counter):
    token = harness.gateway.grant("item-3@512/mem0", "write")
    reply = harness.client(token).chat.completions.create(
        model="gpt-4o-mini", messages=QUESTION, max_tokens=8, response_format={"type": "json_object"}
    )
    assert reply.choices[0].message.content in {"Paris", "France", "Be"}
    (record,) = harness.records
    exact = counter.count([Message(m["role"], m["content"]) for m in QUESTION])
    assert (record.kind, record.cell, record.phase, record.endpoint) == (
        "call",
        "item-3@512/mem0",
        "write",
        "chat.completions",
    )
    assert (record.input_tokens, record.served_prompt_tokens, record.completion_tokens) == (exact, exact, 1)
    assert record.ok and record.status == 200 and record.model == "gpt-4o-mini" and record.latency_s > 0
    assert record.ignored == ("response_format",)  # accepted, not forwarded, and said so
    assert reply.usage.prompt_tokens == exact
    assert harness.server.completions() == 1


def test_the_token_as_bearer_api_key_works_on_plain_paths_and_a_wrong_one_reaches_nothing(harness):
    token = harness.gateway.grant("cell-a", "read")
    client = openai.OpenAI(base_url=harness.url + "/v1", api_key=token)
    client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4)
    assert [m.id for m in client.models.list().data] == ["budgetbench"]
    with pytest.raises(openai.PermissionDeniedError, match="unknown or revoked token"):
        openai.OpenAI(base_url=harness.url + "/v1", api_key="guessed").chat.completions.create(
            model="m", messages=QUESTION
        )
    assert [(r.kind, r.phase) for r in harness.records] == [("call", "read"), ("refused", None)]
    assert harness.records[1].token == "guessed" and harness.records[1].status == 403
    assert harness.server.completions() == 1


def test_a_revoked_token_never_reaches_the_server(harness):
    token = harness.gateway.grant("cell-b", "answer")
    client = harness.client(token)
    client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4)
    harness.gateway.revoke(token)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4)
    assert harness.server.completions() == 1  # the SDK was told not to retry, and nothing was forwarded
    assert [r.kind for r in harness.records] == ["call", "refused"]


def test_revoking_waits_for_a_call_being_forwarded_and_its_record(counter):
    """A call sent just before its cell's ``apply`` ended is recorded before the token is
    revoked (so on that cell's row). Old code: revoke returned at once and the record came
    0.5 s later, after the cell's row, where nothing counted what the server had seen."""
    with FaultServer(count_prompt=served_count(counter), latency_s=0.5) as server:
        harness = Harness(server, counter)
        token = harness.gateway.grant("cell-c", "aux", budget=500)
        sending = threading.Thread(
            target=lambda: harness.client(token).chat.completions.create(model="m", messages=QUESTION, max_tokens=4)
        )
        sending.start()
        deadline = time.monotonic() + 5
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.requests  # the call is at the server now
        harness.gateway.revoke(token)
        assert [(r.kind, r.cell, r.ok) for r in harness.records] == [("call", "cell-c", True)]
        sending.join()
        harness.gateway.stop()


def test_a_stopped_gateway_refuses_even_on_a_connection_kept_open(harness):
    token = harness.gateway.grant("cell-c", "aux")
    connection = http.client.HTTPConnection("127.0.0.1", int(harness.url.rsplit(":", 1)[1]), timeout=5)
    body = json.dumps({"messages": QUESTION, "max_tokens": 4})
    connection.request("POST", f"/t/{token}/v1/chat/completions", body)
    assert connection.getresponse().read() and harness.server.completions() == 1
    harness.gateway.stop()
    connection.request("POST", f"/t/{token}/v1/chat/completions", body)
    response = connection.getresponse()
    assert response.status == 403 and b"stopped" in response.read()
    assert harness.server.completions() == 1


def test_a_prompt_over_the_grants_budget_is_a_violation_and_not_sent(harness, counter):
    exact = counter.count([Message(m["role"], m["content"]) for m in QUESTION])
    client = harness.client(harness.gateway.grant("cell-d", "aux", budget=exact - 1))
    with pytest.raises(openai.BadRequestError, match=f"{exact} tokens, over the budget of {exact - 1}"):
        client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4)
    harness.client(harness.gateway.grant("cell-d", "aux", budget=exact)).chat.completions.create(
        model="m", messages=QUESTION, max_tokens=4
    )
    assert [(r.kind, r.input_tokens, r.budget) for r in harness.records] == [
        ("violation", exact, exact - 1),
        ("call", exact, exact),
    ]
    assert harness.server.completions() == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"stream": True}, "stream is not supported"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools is not supported"),
        ({"n": 2}, "n=2 is not supported"),
    ],
)
def test_requests_the_gateway_cannot_answer_faithfully_are_refused(harness, extra, message):
    client = harness.client(harness.gateway.grant("cell-e", "answer"))
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4, **extra)
    assert [r.kind for r in harness.records] == ["invalid"]
    assert harness.server.completions() == 0


def test_malformed_messages_name_the_field(harness):
    client = harness.client(harness.gateway.grant("cell-f", "answer"))
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]\.role must be one of"):
        client.chat.completions.create(model="m", messages=[QUESTION[0], {"role": "tool", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content must be a string"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}]
        )
    assert harness.server.completions() == 0


def test_missing_usage_stays_missing_never_zero(counter):
    with FaultServer(rate=1.0, faults=("no_usage",), count_prompt=served_count(counter)) as server:
        harness = Harness(server, counter)
        reply = harness.client(harness.gateway.grant("cell-g", "write")).chat.completions.create(
            model="m", messages=QUESTION, max_tokens=4
        )
        harness.gateway.stop()
    (record,) = harness.records
    assert record.ok and record.served_prompt_tokens is None and record.completion_tokens is None
    assert record.input_tokens == counter.count([Message(m["role"], m["content"]) for m in QUESTION])
    assert reply.usage is None


def test_a_failed_model_call_is_recorded_and_not_retried_by_the_plugins_sdk(counter):
    with FaultServer(rate=1.0, faults=("400",), count_prompt=served_count(counter)) as server:
        harness = Harness(server, counter)
        with pytest.raises(openai.APIStatusError) as failure:
            harness.client(harness.gateway.grant("cell-h", "read")).chat.completions.create(
                model="m", messages=QUESTION, max_tokens=4
            )
        harness.gateway.stop()
    assert failure.value.status_code == 502
    assert server.completions() == 1  # max_retries=2 on the client, yet one request: x-should-retry
    (record,) = harness.records
    assert (record.kind, record.ok, record.status) == ("call", False, 502) and "injected 400" in record.error


def test_embeddings_without_a_model_answer_501_and_with_one_in_both_encodings(counter):
    with FaultServer() as server:
        bare = Harness(server, counter)
        client = bare.client(bare.gateway.grant("cell-i", "write"))
        with pytest.raises(openai.APIStatusError, match="serves no embedding model") as failure:
            client.embeddings.create(model="e", input="hello")
        assert failure.value.status_code == 501
        bare.gateway.stop()

        vectors = {"alpha": [0.25, -1.5, 3.0], "beta": [1.0, 0.0, -0.125]}
        harness = Harness(
            server, counter, embed=lambda texts: [vectors[t] for t in texts], count_text=counter.content_tokens
        )
        client = harness.client(harness.gateway.grant("cell-i", "write"))
        reply = client.embeddings.create(model="e", input=["alpha", "beta"])  # the SDK asks for base64
        assert [d.embedding for d in reply.data] == [vectors["alpha"], vectors["beta"]]
        raw = http.client.HTTPConnection("127.0.0.1", int(harness.url.rsplit(":", 1)[1]), timeout=5)
        raw.request(
            "POST", f"/t/{harness.gateway.grant('cell-i', 'read')}/v1/embeddings", json.dumps({"input": "beta"})
        )
        assert json.loads(raw.getresponse().read())["data"][0]["embedding"] == vectors["beta"]
        harness.gateway.stop()
    assert base64.b64decode(base64.b64encode(struct.pack("<3f", *vectors["alpha"])))  # float32-exact values
    assert [(r.endpoint, r.phase, r.input_tokens, r.completion_tokens) for r in harness.records] == [
        ("embeddings", "write", counter.content_tokens("alpha") + counter.content_tokens("beta"), 0),
        ("embeddings", "read", counter.content_tokens("beta"), 0),
    ]
    assert bare.records[0].status == 501 and server.completions() == 0


def test_grant_names_the_phases_and_tokens_are_unguessable(harness):
    with pytest.raises(ValueError, match="unknown phase 'ingest'; phases are write, read, answer, aux, judge, user"):
        harness.gateway.grant("cell", "ingest")
    tokens = {harness.gateway.grant("cell", "user") for _ in range(100)}
    assert len(tokens) == 100 and min(len(t) for t in tokens) >= 32


# ---------------------------------------------------------------------- pricing


def test_every_dollar_figure_is_tokens_times_the_price():
    price = parse_price("0.15/0.6")
    rows = [(1_000, 200), (8_192, 0), (1, 1), (123_456, 7_890)]
    for input_tokens, output_tokens in rows:
        assert price.cost(input_tokens, output_tokens) == pytest.approx(
            input_tokens * 0.15 / 1e6 + output_tokens * 0.6 / 1e6, rel=1e-12
        )
    assert price.cost(None, 5) is None and price.cost(5, None) is None  # missing stays missing
    assert price_for("local:/models/x.gguf", "2/8").cost(10**6, 10**6) == pytest.approx(10.0, rel=1e-12)


@pytest.mark.parametrize("text", ["0.15", "a/b", "1/2/3", "-1/2", "inf/1"])
def test_a_bad_price_names_the_option_and_the_value(text):
    with pytest.raises(PriceError, match=rf"--price {text!r}"):
        parse_price(text)


def test_litellms_cost_map_prices_known_models_and_the_embedded_model_has_none():
    info = _litellm().model_cost["gpt-4o-mini"]
    price = price_for("gpt-4o-mini")
    assert price is not None and price.source == "litellm:gpt-4o-mini"
    assert price.cost(1000, 100) == 1000 * info["input_cost_per_token"] + 100 * info["output_cost_per_token"]
    assert price_for("local") is None and price_for("openai/no-such-model-anywhere") is None
    assert not math.isnan(price_for("gpt-4o-mini", "0/0").cost(5, 5))


@pytest.mark.slow
def test_an_openai_client_through_the_gateway_on_the_embedded_model_is_counted_exactly(local_backend, server_counter):
    caller = ModelCaller(local_backend, None, 1)
    records: list = []
    gateway = MeteringGateway(
        lambda messages, params: caller.call(messages, params).completion, server_counter.count, records.append
    )
    gateway.start()
    try:
        client = openai.OpenAI(base_url=gateway.url_for(gateway.grant("item-1@512/mem0", "write", 512)), api_key="x")
        reply = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=8, seed=1)
    finally:
        gateway.stop()
    (record,) = records
    assert reply.choices[0].message.content
    assert record.input_tokens == record.served_prompt_tokens == reply.usage.prompt_tokens  # the audit holds
    assert 0 < record.completion_tokens <= 8 and record.phase == "write"
