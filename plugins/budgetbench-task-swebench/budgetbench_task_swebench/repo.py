"""Repository files at an instance's ``base_commit``, read from a local clone without checking out.

The clone is never modified: file lists come from ``git ls-tree`` and contents from
``git cat-file --batch`` at the commit. Files are chosen in two ways: those the issue
text mentions (a path, a path suffix that names one file, or a dotted module), then
the best BM25 matches of the issue text among the remaining text files.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from budgetbench_core import TaskDataError

_WORDS = re.compile(r"[\w./-]+")
_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


@dataclass(frozen=True)
class RepoFile:
    """A file chosen as context: its text at the commit, why it was chosen, and its rank."""

    path: str
    text: str
    reason: str  # "mentioned" or "lexical"
    score: float | None


def _git(clone: Path, *args: str, stdin: bytes | None = None) -> bytes:
    done = subprocess.run(["git", "-C", str(clone), *args], input=stdin, capture_output=True, check=False)
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip()
        raise TaskDataError(f"git {' '.join(args[:3])} in {clone} failed: {error}")
    return done.stdout


def find_clone(cache: Path, repo: str) -> Path:
    """The clone of ``owner/name`` in ``cache``: ``owner__name``, ``owner/name`` or ``name``."""
    owner, _, name = repo.partition("/")
    candidates = [cache / f"{owner}__{name}", cache / owner / name, cache / name]
    for candidate in candidates:
        if (candidate / ".git").exists() or (candidate / "HEAD").is_file():
            return candidate
    raise TaskDataError(
        f"repo_cache {cache}: no git clone of {repo} (looked for {', '.join(str(c) for c in candidates)})"
    )


def tree(clone: Path, commit: str) -> dict[str, int]:
    """Every blob path at ``commit`` with its size in bytes."""
    if (
        subprocess.run(
            ["git", "-C", str(clone), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, check=False
        ).returncode
        != 0
    ):
        raise TaskDataError(f"{clone}: commit {commit} is not in this clone (fetch it, or clone the full history)")
    sizes = {}
    for entry in _git(clone, "ls-tree", "-r", "-l", "-z", commit).split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        mode, kind, _, size = meta.split()
        if kind == b"blob" and mode != b"120000":  # symlinks are not files to read
            sizes[path.decode("utf-8", errors="surrogateescape")] = int(size)
    return sizes


def read_texts(clone: Path, commit: str, paths: list[str]) -> dict[str, str]:
    """Contents of ``paths`` at ``commit``; binary (NUL bytes) or non-UTF-8 files are left out."""
    paths = [p for p in paths if "\n" not in p]
    request = "".join(f"{commit}:{path}\n" for path in paths).encode("utf-8", errors="surrogateescape")
    output = _git(clone, "cat-file", "--batch", stdin=request)
    texts, position = {}, 0
    for path in paths:
        header_end = output.index(b"\n", position)
        size = int(output[position:header_end].split()[2])
        body = output[header_end + 1 : header_end + 1 + size]
        position = header_end + 1 + size + 1
        if b"\0" in body:
            continue
        try:
            texts[path] = body.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def mentioned(text: str, paths: list[str]) -> list[str]:
    """Paths the text names, in order of first mention.

    A word counts when it is a path, a path suffix that ends exactly one path
    (``auth/forms.py``), or a dotted module (``django.contrib.auth.forms``, also with a
    trailing class or function name) that is a ``.py`` file or package.
    """
    known = set(paths)
    by_suffix: dict[str, list[str]] = {}
    for path in paths:
        parts = path.split("/")
        for start in range(1, len(parts)):
            by_suffix.setdefault("/".join(parts[start:]), []).append(path)
    found: list[str] = []
    for word in _WORDS.findall(text):
        word = word.strip(".-/")
        hits = []
        if word in known:
            hits = [word]
        elif len(by_suffix.get(word, [])) == 1 and "." in word:
            hits = by_suffix[word]
        elif _MODULE.fullmatch(word):
            parts = word.split(".")
            for end in range(len(parts), 1, -1):
                base = "/".join(parts[:end])
                hits = [p for p in (f"{base}.py", f"{base}/__init__.py") if p in known][:1]
                if hits:
                    break
        found.extend(hit for hit in hits if hit not in found)
    return found


def select_files(clone: Path, commit: str, issue: str, max_files: int, max_file_bytes: int) -> list[RepoFile]:
    """Mentioned files first, then the best lexical matches, up to ``max_files`` readable text files."""
    sizes = tree(clone, commit)
    candidates = sorted(p for p, size in sizes.items() if 0 < size <= max_file_bytes)
    texts = read_texts(clone, commit, candidates)
    chosen = [RepoFile(p, texts[p], "mentioned", None) for p in mentioned(issue, candidates) if p in texts]
    chosen = chosen[:max_files]
    rest = [p for p in candidates if p in texts and p not in {f.path for f in chosen}]
    room = max_files - len(chosen)
    if room > 0 and rest:
        corpus = [f"{path}\n{texts[path]}" for path in rest]
        import bm25s  # imports scipy: loaded when files are selected, not when the plugin is listed

        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
        query = bm25s.tokenize([issue], stopwords="en", show_progress=False)
        if query.vocab:
            indices, scores = retriever.retrieve(query, k=min(room, len(rest)), show_progress=False)
            chosen += [
                RepoFile(rest[int(i)], texts[rest[int(i)]], "lexical", float(s))
                for i, s in zip(indices[0], scores[0])
                if s > 0
            ]
    return chosen
