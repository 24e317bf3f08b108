"""The staged collectives from Python (numpy, zero copy) across real
processes, one per rank (collective_set_worker.py): alltoall, alltoallv,
gather, scatter, allgatherv, reduce_scatter_v, blocking and async_op, and
their argument and mismatch errors."""

import pytest

from conftest import assert_all_ok, run_ranks


def run_worker(scenario, size):
    return run_ranks(scenario, size, worker="collective_set_worker.py", tag="set-" + scenario)


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("scenario", ["alltoall", "alltoallv", "gather_scatter", "allgatherv",
                                      "reduce_scatter_v"])
def test_collective_against_reference(scenario, size):
    assert_all_ok(run_worker(scenario, size))


def test_errors_name_the_values():
    assert_all_ok(run_worker("errors", 3))
