"""BM25 scores of units against a query, with the bm25s library (English stopwords removed)."""

from __future__ import annotations

import numpy as np


def bm25_scores(texts: list[str], query: str) -> np.ndarray:
    """One BM25 score per text; all zeros when the query shares no term with any text."""
    import bm25s  # imports scipy: loaded when a strategy ranks, not when the plugin is listed

    query_terms = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
    if not texts or not query_terms:
        return np.zeros(len(texts))
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    known = [term for term in query_terms if term in retriever.vocab_dict]
    return np.asarray(retriever.get_scores(known), dtype=float) if known else np.zeros(len(texts))
