"""Unmodified DistributedDataParallel over the shmring backend: after a few
steps the parameters are bitwise identical on every rank and equal gloo's
within 1e-6, with no hook, allreduce_hook, fp16_compress_hook, PowerSGD,
small buckets, gradient_as_bucket_view with static_graph,
find_unused_parameters and BatchNorm buffers. Buffers
(BatchNorm's running statistics) are broadcast from rank 0 at the start of
every forward, then each rank's forward updates its own: they equal gloo's
rank by rank."""

import pytest
import torch

from conftest import assert_all_ok, finish_job, start_job

SIZE = 2
CONFIGS = ["plain", "small_buckets", "bucket_view", "allreduce_hook", "fp16_hook", "powersgd", "unused",
           "batchnorm"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    # Both jobs at once: on 2 cores that halves the wall time.
    shm = start_job("ddp", SIZE, tmp, backend="shmring", tag="shmring")
    gloo = start_job("ddp", SIZE, tmp, backend="gloo", tag="gloo",
                     env={"GLOO_SOCKET_IFNAME": "lo"})
    rs, rg = finish_job(shm), finish_job(gloo)
    assert_all_ok(rs)
    assert_all_ok(rg)
    return tmp


def load(tmp, backend, config, rank):
    return torch.load(tmp / backend / f"{config}_rank{rank}.pt")


@pytest.mark.parametrize("config", CONFIGS)
def test_ddp_matches_gloo(runs, config):
    ref = load(runs, "shmring", config, 0)["params"]
    for rank in range(1, SIZE):
        other = load(runs, "shmring", config, rank)["params"]
        assert all(torch.equal(a, b) for a, b in zip(ref, other)), \
            f"{config}: rank {rank}'s parameters differ from rank 0's"
    for rank in range(SIZE):
        shm, gloo = load(runs, "shmring", config, rank), load(runs, "gloo", config, rank)
        for kind in ("params", "buffers"):
            assert len(shm[kind]) == len(gloo[kind])
            for i, (a, b) in enumerate(zip(shm[kind], gloo[kind])):
                diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
                assert diff <= 1e-6, \
                    f"{config}: rank {rank}'s {kind}[{i}] differs from gloo's by {diff}"
