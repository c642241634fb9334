"""``--shard i/N``: every unit in exactly one shard, the same on every machine and process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from budgetbench_core.shards import Shard, ShardError, unit_hash

KEYS = [("synthetic-memory", s, f"synth-{i:05d}") for s in ("truncation", "recency", "rag") for i in range(1000)]


def test_every_unit_is_in_exactly_one_shard_and_shards_are_balanced():
    shards = [Shard(i, 3) for i in (1, 2, 3)]
    owners = [[s.index for s in shards if s.owns(*key)] for key in KEYS]
    assert all(len(o) == 1 for o in owners)
    sizes = [sum(o == [i] for o in owners) for i in (1, 2, 3)]
    assert all(abs(size - 1000) < 100 for size in sizes), sizes


def test_partition_is_fixed_by_the_key_alone():
    """Pinned values: a change of hash would silently re-split a half-finished sharded run."""
    assert unit_hash("synthetic-memory", "truncation", "synth-00000") == 16598121596364653724
    assert [
        unit_hash("synthetic-memory", s, f"synth-{i:05d}") % 3 + 1 for s in ("truncation", "recency") for i in range(4)
    ] == [1, 2, 3, 2, 1, 2, 2, 2]
    # Another process with another str hash seed computes the same partition.
    code = (
        "from budgetbench_core.shards import Shard; "
        "print(sum(Shard(2, 3).owns('synthetic-memory', 'recency', f'synth-{i:05d}') for i in range(1000)))"
    )
    here = sum(Shard(2, 3).owns("synthetic-memory", "recency", f"synth-{i:05d}") for i in range(1000))
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert int(other.stdout) == here


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "a/b", "3", "-1/3", ""])
def test_bad_shard_specs_are_refused_with_the_expected_form(text):
    with pytest.raises(ShardError, match=r"i/N|does not exist"):
        Shard.parse(text)


def test_one_shard_of_one_is_the_whole_run():
    assert all(Shard.parse(" 1 / 1 ").owns(*key) for key in KEYS[:50])
    assert str(Shard.parse("2/5")) == "2/5"
