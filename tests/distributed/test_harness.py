"""The test harness itself: a worker's report reaches the test whatever its size."""
import time

from tests.distributed.harness import spawn


def _large_report(rank, port, queue, size):
    queue.put((rank, b"x" * size))


def test_a_report_larger_than_the_pipe_is_read_before_the_workers_are_joined():
    # A child that put more than the pipe holds cannot exit until someone reads it:
    # joining first would wait out the whole timeout and call the worker hung.
    size = 8 << 20
    t0 = time.monotonic()
    codes, reports = spawn(_large_report, 2, args=(size,), timeout_s=20.0)
    assert codes == [0, 0]
    assert [len(r) for r in reports] == [size, size]
    assert time.monotonic() - t0 < 15.0
