"""The staged collectives' single-copy round from Python (single_copy_worker.py):
numpy arrays of odd element sizes and unaligned data, async_op with dropped
references, one rank with SHMRING_CMA=0, and N=3 (oversubscribed on 2 CPUs)."""

import pytest

from conftest import assert_all_ok, run_ranks


@pytest.mark.parametrize("size,off", [(2, None), (2, 0), (2, 1), (3, None)])
def test_sweep_against_reference(size, off):
    per_rank = {off: {"SHMRING_CMA": "0"}} if off is not None else None
    assert_all_ok(run_ranks("sweep", size, per_rank_env=per_rank, worker="single_copy_worker.py",
                            tag="cma-sweep"))


def test_async_send_array_dropped_at_once():
    assert_all_ok(run_ranks("temporaries", 2, worker="single_copy_worker.py", tag="cma-temp"))
