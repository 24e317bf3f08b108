"""Shared helpers for the shmring Python tests.

The module under test is imported from PYTHONPATH (meson points it at
build/python); SHMRUN names the built launcher.
"""

import itertools
import os
import pathlib
import random
import re
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
_counter = itertools.count()


def unique_job_id(tag):
    """A job id no other test, run or user's job shares."""
    # "t-" and the run's tag (SHMRING_TEST_TAG, set by tools/check and
    # tools/sanitize) like the C++ tests' ids (tests/harness.hpp), so that the
    # core suite's leak check of this run covers these too.
    run = os.environ.get("SHMRING_TEST_TAG", "")
    return f"t-{run}py-{tag[:24]}-{os.getpid()}-{next(_counter)}-{random.randrange(100000)}"


def shm_entries(job_id):
    try:
        return [n for n in os.listdir("/dev/shm") if job_id in n]
    except FileNotFoundError:
        return []


def run_ranks(scenario, size, env=None, per_rank_env=None, timeout=240, worker="rank_worker.py",
              tag=None):
    """Runs WORKER (rank_worker.py) SCENARIO in `size` processes, one per rank,
    and returns their CompletedProcess-like results (returncode, output)."""
    job_id = unique_job_id(tag or scenario)
    procs = []
    for rank in range(size):
        e = dict(os.environ)
        e.update(env or {})
        e.update((per_rank_env or {}).get(rank, {}))
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / worker), scenario, str(rank), str(size), job_id],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
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
    assert shm_entries(job_id) == [], f"segment left in /dev/shm: {shm_entries(job_id)}"
    return results


def assert_all_ok(results):
    report = "\n".join(f"--- rank {r}: exit {code}\n{out}" for r, (code, out) in enumerate(results))
    assert all(code == 0 for code, _ in results), report


@pytest.fixture
def job_id(request):
    jid = unique_job_id(re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:30])
    yield jid
    assert shm_entries(jid) == [], f"segment left in /dev/shm: {shm_entries(jid)}"
