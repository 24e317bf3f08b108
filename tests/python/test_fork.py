"""Processes forked from a rank (fork-without-exec.md): a PyTorch DataLoader
with num_workers=2 in a 2-rank training loop; the rank is SIGKILLed while its
workers live, and the survivor gets PeerFailureError within a second."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import HERE, shm_entries, unique_job_id

pytest.importorskip("torch")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def test_dataloader_workers_do_not_keep_a_killed_rank_alive(tmp_path):
    job_id = unique_job_id("dataloader")
    reports = [tmp_path / f"rank{r}.txt" for r in range(2)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHMRING_")}
    procs = [subprocess.Popen([sys.executable, str(HERE / "fork_worker.py"), str(r), "2", job_id,
                               str(reports[r])], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    workers = []
    try:
        deadline = time.monotonic() + 120
        while not all("ready" in read(p) for p in reports):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "the ranks never got going"
            time.sleep(0.05)
        for p in reports:
            workers += [int(w) for w in read(p).split()[2:]]
        assert len(workers) == 4, read(reports[0]) + read(reports[1])
        killed_at = time.monotonic()
        procs[1].kill()
        out, _ = procs[0].communicate(timeout=60)
        assert procs[0].returncode == 0, out
        error = [line for line in read(reports[0]).splitlines() if line.startswith("error ")]
        assert error, out
        _, kind, when, message = error[0].split(" ", 3)
        assert kind == "PeerFailureError", error[0]
        assert "rank 1 (pid" in message and "died" in message, error[0]
        # Usually milliseconds; 5 s tells it from the timeout with room for the
        # loaded CI VM's rare stalls (tests/faults/faults.hpp, kDetectionBoundS).
        assert float(when) - killed_at < 5.0, f"{float(when) - killed_at:.2f} s: {error[0]}"
        # The workers of rank 1 outlived it (the point of the test).
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
        for w in workers:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert shm_entries(job_id) == [], shm_entries(job_id)
