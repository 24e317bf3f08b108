"""A collective the torch backend refuses on one rank only (unsupported
operator or operation, a tensor not on the CPU, several tensors per list,
sizes that disagree) is an error on every rank at once, never a wait until
the timeout: the refusing rank raises the backend's RuntimeError, the
others shmring's mismatch naming it; the group is then broken on every
rank. A group whose ranks are on two hosts works (shmring inside each host,
gloo between them)."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import HERE, assert_all_ok, finish_job

WORKER = HERE / "refusal_worker.py"


def start(scenario, size, tmp, wrap=None, env=None):
    store = tmp / f"{scenario}.store"
    procs = []
    for rank in range(size):
        cmd = [sys.executable, str(WORKER), scenario, str(rank), str(size), f"file://{store}",
               str(tmp)]
        if wrap and rank in wrap:
            cmd = wrap[rank](cmd)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env))
    return procs


@pytest.mark.parametrize("size", [2, 3])
def test_refused_on_one_rank_fails_fast_everywhere(tmp, size):
    results = finish_job(start("one_rank", size, tmp))
    assert_all_ok(results)
    for _, out in results:
        assert "one_rank ok" in out


def test_bad_setting_on_one_rank_fails_every_rank(tmp):
    """SHMRING_TORCH_SHARD_BYTES='4MiB' on rank 1 only: every rank's
    init_process_group raises at once, naming rank 1 and the value, instead
    of the others waiting out the group's timeout."""
    results = finish_job(start("bad_setting", 3, tmp))
    assert_all_ok(results)
    for _, out in results:
        assert "bad_setting ok" in out


def can_unshare_uts():
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


def other_host(cmd):
    """`cmd` in a UTS namespace of its own, under another hostname."""
    return ["unshare", "--uts", "sh", "-c", 'hostname shmring-elsewhere && exec "$@"', "sh"] + cmd


@pytest.mark.skipif(not can_unshare_uts(), reason="needs unshare --uts (root or user namespaces)")
def test_group_across_two_hosts_works(tmp):
    """Rank 1 sees another hostname: ranks 0 and 2 form one node, rank 1
    another (not consecutive ranks, uneven nodes), and the collectives give
    exact results on every rank."""
    results = finish_job(start("host", 3, tmp, wrap={1: other_host}))
    assert_all_ok(results)
    for _, out in results:
        assert "shmring-elsewhere" in out


@pytest.mark.skipif(not can_unshare_uts(), reason="needs unshare --uts (root or user namespaces)")
def test_refused_on_one_rank_fails_fast_across_hosts(tmp):
    """A group over two hosts (rank 1 alone on the second): a call refused
    by one rank is an error naming it on every rank of both hosts, within
    seconds, whether the refusing rank is alone on its host or not."""
    results = finish_job(start("one_rank_hosts", 3, tmp, wrap={1: other_host}))
    assert_all_ok(results)
    for _, out in results:
        assert "one_rank_hosts ok" in out


@pytest.mark.skipif(not can_unshare_uts(), reason="needs unshare --uts (root or user namespaces)")
def test_mismatch_across_hosts_under_detail(tmp):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL on a group over two hosts: a call
    whose size, dtype, root, operator or all_to_all sizes differ between
    ranks raises one error on every rank, naming both calls, and the group
    stays usable (gloo alone would end a process or return wrong data)."""
    env = dict(os.environ, TORCH_DISTRIBUTED_DEBUG="DETAIL")
    results = finish_job(start("detail_hosts", 3, tmp, wrap={1: other_host}, env=env))
    assert_all_ok(results)
    for _, out in results:
        assert "detail_hosts ok" in out
