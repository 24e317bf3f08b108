"""send/recv between real processes, one per rank (p2p_worker.py)."""

import pytest

from conftest import assert_all_ok, run_ranks


def run_worker(scenario, size, env=None):
    return run_ranks(scenario, size, env=env, worker="p2p_worker.py", tag="p2p-" + scenario)


@pytest.mark.parametrize("size", [2, 3])
def test_ring_every_path(size):
    assert_all_ok(run_worker("ring", size))


def test_ring_staged_only():
    """SHMRING_CMA=0: no single-copy reads, the same results."""
    assert_all_ok(run_worker("ring", 2, env={"SHMRING_CMA": "0"}))


def test_argument_errors_and_mismatch_on_both_ranks():
    assert_all_ok(run_worker("errors", 2))
