"""Non-blocking collectives (async_op=True) across real processes, one per
rank (nonblocking_worker.py)."""

import pytest

from conftest import assert_all_ok, run_ranks


def run_worker(scenario, size, timeout=240, env=None):
    return run_ranks(scenario, size, timeout=timeout, worker="nonblocking_worker.py",
                     tag="nb-" + scenario, env=env)


@pytest.mark.parametrize("size", [2, 3])
def test_every_collective_async_equals_blocking(size):
    """numpy and torch buffers, all requests in flight, waited in reverse."""
    assert_all_ok(run_worker("family", size))


def test_wait_timeout_and_is_completed():
    assert_all_ok(run_worker("timeout", 2))


def test_errors_reach_wait_on_every_rank():
    assert_all_ok(run_worker("errors", 3))


def test_dropped_request_error_is_not_swallowed():
    """Dropping an unfinished Request never hides its error: a RuntimeWarning
    names it, and the communicator keeps it (next call: AbortedError)."""
    assert_all_ok(run_worker("dropped", 3))
    assert_all_ok(run_worker("dropped_timeout", 2, env={"SHMRING_TIMEOUT": "5"}))


def test_finalize_after_pending_calls():
    assert_all_ok(run_worker("finalize", 3))


def test_gil_released_while_waiting():
    assert_all_ok(run_worker("gil", 2))


def test_single_rank_request_api(job_id):
    import numpy as np
    import shmring

    with shmring.Communicator(rank=0, size=1, job_id=job_id) as c:
        a = np.arange(10, dtype=np.float32)
        out = np.zeros_like(a)
        r = c.allreduce(a, out=out, async_op=True)
        assert isinstance(r, shmring.Request)
        assert r.wait() is True and r.is_completed() and r.result is out
        assert np.array_equal(out, a)
        assert c.barrier(async_op=True).wait(timeout=5) is True
        with pytest.raises(ValueError, match="avg"):
            c.allreduce(np.arange(3, dtype=np.int32), shmring.ReduceOp.AVG, async_op=True)
