"""Collectives across real processes, one per rank (rank_worker.py)."""

import pytest

from conftest import assert_all_ok, run_ranks


@pytest.mark.parametrize("size", [2, 3])
def test_every_datatype_and_operator(size):
    """numpy and torch buffers of every datatype (bfloat16, float16 included)
    and every operator, at edge counts, reduce in place to the right values,
    bitwise identical on every rank."""
    assert_all_ok(run_ranks("collectives", size))


@pytest.mark.parametrize("size", [2, 3])
def test_collective_family(size):
    """reduce_scatter, allgather, broadcast, reduce, barrier, split."""
    assert_all_ok(run_ranks("family", size))


def test_mismatch_is_reported_on_every_rank():
    assert_all_ok(run_ranks("mismatch", 3))


def test_peer_failure():
    results = run_ranks("peer_failure", 3)
    assert_all_ok(results)


def test_timeout_maps_to_timeout_error():
    assert_all_ok(run_ranks("timeout", 2, per_rank_env={0: {"WORKER_TIMEOUT": "2"}}))


def test_ctrl_c_ends_a_wait_on_a_peer():
    """SIGINT while a blocking allreduce waits for a late peer raises
    KeyboardInterrupt at once, not after the timeout; the peer's collective
    fails with AbortedError naming the interrupt."""
    assert_all_ok(run_ranks("interrupt", 2))


@pytest.mark.parametrize("timed", ["0", "1"])
def test_ctrl_c_ends_a_request_wait(timed):
    """SIGINT while Request.wait() (untimed or timed) waits on a non-blocking
    allreduce that a late peer holds up raises KeyboardInterrupt at once; the
    request then fails with AbortedError, the peer's collective too."""
    assert_all_ok(run_ranks("interrupt_request", 2, env={"WORKER_TIMED": timed}))


def test_gil_released_during_collective():
    """A second Python thread runs (and runs a collective on a second
    communicator) while the first waits inside allreduce."""
    assert_all_ok(run_ranks("gil", 2, env={"WORKER_TIMEOUT": "10"}))
