"""The staged collectives through the torch.distributed backend "shmring":
all_to_all_single (even and uneven splits), all_to_all, gather, scatter,
all_gather and reduce_scatter with uneven sizes (real processes, one per
rank; tests/torch/coll_worker.py holds the checks)."""

import pytest

from conftest import HERE, assert_all_ok, run_job

COLL_WORKER = HERE / "coll_worker.py"


@pytest.mark.parametrize("size", [2, 3])
def test_collectives_against_references(tmp, size):
    """Every mapped operation, every dtype (and bool, int16, complex64 moved
    as bytes), every root, uneven splits with zeros, non-contiguous tensors,
    async Works, large counts; bad arguments refused on the calling rank."""
    results = run_job("all", size, tmp, worker=COLL_WORKER)
    assert_all_ok(results)
    for _, out in results:
        for word in ("alltoall ok", "gather_scatter ok", "uneven ok", "coll refusals ok"):
            assert word in out


def test_split_size_mismatch_is_an_error_on_every_rank(tmp):
    results = run_job("mismatch", 2, tmp, worker=COLL_WORKER)
    assert_all_ok(results)


@pytest.mark.parametrize("size", [2, 3])
def test_dtypes_moved_as_bytes_are_compared_across_ranks(tmp, size):
    """complex128 broadcast into complex64 of the same bytes, or int16
    gathered with bool: an error naming both dtypes on every rank, nothing
    moved, the group usable; uint8 against bool: a mismatch on every rank."""
    results = run_job("bytes_dtypes", size, tmp, worker=COLL_WORKER)
    assert_all_ok(results)
    for _, out in results:
        assert "coll bytes dtypes ok" in out
