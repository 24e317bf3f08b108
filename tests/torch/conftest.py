"""Helpers for the torch.distributed backend tests: jobs of real processes,
one per rank, running torch_worker.py.

shmring.torch is imported from PYTHONPATH (meson points it at build/python);
SHMRUN names the built launcher.
"""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKER = HERE / "torch_worker.py"


def shm_entries(job_ids):
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return []
    return [n for n in names for j in job_ids if j in n]


def job_ids(outputs):
    return {line.split()[1] for out in outputs for line in out.splitlines()
            if line.startswith("JOB_ID ")}


def start_job(scenario, size, tmp, backend="shmring", env=None, tag="job", worker=WORKER):
    """Starts `size` worker processes (`worker`: torch_worker.py or another
    script taking its arguments) sharing a FileStore under `tmp`; returns
    the Popen list."""
    store = tmp / f"{tag}.store"
    outdir = tmp / tag
    outdir.mkdir(exist_ok=True)
    procs = []
    for rank in range(size):
        e = dict(os.environ)
        e.update(env or {})
        procs.append(subprocess.Popen(
            [sys.executable, str(worker), scenario, str(rank), str(size), f"file://{store}",
             str(outdir), backend],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def finish_job(procs, timeout=300):
    """Waits for the processes; returns [(returncode, output)] and checks
    that no shmring segment of theirs is left in /dev/shm."""
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    left = shm_entries(job_ids(out for _, out in results))
    assert left == [], f"segments left in /dev/shm: {left}"
    return results


def run_job(scenario, size, tmp, **kw):
    return finish_job(start_job(scenario, size, tmp, **kw))


def report(results):
    return "\n".join(f"--- rank {r}: exit {code}\n{out}" for r, (code, out) in enumerate(results))


def assert_all_ok(results):
    assert all(code == 0 for code, _ in results), report(results)


@pytest.fixture
def tmp(tmp_path):
    return tmp_path
