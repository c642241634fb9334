"""The processes under a worker, read from /proc: the kernel's per-thread lists of children,
or, on a kernel built without them (``CONFIG_PROC_CHILDREN``), every process's parent."""

from __future__ import annotations

import subprocess
import time

import pytest

from budgetbench_core.host import process_tree


@pytest.fixture
def tree():
    """A shell with two sleeping children, one of which has a child of its own."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sh -c 'sleep 60 & wait' & wait"])
    try:
        for _ in range(200):  # until the grandchild exists
            if len(process_tree.descendants(shell.pid)) == 3:
                break
            time.sleep(0.01)
        yield shell.pid
    finally:
        for pid in reversed(process_tree.descendants(shell.pid)):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        shell.kill()
        shell.wait()


def test_the_kernels_lists_and_the_parents_scan_find_the_same_processes(tree, monkeypatch):
    assert process_tree.KERNEL_LISTS_CHILDREN  # this machine's kernel keeps them
    listed = process_tree.descendants(tree)
    assert len(listed) == 3 and len(process_tree.children(tree)) == 2
    assert sorted(process_tree.children_by_parent(tree)) == sorted(process_tree.children(tree))
    monkeypatch.setattr(process_tree, "KERNEL_LISTS_CHILDREN", False)  # a kernel without them
    assert sorted(process_tree.descendants(tree)) == sorted(listed)


def test_a_process_that_is_gone_has_no_children_either_way(monkeypatch):
    finished = subprocess.Popen(["true"])
    finished.wait()
    assert process_tree.children(finished.pid) == [] == process_tree.children_by_parent(finished.pid)
    monkeypatch.setattr(process_tree, "KERNEL_LISTS_CHILDREN", False)
    assert process_tree.descendants(finished.pid) == []
