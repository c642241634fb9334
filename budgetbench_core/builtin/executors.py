"""The built-in ``thread`` executor (today's behaviour), registered like any plugin's."""

import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from budgetbench_core import Executor, Job, Unit, hookimpl


class ThreadExecutor(Executor):
    """``max_concurrency`` threads in this process, each taking the next unit when it is free."""

    name = "thread"
    description = "Worker threads in the driver process (the default)"

    def execute(self, job: Job) -> None:
        lock = threading.Lock()

        def next_unit() -> Unit | None:
            with lock:  # a task's load generator is not thread-safe
                return None if job.stop.is_set() else next(job.units, None)

        def work() -> None:
            while (unit := next_unit()) is not None:
                job.run_here(unit)

        pool = ThreadPoolExecutor(max_workers=max(1, job.max_concurrency))
        try:
            futures = [pool.submit(work) for _ in range(max(1, job.max_concurrency))]
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for future in finished:
                future.result()
        except BaseException:
            job.stop.set()  # Ctrl+C or a harness bug: the other threads finish their cell and stop
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


@hookimpl
def register_executors(register):
    register(ThreadExecutor)
