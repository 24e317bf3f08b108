#!/usr/bin/python3
"""SHMRING_TRACE end to end (docs/guide/tracing.md).

    check_trace.py SHMRUN TRACE_WORKER SHMRING_TRACE_TOOL

Runs trace_worker (trace_worker.cpp says what each rank calls) on 4 ranks
with SHMRING_TRACE set, twice into the same file, and checks that the merged
file holds exactly the second job's calls, one track per rank, with their
arguments; that no part or lock file is left; and that tools/shmring-trace
counts the calls and draws a PNG.
"""

import json
import os
import subprocess
import sys
import tempfile

SHMRUN, WORKER, TOOL = sys.argv[1:4]
N = 4


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"{what}\n{detail}".rstrip())


def run_job(path, jid):
    env = dict(os.environ, SHMRING_TRACE=path, SHMRING_TIMEOUT="30")
    p = subprocess.run([SHMRUN, "-n", str(N), "--job-id", jid, "--", WORKER], env=env,
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"job {jid} failed with {p.returncode}", p.stdout + p.stderr)


with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "trace.json")
    first, second = f"tr{os.getpid()}-a", f"tr{os.getpid()}-b"
    run_job(path, first)
    run_job(path, second)
    check(sorted(os.listdir(d)) == ["trace.json"], f"left beside the trace: {os.listdir(d)}")
    with open(path) as f:
        trace = json.load(f)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    jobs = {e["args"]["job"] for e in spans if e["cat"] == "collective"}
    check(first not in jobs, f"the first job's spans survived into the second's trace: {jobs}")
    check(sorted({e["pid"] for e in spans}) == list(range(N)), "one track per rank",
          str(sorted({e["pid"] for e in spans})))
    for r in range(N):
        mine = [e for e in spans if e["pid"] == r and e["cat"] == "collective"]
        world = [e for e in mine if e["args"]["job"] == second]
        ar = [e for e in world if e["name"] == "allreduce"]
        check(len(ar) == 8, f"rank {r}: {len(ar)} world allreduces, expected 8")
        for e in ar:
            a = e["args"]
            check((a["count"], a["dtype"], a["op"], a["bytes"], a["size"], a["rank"],
                   a["state"]) == (1000, "float32", "sum", 4000, N, r, "completed"),
                  f"rank {r}: allreduce arguments", str(a))
        check(sum(e["name"] == "barrier" for e in world) >= 2, f"rank {r}: barriers missing")
        # split()'s own allgather shows as split, not as an allgather the
        # program never made.
        check([e["name"] for e in world if e["name"] in ("split", "allgather")] == ["split"],
              f"rank {r}: the split's span", json.dumps([e["name"] for e in world]))
        seqs = [e["args"]["seq"] for e in sorted(world, key=lambda e: e["ts"])]
        check(seqs == sorted(seqs) and len(set(seqs)) == len(seqs),
              f"rank {r}: world calls out of order", str(seqs))
        split = [e for e in mine if e["args"]["job"] != second]
        check([e["name"] for e in split] == ["allreduce"] * 3 and
              all(e["args"]["size"] == 2 and e["args"]["rank"] == r // 2 for e in split),
              f"rank {r}: the split communicator's spans", json.dumps(split))
        check(len({e["tid"] for e in split} | {e["tid"] for e in world}) == 2,
              f"rank {r}: each communicator on a track of its own")
        queued = [e for e in spans if e["pid"] == r and e["cat"] == "queue"]
        check(sorted(e["args"]["seq"] for e in queued) == sorted(e["args"]["seq"] for e in ar[5:]),
              f"rank {r}: the non-blocking calls' time in the queue", json.dumps(queued))
    # The tool's summary and timeline.
    p = subprocess.run([sys.executable, TOOL, path, "--json"], capture_output=True, text=True)
    check(p.returncode == 0, "shmring-trace --json failed", p.stderr)
    summary = {row["collective"]: row for row in json.loads(p.stdout)["collectives"]}
    check(json.loads(p.stdout)["ranks"] == N, "the summary's rank count", p.stdout)
    check(summary["allreduce"]["calls"] == 8 + 2 * 3, "allreduce calls in the summary", p.stdout)
    check(summary["allreduce"]["bytes_per_call"] == 4000, "allreduce bytes per call", p.stdout)
    row = summary["allreduce"]
    check(abs(row["time_us"] - row["wait_for_last_us"] - row["moving_us"]) < 1e-3 * row["time_us"],
          "a call's time is its wait for the last rank plus its time moving data", p.stdout)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib missing: the PNG is not checked")
    else:
        png = os.path.join(d, "t.png")
        p = subprocess.run([sys.executable, TOOL, path, "--png", png], capture_output=True,
                           text=True)
        check(p.returncode == 0, "shmring-trace --png failed", p.stderr)
        with open(png, "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", "the timeline is not a PNG")
    # An eager gather's non-root returns before the root arrives: its wait
    # is its whole span, never more (a call's parts add up to its time).
    eager = {"traceEvents": [
        {"ph": "X", "cat": "collective", "name": "gather", "pid": r, "tid": 0, "ts": ts,
         "dur": dur, "args": {"job": "j", "seq": 0, "size": 2, "rank": r, "bytes": 8,
                              "state": "completed"}}
        for r, ts, dur in ((0, 10.0, 4.0), (1, 0.0, 1.0))]}
    eager_path = os.path.join(d, "eager.json")
    with open(eager_path, "w") as f:
        json.dump(eager, f)
    p = subprocess.run([sys.executable, TOOL, eager_path, "--json"], capture_output=True,
                       text=True)
    check(p.returncode == 0, "shmring-trace --json failed on the eager gather", p.stderr)
    row = json.loads(p.stdout)["collectives"][0]
    # Rank 0: no wait, 4 us moving; rank 1: 1 us waiting (all of its span).
    check(abs(row["time_us"] - 2.5) < 1e-9 and abs(row["wait_for_last_us"] - 0.5) < 1e-9 and
          abs(row["moving_us"] - 2.0) < 1e-9, "the eager gather's wait and moving time", p.stdout)
    # An unreadable trace says so.
    p = subprocess.run([sys.executable, TOOL, os.path.join(d, "missing.json")],
                       capture_output=True, text=True)
    check(p.returncode != 0 and "no such file" in p.stderr, "a missing trace's error", p.stderr)
print("trace: ok")
