"""A call the Python bindings refuse on one rank only (wrong dtype, layout,
size, a buffer that cannot be exported) is an error on every rank at once:
the refusing rank raises its own error, the others MismatchError naming it,
well before the timeout; the communicator is then broken on every rank
alike (AbortedError). Refused on every rank, it stays usable."""

import pytest

from conftest import assert_all_ok, run_ranks

# A peer that waits for the refusing rank would wait this long, then fail.
ENV = {"WORKER_TIMEOUT": "60"}


@pytest.mark.parametrize("size", [2, 3])
def test_refused_on_one_rank_fails_fast_everywhere(size):
    results = run_ranks("one_rank", size, env=ENV, worker="refusal_worker.py")
    assert_all_ok(results)
    for _, out in results:
        for name in ("allreduce_dtype", "async_dtype", "reduce_out_size", "alltoall_size",
                     "alltoallv_counts", "gather_out_size", "scatter_send_size",
                     "allgatherv_block_outside", "reduce_scatter_v_out", "async_type",
                     "scatter_out_readonly", "misbound_keyword", "misbound_count", "none_op",
                     "root_out_of_range", "split_color_type", "split_keyword",
                     "split_color_out_of_range"):
            assert f"{name} ok" in out, name


def test_refusal_behind_pending_requests_keeps_call_order():
    assert_all_ok(run_ranks("queued", 3, env=ENV, worker="refusal_worker.py"))


def test_refused_on_every_rank_keeps_the_communicator_usable():
    assert_all_ok(run_ranks("every_rank", 3, env=ENV, worker="refusal_worker.py"))


@pytest.mark.parametrize("size", [2, 3])
def test_peers_error_names_the_rank_and_the_problem(size):
    """A wrong output shape on rank 1 (reduce_scatter, allgather, allreduce's
    out): the peers' MismatchError comes within seconds although the timeout
    is 60 s, and carries rank 1's own reason."""
    results = run_ranks("told_why", size, env=ENV, worker="refusal_worker.py")
    assert_all_ok(results)
    for _, out in results:
        for name in ("reduce_scatter_out", "allgather_out", "async_allgather_out",
                     "allreduce_out_dtype"):
            assert f"{name} ok" in out, name


def test_refused_while_another_thread_runs_a_collective():
    """A call refused on one thread while another runs a collective raises on
    that thread only: nothing is told to the peers mid-collective."""
    results = run_ranks("busy_thread", 2, env=ENV, worker="refusal_worker.py")
    assert_all_ok(results)
    assert all("busy thread ok" in out for _, out in results)
