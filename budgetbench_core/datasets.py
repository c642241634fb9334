"""Official datasets, the contract: what a task plugin declares with ``register_datasets``
(where each file comes from, where its task reads it), so the core names none of them.
Where the files live and how a task finds them is ``data_files``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Dataset:
    """A dataset's official files, where they come from and where its task reads them.

    ``files`` maps a file in the repository ``repo`` to its local name under
    ``data_dir()/folder`` (a relative path: ``retail/db.json`` for a task that reads one
    folder per domain); ``name`` is what ``budgetbench data fetch`` takes. By default
    ``repo`` is a Hugging Face hub dataset. With ``commit`` it is a GitHub repository pinned
    at that commit: ``data fetch`` downloads each file from it and keeps it only if its
    SHA-256 is the one in ``sha256`` (required for every file), after showing ``licence``.
    ``manual``, for files that cannot be fetched for the user, says where to get them and on
    what terms: ``data fetch`` then prints it with where each file goes, and downloads nothing.
    """

    name: str
    repo: str
    folder: str
    files: dict[str, str] = field(default_factory=dict)
    description: str = ""
    manual: str = ""
    commit: str = ""
    sha256: dict[str, str] = field(default_factory=dict)
    licence: str = ""

    def url(self, remote: str) -> str:
        """Where ``data fetch`` downloads ``remote`` from (the pinned commit on GitHub, else the hub)."""
        if self.commit:
            return f"https://raw.githubusercontent.com/{self.repo}/{self.commit}/{remote}"
        return f"https://huggingface.co/datasets/{self.repo}/resolve/main/{remote}"

    def __post_init__(self) -> None:
        problems = [
            f"{attr} must be a non-empty string"
            for attr in ("name", "repo", "folder")
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr)
        ]
        if not self.files or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in self.files.items()
        ):
            problems.append("files must map hub file names to local file names")
        elif any(not _relative_inside(v) for v in self.files.values()):
            problems.append(
                "local file names must not contain folders that leave the dataset's folder (no root, no '..')"
            )
        if self.commit:
            if not re.fullmatch(r"[0-9a-f]{40}", self.commit):
                problems.append(
                    "commit must be a full 40-hex-digit commit id (a pinned download never follows a branch)"
                )
            unchecked = sorted(set(self.files) - set(self.sha256))
            if unchecked:
                problems.append(f"sha256 must give the digest of every file (missing: {', '.join(unchecked)})")
            bad = sorted(k for k, v in self.sha256.items() if not re.fullmatch(r"[0-9a-f]{64}", str(v)))
            if bad:
                problems.append(f"sha256 digests must be 64 lower-case hex digits ({', '.join(bad)})")
        elif self.sha256:
            problems.append("sha256 needs commit: checksums pin the files of one commit")
        if problems:
            raise ValueError(f"Dataset {self.name!r}: {'; '.join(problems)}")


def _relative_inside(name: str) -> bool:
    """``name`` is a plain relative path (``db.json``, ``retail/db.json``): no root, no ``..``."""
    parts = PurePosixPath(name).parts
    return bool(parts) and "\\" not in name and not PurePosixPath(name).is_absolute() and ".." not in parts
