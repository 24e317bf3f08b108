#!/usr/bin/python3
"""A rank that dies (SIGKILL), hangs (SIGSTOP) or makes a mismatched call
mid-allreduce on one fake node must end the job on every node with an error,
quickly, with nothing left in /dev/shm.

    run_fault.py FAKE_NODES WORKER kill|stop|stop-throw|mismatch|refuse NODES VICTIM

Exit 0: the job ended with a non-zero status within the bound, the output
names the failure, and no segment of this job is left. 77: the rig cannot
run here (not root, no unshare, no mpirun).

mpirun itself (Open MPI 4.1's orterun, which never loads shmring) sometimes
dies of SIGSEGV while it tears a failed job down: a surviving rank's TCP
"peer hung up" notice reaches it through PMIx_Log as it shuts its own
messaging down (the backtrace ends in orte_rml_oob_send_buffer_nb under
pmix_server_log_fn). That run tells nothing about shmring, so it is run
again, at most twice; the run that counts is checked in full.
"""
import os
import re
import signal
import subprocess
import sys
import time

BOUND_S = 45  # generous: SHMRING_TIMEOUT is 3 s here; mpirun tears down in ~1 s
LAUNCHER_RETRIES = 2


def launcher_crashed(p):
    """True when mpirun (fake-nodes execs it) died of a signal of its own,
    with Open MPI's runtime in the backtrace it printed."""
    return (p.returncode in (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT)
            and re.search(r"libopen-rte|mca_rml_|libpmix", p.stdout) is not None)


def end_orphans(out, worker):
    """Ends the ranks a crashed mpirun left behind (the pids they printed,
    where that pid still runs WORKER) and removes their segments."""
    name = os.path.basename(worker).encode()
    for pid in {int(x) for x in re.findall(r"pid (\d+) segment", out)}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if name not in f.read():
                    continue
            os.kill(pid, signal.SIGKILL)
            print(f"# ended rank pid {pid}, orphaned by the crashed mpirun")
        except (FileNotFoundError, ProcessLookupError):
            pass
    time.sleep(0.5)
    for s in set(re.findall(r"segment (shmring-\S+)", out)):
        x = os.path.join("/dev/shm", s)
        if os.path.exists(x):
            print(f"# removing {x}, left by the run whose mpirun crashed")
            os.unlink(x)  # ours: named by that run's nonce


def main():
    fake_nodes, worker, mode, nodes, victim = sys.argv[1:6]
    env = dict(os.environ, SHMRING_TIMEOUT="3")
    for attempt in range(LAUNCHER_RETRIES + 1):
        t0 = time.monotonic()
        try:
            p = subprocess.run([fake_nodes, "--nodes", nodes, "--", worker, mode, victim],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env, timeout=BOUND_S + 60)
        except subprocess.TimeoutExpired as e:
            print(f"FAIL: the job still ran after {BOUND_S + 60} s (a hang)\n{e.output}")
            return 1
        took = time.monotonic() - t0
        out = p.stdout
        if attempt == LAUNCHER_RETRIES or not launcher_crashed(p):
            break
        print(out[-3000:])
        print(f"# attempt {attempt + 1}: mpirun itself died of signal {-p.returncode} "
              "(Open MPI's runtime in its backtrace); running the job again")
        end_orphans(out, worker)
    print(out[-6000:])
    if p.returncode == 77:
        return 77
    failures = []
    if p.returncode == 0:
        failures.append("the job exited 0: the lost rank went unnoticed")
    if took > BOUND_S:
        failures.append(f"the job took {took:.1f} s to end, more than {BOUND_S} s")
    if "no failure" in out:
        failures.append("a rank finished its loop without an error")
    if mode == "stop-throw":
        # SHMRING_MPI_ON_ERROR=throw: the error reaches the program, the
        # communicator refuses further work, the program aborts the job.
        if not re.search(r"rank \d+ caught timeout: shmring-mpi: rank", out):
            failures.append("no rank caught a timeout error from the layer")
        if not re.search(r"rank \d+ refused: .*broken by an earlier error", out):
            failures.append("the broken communicator did not refuse the next call")
    elif mode == "mismatch":
        # The victim's node fails in its shmring stage while the other node
        # waits in MPI: the layer names the mismatch and aborts the job.
        if not re.search(r"shmring-mpi: rank \d+/\d+ \(node \d+/\d+ 'fake-node-\d+'.*failed:.*"
                         r"mismatch.*aborting the MPI job", out):
            failures.append("no 'shmring-mpi: rank ... failed: ... mismatch ... aborting the MPI "
                            "job' line")
    elif mode == "refuse":
        # The victim refused a call and went on: its node's peers hear the
        # refusal in that call (with the victim's reason) and end the job.
        if not re.search(r"rank \d+ refused its call: rank \d+: allreduce: avg needs a floating "
                         r"datatype, got int32", out):
            failures.append("the victim's refusal did not say rank, call and reason")
        if not re.search(r"shmring-mpi: rank \d+/\d+ .*failed:.*made an invalid call \(it refused "
                         r"its arguments: .*avg needs a floating datatype.*aborting the MPI job",
                         out):
            failures.append("no 'shmring-mpi: ... failed: ... made an invalid call (it refused its "
                            "arguments: ... avg ...) ... aborting the MPI job' line")
    elif mode == "stop":
        # The victim is alive but silent: its node's peers time out, and our
        # error policy must name it and abort the job.
        if not re.search(r"shmring-mpi: rank \d+/\d+ \(node \d+/\d+ 'fake-node-\d+'.*failed:.*"
                         r"aborting the MPI job", out):
            failures.append("no 'shmring-mpi: rank ... failed: ... aborting the MPI job' line")
    else:
        if not re.search(r"shmring-mpi: rank .*failed|signal 9|Killed|exited on signal", out):
            failures.append("nothing in the output names the failure")
    segments = set(re.findall(r"segment (shmring-\S+)", out))
    if not segments:
        failures.append("no segment names printed (the job did not start?)")
    left = [s for s in segments if os.path.exists(os.path.join("/dev/shm", s))]
    for s in left:
        os.unlink(os.path.join("/dev/shm", s))  # ours: named by this job's nonce
    if left:
        failures.append(f"segments left in /dev/shm: {left}")
    print(f"# {mode} rank {victim} on --nodes {nodes}: exit {p.returncode} after {took:.1f} s")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
