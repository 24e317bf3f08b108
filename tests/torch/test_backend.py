"""torch.distributed backend "shmring": operations, errors, groups, launchers
(real processes, one per rank)."""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import (REPO, WORKER, assert_all_ok, finish_job, job_ids, report, run_job,
                      shm_entries, start_job)


def test_every_operation_and_dtype(tmp):
    """allreduce (every operator and dtype, edge counts), allreduce_coalesced,
    broadcast, allgather, _allgather_base, reduce_scatter,
    _reduce_scatter_base, reduce, barrier equal a reference computed in the
    worker; non-contiguous tensors; Work and futures, including a collective
    issued from inside a future callback; refusals name what they refuse and
    leave the group usable."""
    results = run_job("ops_all", 3, tmp)
    assert_all_ok(results)
    for _, out in results:
        for word in ("ops ok", "layout ok", "async ok", "refusals ok"):
            assert word in out


def test_send_recv_and_batch_isend_irecv_ring(tmp):
    """dist.send/recv, isend/irecv and batch_isend_irecv on a ring of 3."""
    results = run_job("p2p", 3, tmp)
    assert_all_ok(results)
    for _, out in results:
        assert "p2p ok" in out


def test_noncontiguous_tensors_blocking_and_through_futures(tmp):
    """Every operation (all_reduce, all_reduce_coalesced, broadcast and reduce
    from each root, all_gather, _all_gather_base, reduce_scatter,
    _reduce_scatter_base, all_to_all_single, all_to_all, gather, scatter,
    send/recv) on strided and transposed inputs and outputs: blocking, and
    through the Work's future, whose then() callbacks see the result already
    in the caller's tensors; only reduce's root changes; a DDP comm hook that
    reduces a strided copy of the bucket trains as DDP without a hook."""
    results = run_job("noncontig", 2, tmp)
    assert_all_ok(results)
    for _, out in results:
        assert "noncontig ok" in out


def test_mismatch_is_an_error_on_every_rank(tmp):
    results = run_job("mismatch", 2, tmp)
    assert_all_ok(results)


@pytest.mark.parametrize("scenario", ["leaving", "leaving_barrier"])
def test_a_rank_leaving_is_named_as_such(tmp, scenario):
    results = run_job(scenario, 2, tmp)
    assert_all_ok(results)
    for _, out in results:
        assert "leaving ok" in out


def test_timeouts(tmp):
    results = run_job("timeouts", 2, tmp, env={"SHMRING_TIMEOUT": "3"})
    assert_all_ok(results)


def test_ctrl_c_ends_a_wait_on_a_peer(tmp):
    """SIGINT during a blocking all_reduce that waits for a late peer ends it
    at once with an error naming the interrupt, on both ranks."""
    results = run_job("interrupt", 2, tmp, env={"SHMRING_TIMEOUT": "60"})
    assert_all_ok(results)
    for _, out in results:
        assert "interrupt ok" in out


@pytest.mark.parametrize("cma", ["auto", "0"])
def test_dropped_isend_that_failed_is_never_delivered(tmp, cma):
    """dist.isend's Work dropped while pending; the send times out and its
    tensor is reused: the late dist.recv raises, naming rank 0's send, and
    both ranks refuse later operations. Single copy on and off."""
    env = {"SHMRING_TIMEOUT": "1"}
    if cma == "0":
        env["SHMRING_CMA"] = "0"
    results = run_job("p2p_ended_early", 2, tmp, env=env)
    assert_all_ok(results)
    for _, out in results:
        assert "p2p_ended_early ok" in out


@pytest.mark.parametrize("cma", ["auto", "0"])
def test_dropped_irecv_is_never_matched_by_a_later_send(tmp, cma):
    """dist.irecv's Work dropped while pending: the recv times out, and rank
    0's later dist.send raises at once naming it; the dropped tensor is not
    written. Single copy on and off."""
    env = {"SHMRING_TIMEOUT": "1"}
    if cma == "0":
        env["SHMRING_CMA"] = "0"
    results = run_job("p2p_dropped_irecv", 2, tmp, env=env)
    assert_all_ok(results)
    for _, out in results:
        assert "p2p_dropped_irecv ok" in out


def test_peer_death_is_an_error_on_the_survivors(tmp):
    """Rank 1 is SIGKILLed: ranks 0 and 2 get RuntimeError naming it within
    seconds, and the group refuses later operations."""
    results = run_job("peer_death", 3, tmp, env={"SHMRING_TIMEOUT": "60"})
    assert results[1][0] == -9, report(results)
    for r in (0, 2):
        assert results[r][0] == 0, report(results)
        assert "peer_death ok" in results[r][1]


def test_new_group_is_a_communicator_of_its_own(tmp):
    results = run_job("new_group", 3, tmp)
    assert_all_ok(results)
    ids = job_ids(out for _, out in results)
    assert len(ids) == 3, ids  # world, [0, 2], [1, 2]


def test_two_jobs_with_the_same_launcher_ids_never_meet(tmp):
    """Both jobs get the same MASTER_PORT, TORCHELASTIC_RUN_ID and
    SHMRING_JOB_ID; their shmring job ids come from their own stores."""
    same = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555", "TORCHELASTIC_RUN_ID": "same",
            "SHMRING_JOB_ID": "same-job"}
    a = start_job("job", 2, tmp, env={**same, "JOB_VALUE": "1"}, tag="a")
    b = start_job("job", 2, tmp, env={**same, "JOB_VALUE": "1000"}, tag="b")
    ra, rb = finish_job(a), finish_job(b)
    assert_all_ok(ra)
    assert_all_ok(rb)
    ida, idb = job_ids(o for _, o in ra), job_ids(o for _, o in rb)
    assert len(ida) == 1 and len(idb) == 1 and ida != idb, (ida, idb)


def _launcher_env():
    return dict(os.environ)


def test_torchrun(tmp):
    """torchrun (env://). Debian's torchrun needs --redirects 2 --tee 2."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--redirects", "2", "--tee", "2", str(WORKER), "smoke", "0", "0", "env", str(tmp)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300, env=_launcher_env())
    assert p.returncode == 0, p.stdout
    assert p.stdout.count("smoke ok") == 2, p.stdout
    assert shm_entries(job_ids([p.stdout])) == []


@pytest.mark.skipif("SHMRUN" not in os.environ, reason="SHMRUN (the built launcher) not set")
def test_shmrun_ddp_example(tmp):
    """examples/train_torch.py --ddp under shmrun: a few steps of the CNN with
    small buckets, then the test-set evaluation."""
    data = pathlib.Path("/usr/share/datasets/fashion-mnist")
    if not (data / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip("Fashion-MNIST (dataset-fashion-mnist) not installed")
    cmd = [os.environ["SHMRUN"], "-n", "2", "--", sys.executable,
           str(REPO / "examples" / "train_torch.py"), "--ddp", "--model", "cnn",
           "--max-steps", "3", "--bucket-cap-mb", "0.05", "--warmup", "0", "--batch-size", "64"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout
    assert "RESULT ddp backend=shmring model=cnn ranks=2 steps=3" in p.stdout, p.stdout


@pytest.mark.skipif("SHMRUN" not in os.environ, reason="SHMRUN (the built launcher) not set")
def test_destroy_then_init_again_six_times_under_shmrun(tmp):
    """4 ranks under shmrun (env://: rank 0 serves a new TCPStore on the same
    port every round), six rounds of init_process_group, new_group,
    all_reduce, destroy_process_group with the garbage collector off and the
    old groups still referenced: every round works, and each destroy releases
    the round's segments and threads at once (tests/torch/torch_worker.py,
    scenario_reinit)."""
    cmd = [os.environ["SHMRUN"], "-n", "4", "--", sys.executable, str(WORKER), "reinit", "0", "0",
           "env", str(tmp)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout
    assert p.stdout.count("reinit ok") == 4, p.stdout
    assert shm_entries(job_ids([p.stdout])) == []


def test_torch_own_destroy_frees_a_group_nothing_else_holds_at_once(tmp):
    """torch's destroy_process_group, unwrapped, with the garbage collector
    off: the group's segment and threads are gone when it returns (no
    reference cycle of ours keeps a group alive), after a new_group, a
    future callback holding its Work and a DDP step (torch_worker.py,
    scenario_torch_destroy)."""
    results = run_job("torch_destroy", 3, tmp)
    assert_all_ok(results)
    for _, out in results:
        assert "torch_destroy ok" in out
    assert len(job_ids(out for _, out in results)) == 6  # 3 rounds: world, [0, 2]


def test_import_shmring_registers_only_when_torch_is_loaded():
    """`import torch; import shmring` registers the backend; a plain
    `import shmring` does not pay for importing torch."""
    code = ("import torch, torch.distributed as dist, shmring; "
            "print(dist.Backend('shmring'))")
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("shmring"), p.stdout
    code = "import sys, shmring; print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stdout
