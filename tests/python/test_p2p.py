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


@pytest.mark.parametrize("cma", ["auto", "0"])
@pytest.mark.parametrize("scenario", ["failed_send", "dropped_request", "dropped_irecv"])
def test_send_ended_early_is_never_delivered(scenario, cma):
    """A send that timed out, or whose Request was dropped, is not delivered
    later (not from its reused buffer): the late recv raises. A dropped irecv
    is never matched by a later send: the send raises at once. Single copy on
    and off."""
    env = {"SHMRING_TIMEOUT": "1"}
    if cma == "0":
        env["SHMRING_CMA"] = "0"
    assert_all_ok(run_worker(scenario, 2, env=env))
