"""``--model local@<tokens>``: the embedded model served past its trained context with YaRN.

llama.cpp's server caps each slot at the model's trained context (8,192 for SmolLM2-135M) whatever
``n_ctx`` it is given, unless RoPE scaling is configured; the option gives it YaRN scaling by the
factor between the two, and is part of the model string (so of the run identity) and of the
reply cache's key (scaled RoPE changes replies).
"""

from __future__ import annotations

import httpx
import pytest

from budgetbench_core.testing import registered

Local = registered("backend", "local").obj


def test_the_context_option_is_in_the_model_string_the_cache_key_and_the_manifest():
    from budgetbench_core.builtin.local_backend import resolve_backend

    assert resolve_backend("local@16384") == "local" and resolve_backend("openai/x@16384") is None
    plain, scaled = Local("local"), Local("local@16384", max_context=16384 + 512)
    assert scaled.model_path == plain.model_path
    assert scaled.cache_identity() != plain.cache_identity()  # scaled RoPE: replies differ
    assert "rope_scaling" not in plain.describe()
    assert scaled.describe()["rope_scaling"] == {"type": "yarn", "trained_context": 8192, "context": 16384}
    assert scaled.preflight("--model", full=False).context_tokens == 16384
    with pytest.raises(ValueError, match="8192-token context"):
        Local("local", max_context=16384)
    with pytest.raises(ValueError, match="larger than the model's trained 8192"):
        Local("local@4096")


def slot_context(backend) -> int:
    backend.start()
    try:
        (slot,) = httpx.get(backend.server_url + "/slots", timeout=30).json()
        return slot["n_ctx"]
    finally:
        backend.stop()


@pytest.mark.slow
def test_the_server_caps_a_slot_at_the_trained_context_unless_the_option_scales_it():
    assert slot_context(Local("local", max_context=10240)) == 8192  # asked for 10,240, capped
    assert slot_context(Local("local@16384", max_context=16384)) == 16384
