"""A stalled rank in a torchrun job (docs/guide/tracing.md,
docs/design/recorder.md): every rank's RuntimeError names it and what it
last completed, SHMRING_DUMP_DIR gets every rank's recorder, and
`shmrun --status`, run during the stall, shows it outside any collective
and the others waiting for it."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import HERE, assert_all_ok, run_job, shm_entries


@pytest.mark.skipif("SHMRUN" not in os.environ, reason="SHMRUN (the built launcher) not set")
def test_torchrun_rank_2_stalls_before_its_1001st_all_reduce(tmp):
    dump = tmp / "dump"
    dump.mkdir()
    env = dict(os.environ, SHMRING_TIMEOUT="5", SHMRING_DUMP_DIR=str(dump), STALL_SECONDS="12")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
           "--redirects", "2", "--tee", "2", str(HERE / "stall_worker.py"), str(tmp)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    try:
        deadline = time.monotonic() + 120
        while not (tmp / "stalling").exists():
            assert p.poll() is None and time.monotonic() < deadline, "rank 2 never stalled"
            time.sleep(0.1)
        time.sleep(1.5)  # the others are in all_reduce #1000 by now
        job = (tmp / "stalling").read_text()
        status = subprocess.run([os.environ["SHMRUN"], "--status", "--job-id", job],
                                capture_output=True, text=True, timeout=30)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, out
    table = status.stdout
    assert status.returncode == 0, status.stdout + status.stderr
    rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^\s*(\d+)\s.*$", table, re.M)}
    assert sorted(rows) == [0, 1, 2, 3], table
    assert "idle (last allreduce #999)" in rows[2], table
    for r in (0, 1, 3):
        assert "allreduce #1000" in rows[r] and "waits for" in rows[r], table
    # Every rank's error names rank 2 and what it last completed.
    dumps = set()
    for r in range(4):
        msg = (tmp / f"rank{r}.txt").read_text()
        assert "rank 2 has not entered allreduce #1000; its last completed call was " \
               "allreduce #999, " in msg, f"rank {r}: {msg}"
        assert "ranks 0, 1 and 3 wait in allreduce #1000" in msg, f"rank {r}: {msg}"
        dumps.update(re.findall(r"flight recorder: (\S+\.json)", msg))
    assert dumps, "no message names the dump"
    for path in dumps:
        with open(path) as f:
            j = json.load(f)
        assert len(j["ranks"]) == 4
        for r, jr in enumerate(j["ranks"]):
            last = jr["calls"][-1]
            assert (last["kind"], last["count"], last["dtype"]) == ("allreduce", 10000, "float32")
            if r == 2:
                assert (last["seq"], last["state"]) == (999, "completed"), jr["calls"][-2:]
            else:
                # In #1000 when the dump was written (failed: it timed out too).
                assert last["seq"] == 1000 and last["state"] in ("started", "failed"), \
                    jr["calls"][-2:]
    assert shm_entries([job]) == []


def test_torch_profiler_shows_each_collective_with_its_shapes(tmp):
    """With torch.profiler active, each call of the backend is an event
    "shmring:<op>" with the shapes of its tensors, as ProcessGroupGloo's
    "gloo:<op>" are."""
    results = run_job("profiler", 2, tmp, worker=HERE / "profiler_worker.py")
    assert_all_ok(results)
    for _, out in results:
        events = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("EVENT ")]
        by_name = {e["name"]: e["shapes"] for e in events}
        assert by_name.get("shmring:all_reduce") == [[4, 8]], out
        assert by_name.get("shmring:broadcast") == [[3]], out
        assert by_name.get("shmring:all_gather") == [[2, 5], [2, 5]], out
