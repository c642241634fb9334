"""The embedded server's tokenizer id on every row is stable across runs (issue: a random port in it)."""

from __future__ import annotations

import pytest

from budgetbench_core.testing import embedded_backend, embedded_model_file, tokenizer_for


@pytest.mark.slow
def test_the_embedded_tokenizer_is_named_by_its_model_not_its_port():
    """Each run's embedded server listens on a port of its own: the tokenizer id on every row
    names the model file instead, so the rows of two identical runs are identical."""
    ids, urls = [], []
    for _ in range(2):
        with embedded_backend() as backend:
            urls.append(backend.server_url)
            ids.append(tokenizer_for("server", backend).info.id)
    assert urls[0] != urls[1], "both servers got the same port: the test shows nothing"
    assert ids[0] == ids[1] == f"server:embedded:{embedded_model_file().name}"
