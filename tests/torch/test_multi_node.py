"""The torch backend across fake nodes (tools/fake-nodes --launcher
torchrun: one torchrun per fake node, each in a UTS namespace of its own, so
shmring runs inside each node and gloo between them over loopback). One rig
launch per test checks many operations (tests/torch/multinode_worker.py).

Skipped, with fake-nodes' reason, where the rig cannot run (not root, no
unshare, no torchrun)."""

import os
import re
import subprocess
import tempfile
import time

import pytest

from conftest import HERE, REPO

FAKE_NODES = REPO / "tools" / "fake-nodes"
WORKER = HERE / "multinode_worker.py"


def descendants(pid):
    """`ps` lines (pid, parent, state, wait channel, age, command) of every
    process below `pid`: what a stuck rig was doing."""
    rows = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,wchan:24=,etime=,args="],
                          stdout=subprocess.PIPE, text=True).stdout.splitlines()
    parent = {int(r.split()[0]): int(r.split()[1]) for r in rows}
    below = {pid}
    for _ in range(len(rows)):
        grown = {p for p, pp in parent.items() if pp in below} | below
        if grown == below:
            break
        below = grown
    return [r for r in rows if int(r.split()[0]) in below - {pid}]


def run_fake_nodes(args, env, timeout, tries=1, finished=None, exit_grace=60):
    """tools/fake-nodes ARGS to its end, its output (stdout and stderr
    together) captured. Past `timeout` seconds its processes are ended with
    SIGTERM first, which fake-nodes passes on to its nodes (each its own
    session, so a SIGKILL of fake-nodes alone would leave them running),
    then SIGKILL, and the processes that were still running below it and
    the end of their output are reported: printed before the next of
    `tries` runs, or failing the test after the last.

    `finished(output)`, where given, says that the run has written all it
    was started for; a run still alive `exit_grace` seconds after that is
    ended the same way and counts as a success (returncode 0), its
    processes printed."""
    for attempt in range(1, tries + 1):
        # The output goes to a file opened for appending, read through a
        # handle of its own (a shared offset would let reads move writes).
        with tempfile.TemporaryDirectory() as tmp:
            log_path = os.path.join(tmp, "output")
            with open(log_path, "a") as log:
                proc = subprocess.Popen([str(FAKE_NODES), *args], env=env, stdout=log,
                                        stderr=subprocess.STDOUT, text=True)

            def output():
                with open(log_path, errors="replace") as f:
                    return f.read()

            start, done_at = time.monotonic(), None
            while proc.poll() is None and time.monotonic() - start < timeout:
                if done_at is None and finished is not None and finished(output()):
                    done_at = time.monotonic()
                if done_at is not None and time.monotonic() - done_at > exit_grace:
                    break
                time.sleep(0.5)
            if proc.poll() is not None:
                return subprocess.CompletedProcess(proc.args, proc.returncode, output())
            stuck = descendants(proc.pid)
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out = output()
            if done_at is not None:
                print(f"tools/fake-nodes {' '.join(args)} had finished its work but was still "
                      f"running {exit_grace} s later; ended it. Its processes then:\n" +
                      "\n".join(stuck))
                return subprocess.CompletedProcess(proc.args, 0, out)
            report = (f"tools/fake-nodes {' '.join(args)} ran past {timeout} s (run {attempt} "
                      f"of {tries}). Its processes then:\n" + "\n".join(stuck) +
                      "\n--- output:\n" + out[-20000:])
            if attempt == tries:
                pytest.fail(report)
            print(report + "\n--- running it once more")


def run_rig(nodes, *args, timeout=420, env_extra=None):
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.update(env_extra or {})
    proc = run_fake_nodes(["--nodes", nodes, "--launcher", "torchrun", "--", str(WORKER), *args],
                          env, timeout)
    if proc.returncode == 77:
        reason = [line for line in proc.stdout.splitlines() if "skipped" in line]
        pytest.skip(reason[-1] if reason else "tools/fake-nodes cannot run here")
    left = [n for n in os.listdir("/dev/shm") if re.match(r"shmring-\d+-torch-fn", n)]
    return proc, left


def ranks_of(nodes):
    if "x" in nodes:
        a, b = nodes.split("x")
        return int(a) * int(b)
    return sum(int(n) for n in nodes.split(","))


@pytest.mark.parametrize("nodes", ["2x2", "3,1"])
def test_every_operation_across_fake_nodes(nodes):
    """allreduce (every op and dtype, 16-bit rounded once), coalesced,
    broadcast, all_gather (+ base, uneven, any dtype), reduce_scatter (+
    base, uneven), reduce, barrier, all_to_all(_single), gather, scatter,
    send/recv across nodes, new_group across and inside nodes, object
    collectives, async works and futures, DDP with comm hooks; exact
    values, or gloo's over the same ranks; a 16-bit NaN result and MIN/MAX
    (NaN, -0 against +0) bit for bit as on one machine. On 2x2 allreduces from 4 KiB
    take the sharded path (reduce-scatter, shard allreduce, allgather),
    smaller ones and 3+1's all the leaders' path."""
    shard = {"SHMRING_TORCH_SHARD_BYTES": "4096"} if nodes == "2x2" else {}
    proc, left = run_rig(nodes, "ops", env_extra=shard)
    assert proc.returncode == 0, proc.stdout[-20000:]
    assert proc.stdout.count("multinode ops ok") == ranks_of(nodes), proc.stdout[-20000:]
    assert left == [], f"segments left in /dev/shm: {left}"


@pytest.mark.parametrize("nodes,victim", [("2x2", 3), ("3,1", 1), ("3,1", 3)])
def test_killed_rank_is_an_error_on_every_node(nodes, victim):
    """A rank SIGKILLed mid-allreduce: every other rank, on every node,
    raises RuntimeError saying that rank died, within seconds (the worker
    checks both); the run ends and leaves no shared memory."""
    proc, left = run_rig(nodes, "kill", str(victim))
    out = proc.stdout
    assert proc.returncode != 0, out[-20000:]  # the victim's node fails
    for rank in range(ranks_of(nodes)):
        if rank != victim:
            assert f"kill ok on rank {rank} " in out, out[-20000:]
    assert left == [], f"segments left in /dev/shm: {left}"


def loadable(path):
    """Whether `path` is a whole .npy file (np.save writes it in place, so
    one being written may be cut short)."""
    import numpy as np

    try:
        np.load(path)
        return True
    except (OSError, ValueError, EOFError):
        return False


def test_ddp_cnn_trains_across_fake_nodes_as_with_gloo(tmp_path):
    """examples/train_torch.py --ddp --model cnn on 2 fake nodes x 2 ranks,
    once with the shmring backend and once with gloo: after 4 steps the
    parameters are bitwise identical on all 4 ranks, and within 1e-6 of
    gloo's run. Prints both runs' time per step."""
    import numpy as np

    data = "/usr/share/datasets/fashion-mnist"
    if not os.path.exists(os.path.join(data, "t10k-images-idx3-ubyte.gz")):
        pytest.skip("Fashion-MNIST (dataset-fashion-mnist) not installed")
    params = {}
    for backend in ("shmring", "gloo"):
        out_dir = tmp_path / backend
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        args = ["--nodes", "2x2", "--launcher", "torchrun", "--",
                str(REPO / "examples" / "train_torch.py"), "--ddp", "--backend", backend,
                "--model", "cnn", "--max-steps", "4", "--warmup", "1", "--batch-size", "64",
                "--seed", "3", "--dump-params", str(out_dir)]
        if backend == "shmring":
            proc = run_fake_nodes(args, env, 420)
        else:
            # gloo's run only supplies the reference values and does not
            # load shmring. On a loaded 2-CPU machine it has been seen to
            # hang on its way out, after its RESULT line and every rank's
            # parameters were written: those are all this test needs, so
            # such a run is ended and used. A hang before that (its
            # processes are printed) gets one more try; a failure gets none.
            def finished(out, out_dir=out_dir):
                return "RESULT ddp" in out and all(
                    loadable(out_dir / f"params_rank{r}.npy") for r in range(4))

            proc = run_fake_nodes(args, env, 240, tries=2, finished=finished)
        if proc.returncode == 77:
            pytest.skip("tools/fake-nodes cannot run here")
        assert proc.returncode == 0, proc.stdout[-20000:]
        result = [line for line in proc.stdout.splitlines() if "RESULT ddp" in line]
        assert result, proc.stdout[-20000:]
        print(result[0])
        params[backend] = [np.load(out_dir / f"params_rank{r}.npy") for r in range(4)]
    shm = params["shmring"]
    for r in range(1, 4):
        assert shm[r].tobytes() == shm[0].tobytes(), f"rank {r}'s parameters differ from rank 0's"
    diff = float(np.max(np.abs(shm[0].astype(np.float64) - params["gloo"][0])))
    print(f"max |shmring - gloo| after 4 steps: {diff:.3g}")
    assert diff <= 1e-6
