"""FailFast's probe: one call at a time until the first success, then every waiting call at once."""

from __future__ import annotations

import threading

from budgetbench_core.failfast import FailFast


def test_calls_waiting_behind_the_first_success_go_out_together():
    fail_fast = FailFast()
    first_inside, release_first = threading.Event(), threading.Event()
    inside = threading.Semaphore(0)
    both_in = threading.Barrier(3, timeout=30)  # the two waiters and this thread

    def first():
        with fail_fast.probe():
            first_inside.set()
            release_first.wait(30)
            fail_fast.succeeded()  # as ModelCaller does, before the probe is left

    def waiter():
        with fail_fast.probe():
            inside.release()
            both_in.wait()  # breaks (BrokenBarrierError) if the waiters were let in one at a time

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert first_inside.wait(30)
    waiters = [threading.Thread(target=waiter) for _ in range(2)]
    for thread in waiters:
        thread.start()
    assert not inside.acquire(timeout=0.2)  # nobody passes while the first call is unproven
    release_first.set()
    both_in.wait()  # both waiters are inside the probe at the same time
    for thread in [*threads, *waiters]:
        thread.join(30)
    assert fail_fast._proven


def test_before_any_success_calls_go_one_at_a_time():
    fail_fast = FailFast()
    active, most = [0], [0]
    lock = threading.Lock()

    def call():
        with fail_fast.probe():
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            threading.Event().wait(0.01)
            with lock:
                active[0] -= 1

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most[0] == 1  # no call succeeded, so the probe never opened
