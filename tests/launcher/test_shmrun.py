#!/usr/bin/python3
"""Fault injection tests for shmrun with real processes.

    test_shmrun.py SHMRUN WORKER TEST

SHMRUN is the launcher, WORKER is launcher_worker (see launcher_worker.cpp),
TEST one of the functions named test_* below without the prefix. Each test
uses its own --job-id, and checks afterwards that no worker process (by pid
and by process group) and no /dev/shm entry of that job remains.
"""

import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

SHMRUN, WORKER = sys.argv[1], sys.argv[2]
_counter = [0]


def job_id():
    _counter[0] += 1
    return f"lt{os.getpid()}-{_counter[0]}"


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"{what}\n{detail}".rstrip())


def shm_entries(jid):
    prefix = f"shmring-{os.getuid()}-{jid}-"
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def worker_pids(stderr):
    """{rank: pid} from the lines of --report-bindings."""
    return {int(r): int(p) for r, p in re.findall(r"shmrun: rank (\d+) \(pid (\d+)\)", stderr)}


def group_members(pgid):
    members = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid:  # state ppid pgrp ...
            members.append(int(d))
    return members


def assert_clean(jid, stderr, np):
    pids = worker_pids(stderr)
    check(len(pids) == np, f"expected {np} workers in the bindings report", stderr)
    alive = [p for p in pids.values() if os.path.exists(f"/proc/{p}")]
    check(not alive, f"worker pids still exist after shmrun exited: {alive}", stderr)
    left = group_members(pids[0])
    check(not left, f"processes left in the job's process group {pids[0]}: {left}")
    check(not shm_entries(jid), f"segments left in /dev/shm: {shm_entries(jid)}")


def shmrun(jid, options, worker_args, timeout=30, env=None):
    cmd = [SHMRUN, "--report-bindings", "--job-id", jid, *options, "--", WORKER, *worker_args]
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return p, time.monotonic() - start


def test_rank_exit():
    """Rank 2 exits with 3 mid-job: shmrun exits 3 within 2 s, naming rank 2."""
    jid = job_id()
    p, elapsed = shmrun(jid, ["-n", "4"], ["exit", "2", "3"])
    check(p.returncode == 3, f"exit status {p.returncode}, expected 3", p.stderr)
    check(elapsed < 2.0, f"took {elapsed:.2f} s, expected under 2 s", p.stderr)
    summary = [l for l in p.stderr.splitlines() if "job terminated" in l]
    check(len(summary) == 1 and "rank 2 " in summary[0] and "exited with status 3" in summary[0],
          "expected one summary line naming rank 2 and status 3", p.stderr)
    assert_clean(jid, p.stderr, 4)
    print(f"rank_exit: {elapsed:.2f} s")


def test_rank_exit_before_attach():
    """Rank 1 exits with 5 before joining: rank 0's half-made segment is removed too."""
    jid = job_id()
    p, _ = shmrun(jid, ["-n", "4"], ["exit", "1", "5", "before-init"])
    check(p.returncode == 5, f"exit status {p.returncode}, expected 5", p.stderr)
    assert_clean(jid, p.stderr, 4)


def test_rank_exit_0_before_attach():
    """Rank 1 exits 0 without joining while the others wait for it to attach:
    shmrun ends the job at once (not after SHMRING_TIMEOUT), names rank 1 and
    exits 1."""
    jid = job_id()
    p, elapsed = shmrun(jid, ["-n", "3"], ["exit", "1", "0", "before-init"])
    check(p.returncode == 1, f"exit status {p.returncode}, expected 1", p.stderr)
    check(elapsed < 10.0, f"took {elapsed:.2f} s, expected under 10 s", p.stderr)
    check(re.search(r"rank 1 \(pid \d+\) exited with status 0 without attaching to job "
                    + re.escape(jid), p.stderr), "the message names rank 1", p.stderr)
    assert_clean(jid, p.stderr, 3)
    # A rank that exits 0 while the others run without it is no failure.
    p = subprocess.run([SHMRUN, "-n", "2", "--", "sh", "-c",
                        'test "$SHMRING_RANK" = 1 || sleep 1'], capture_output=True, text=True,
                       timeout=30)
    check(p.returncode == 0, f"an early exit 0 without a job segment: status {p.returncode}",
          p.stderr)


def test_unknown_setting():
    """A misspelt SHMRING_* name: rank 0 warns once, naming the setting meant;
    --info lists it."""
    env = dict(os.environ, SHMRING_SLOTBYTES="8192")
    p, _ = shmrun(job_id(), ["-n", "3"], ["once"], env=env)
    check(p.returncode == 0, f"status {p.returncode}", p.stderr)
    warning = ("SHMRING_SLOTBYTES is not a shmring setting (did you mean SHMRING_SLOT_BYTES?); "
               "it is ignored")
    check(p.stderr.count(warning) == 1, "one warning, from rank 0", p.stderr)
    p = subprocess.run([SHMRUN, "--info", "-x", "SHMRING_TIMOUT=3"], capture_output=True,
                       text=True, timeout=20, env=env)
    check(p.returncode == 0, f"--info: status {p.returncode}", p.stderr)
    check("SHMRING_SLOTBYTES [environment]: did you mean SHMRING_SLOT_BYTES?" in p.stdout and
          "SHMRING_TIMOUT [command line]: did you mean SHMRING_TIMEOUT?" in p.stdout,
          "--info names both", p.stdout)


def test_segv():
    """A worker dies of SIGSEGV: shmrun exits 139 and says which signal."""
    jid = job_id()
    p, _ = shmrun(jid, ["-n", "4"], ["segv", "1"])
    check(p.returncode == 139, f"exit status {p.returncode}, expected 139", p.stderr)
    check(re.search(r"rank 1 \(pid \d+\) was killed by signal 11 \(SEGV\)", p.stderr),
          "expected a summary naming rank 1 and SIGSEGV", p.stderr)
    assert_clean(jid, p.stderr, 4)


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True  # already reaped
    return stat[stat.rfind(")") + 2] == "Z"


def test_crash_named_first():
    """Ranks that end together are found by one pass of the launcher's
    waitpid, in the order they were started: the summary names the likeliest
    cause, a crash before an exit status before an abort (an uncaught error,
    often a peer's death). shmrun is stopped while the ranks end, so that
    all of them are found at once."""
    for how, rank, words, status in (
            (["exit1", "segv", "abort"], 1, "was killed by signal 11 (SEGV)", 139),
            (["abort", "exit1", "abort"], 1, "exited with status 1", 1)):
        jid = job_id()
        with tempfile.TemporaryDirectory() as d:
            flag = os.path.join(d, "end")
            cmd = [SHMRUN, "--report-bindings", "--job-id", jid, "-n", "3", "--", WORKER, "end_at",
                   flag, *how]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                ready = 0
                while ready < 3:
                    line = p.stdout.readline()
                    if line == "":
                        check(False, f"{how}: the ranks did not all start", p.stderr.read())
                    ready += line.startswith("ready ")
                head = ""
                while len(worker_pids(head)) < 3:
                    line = p.stderr.readline()
                    if line == "":
                        check(False, f"{how}: no bindings report", head)
                    head += line
                os.kill(p.pid, signal.SIGSTOP)
                open(flag, "w").close()
                # Every rank ends (a zombie: shmrun, stopped, cannot reap it).
                deadline = time.monotonic() + 20
                while not all(zombie(pid) for pid in worker_pids(head).values()):
                    check(time.monotonic() < deadline, f"{how}: the ranks did not end", head)
                    time.sleep(0.01)
                os.kill(p.pid, signal.SIGCONT)
                _, err = p.communicate(timeout=30)
                err = head + err
            finally:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                    p.wait()
        check(p.returncode == status, f"{how}: exit status {p.returncode}, expected {status}", err)
        check(re.search(rf"rank {rank} \(pid \d+\) {re.escape(words)}; job terminated", err),
              f"{how}: expected the summary to name rank {rank}: {words}", err)
        assert_clean(jid, err, 3)


def start_loop(jid, extra_worker_args, options=()):
    err = tempfile.TemporaryFile(mode="w+")
    cmd = [SHMRUN, "--report-bindings", "--job-id", jid, "-n", "4", *options, "--", WORKER,
           "loop", *extra_worker_args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    # Wait until the ranks are inside the allreduce loop.
    ready, _, _ = select.select([p.stdout], [], [], 30)
    check(ready and p.stdout.readline().strip() == "looping", "the workers never started looping")
    return p, err


def finish(p, err, timeout):
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"shmrun still running {timeout} s after the signal(s)")
    p.stdout.close()
    err.seek(0)
    return rc, err.read()


def test_sigint_once():
    """SIGINT during an allreduce loop: forwarded, everyone exits, shmrun dies of SIGINT."""
    jid = job_id()
    p, err = start_loop(jid, [])
    p.send_signal(signal.SIGINT)
    rc, stderr = finish(p, err, 20)
    check(rc == -signal.SIGINT, f"shmrun returned {rc}, expected death by SIGINT", stderr)
    check("received SIGINT" in stderr, "expected a note about the forwarded SIGINT", stderr)
    assert_clean(jid, stderr, 4)


def test_usr1_status():
    """kill -USR1 on a running shmrun prints its job's status table (one row
    per rank, each inside an allreduce or between two) to stderr, twice, and
    the job runs on until SIGINT."""
    jid = job_id()
    p, err = start_loop(jid, [])
    for _ in range(2):
        p.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        check(p.poll() is None, "SIGUSR1 ended the job")
    p.send_signal(signal.SIGINT)
    rc, stderr = finish(p, err, 20)
    check(rc == -signal.SIGINT, f"shmrun returned {rc}, expected death by SIGINT", stderr)
    check(stderr.count(f"shmrun: SIGUSR1: status of job {jid}") == 2, "two status reports", stderr)
    pids = worker_pids(stderr)
    for r in range(4):
        rows = re.findall(rf"^\s*{r}\s+{pids.get(r)}\s+(allreduce #\d+|idle \(last allreduce #\d+\))",
                          stderr, re.M)
        check(len(rows) == 2, f"rank {r} (pid {pids.get(r)}): expected a row per report", stderr)
    check("received SIGUSR1" not in stderr, "SIGUSR1 is not forwarded", stderr)
    assert_clean(jid, stderr, 4)


def test_sigint_twice():
    """Workers ignore SIGINT; a second SIGINT kills them at once (grace is 60 s)."""
    jid = job_id()
    p, err = start_loop(jid, ["ignore-int"], ["--grace", "60"])
    p.send_signal(signal.SIGINT)
    time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    rc, stderr = finish(p, err, 20)
    check(rc == -signal.SIGINT, f"shmrun returned {rc}, expected death by SIGINT", stderr)
    assert_clean(jid, stderr, 4)


def test_sigterm():
    """SIGTERM is forwarded like SIGINT."""
    jid = job_id()
    p, err = start_loop(jid, [])
    p.send_signal(signal.SIGTERM)
    rc, stderr = finish(p, err, 20)
    check(rc == -signal.SIGTERM, f"shmrun returned {rc}, expected death by SIGTERM", stderr)
    assert_clean(jid, stderr, 4)


def test_grace_kill():
    """Workers that ignore SIGTERM are SIGKILLed after --grace."""
    jid = job_id()
    p, err = start_loop(jid, ["ignore-all"], ["--timeout", "1", "--grace", "0.5"])
    rc, stderr = finish(p, err, 20)
    check(rc == 124, f"shmrun returned {rc}, expected 124", stderr)
    assert_clean(jid, stderr, 4)


def test_launcher_killed():
    """SIGKILL to shmrun itself: the workers die with it (PR_SET_PDEATHSIG)."""
    jid = job_id()
    p, err = start_loop(jid, [])
    p.kill()
    p.wait()
    err.seek(0)
    stderr = err.read()
    pids = worker_pids(stderr)
    check(len(pids) == 4, "expected 4 workers in the bindings report", stderr)

    def running(pid):  # a zombie waiting for init to reap it is dead already
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return False
        return stat[stat.rfind(")") + 2] != "Z"

    deadline = time.monotonic() + 10
    while any(running(q) for q in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    left = [q for q in pids.values() if running(q)]
    for q in left:
        os.kill(q, signal.SIGKILL)
    check(not left, f"workers outlived their launcher: {left}")
    # The ranks had all attached, so the segment name was already unlinked.
    check(not shm_entries(jid), f"segments left in /dev/shm: {shm_entries(jid)}")


def test_tag_output():
    """8 ranks x 1000 lines of 200 bytes on stdout and stderr: whole, tagged, in order."""
    np, count, length = 8, 1000, 200
    jid = job_id()
    cmd = [SHMRUN, "--tag-output", "--job-id", jid, "-n", str(np), "--", WORKER, "lines",
           str(count), str(length)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"exit status {p.returncode}", p.stderr[-2000:])
    for stream, text in (("out", p.stdout), ("err", p.stderr)):
        check(text.endswith("\n"), f"std{stream} must end with a newline")
        next_index = [0] * np
        last_seen = [False] * np
        pattern = re.compile(r"\[(\d+)\] (\d+) (out|err) (\d+|last)( (.*))?")
        for line in text.splitlines():
            if stream == "err" and line.startswith("shmrun: setting "):
                continue  # the launcher's own note (OMP_NUM_THREADS), untagged
            m = pattern.fullmatch(line)
            check(m, f"std{stream}: malformed line: {line[:120]!r}")
            tag, rank, s, index = int(m[1]), int(m[2]), m[3], m[4]
            check(tag == rank, f"std{stream}: line of rank {rank} tagged [{tag}]: {line[:80]!r}")
            check(s == stream, f"std{stream}: carries a line of std{s}: {line[:80]!r}")
            check(not last_seen[rank], f"std{stream}: rank {rank} has output after its last line")
            if index == "last":
                last_seen[rank] = True
                continue
            check(int(index) == next_index[rank],
                  f"std{stream}: rank {rank} line {index}, expected {next_index[rank]}")
            check(len(line) - len(f"[{tag}] ") == length,
                  f"std{stream}: line of {len(line)} bytes: {line[:80]!r}")
            next_index[rank] += 1
        check(next_index == [count] * np, f"std{stream}: lines per rank {next_index}")
        check(all(last_seen), f"std{stream}: final lines without newline seen: {last_seen}")
    check(not shm_entries(jid), "segments left in /dev/shm")


def test_tag_output_long_lines():
    """Lines of exactly 1 MiB stay whole; longer ones come in tagged pieces that
    join up to the line, with no empty line where a cut met the newline."""
    mib = 1 << 20
    for length, whole in ((mib, True), (2 * mib + 5, False)):
        jid = job_id()
        cmd = [SHMRUN, "--tag-output", "--job-id", jid, "-n", "1", "--", WORKER, "lines", "3",
               str(length)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"exit status {p.returncode}", p.stderr[-2000:])
        for stream, text in (("out", p.stdout), ("err", p.stderr)):
            lines = [line for line in text.splitlines() if not line.startswith("shmrun: ")]
            check(all(line.startswith("[0] ") for line in lines),
                  f"std{stream}: an untagged line of length {length}")
            pieces = [line[4:] for line in lines]
            check(all(pieces), f"std{stream}, lines of {length} bytes: an empty tagged line "
                  f"among {[len(x) for x in pieces]}")
            check(pieces[-1] == f"0 {stream} last", f"std{stream}: last line {pieces[-1][:40]!r}")
            body = "".join(pieces[:-1])
            expected = "".join(f"0 {stream} {i} ".ljust(length, "a") for i in range(3))
            check(body == expected, f"std{stream}: {len(body)} bytes came out of "
                  f"{len(expected)}, or not the same ones")
            if whole:
                check(len(pieces) == 4, f"std{stream}: lines of exactly 1 MiB were cut: "
                      f"{[len(x) for x in pieces]}")
            else:
                check(len(pieces) > 4 and all(len(x) < mib + (1 << 17) for x in pieces),
                      f"std{stream}: lines of {length} bytes not cut near 1 MiB: "
                      f"{[len(x) for x in pieces]}")
        check(not shm_entries(jid), "segments left in /dev/shm")


def closed_pipe():
    """The write end of a pipe whose reader is gone (a `| head` that has exited)."""
    r, w = os.pipe()
    os.close(r)
    return w


def output_lost_run(tag, stdout=None, stderr=None, worker_args=("lines", "3", "20"),
                    preexec_fn=None):
    """shmrun -n 2 (tagged or not) on launcher_worker with the given stdout and
    stderr (files, descriptors); returns (exit status, stderr text if it went
    to a file we can read, the job's id)."""
    jid = job_id()
    err_file = tempfile.TemporaryFile(mode="w+") if stderr is None else None
    cmd = [SHMRUN, *(["--tag-output"] if tag else []), "--job-id", jid, "-n", "2", "--", WORKER,
           *worker_args]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL if stdout is None else stdout,
                       stderr=err_file if stderr is None else stderr,
                       timeout=30, env=clean_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"),
                       preexec_fn=preexec_fn)
    text = ""
    if err_file is not None:
        err_file.seek(0)
        text = err_file.read()
    check(not shm_entries(jid), f"segments left in /dev/shm: {shm_entries(jid)}", text)
    return p.returncode, text, jid


def test_tag_output_head():
    """`shmrun --tag-output -n 2 -- prog | head -n 1` with prog writing without
    end: as the plain run, shmrun exits 141 (128 + SIGPIPE) within seconds,
    the workers killed by SIGPIPE at their next write, nothing left behind."""
    for tag in (False, True):
        jid = job_id()
        with tempfile.TemporaryFile(mode="w+") as err:
            cmd = [SHMRUN, "--report-bindings", *(["--tag-output"] if tag else []), "--job-id",
                   jid, "-n", "2", "--", WORKER, "lines", "100000000", "200"]
            start = time.monotonic()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                                 env=clean_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
            first = p.stdout.readline()
            p.stdout.close()  # `head -n 1` exits
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise AssertionError(f"tag={tag}: shmrun still ran 20 s after its reader left")
            elapsed = time.monotonic() - start
            err.seek(0)
            text = err.read()
        check(re.match(rb"(\[\d\] )?\d out 0 ", first) if tag else first.endswith(b"\n"),
              f"tag={tag}: first line {first[:60]!r}")
        check(p.returncode == 128 + signal.SIGPIPE,
              f"tag={tag}: exit status {p.returncode}, expected 141 (SIGPIPE) after "
              f"{elapsed:.1f} s", text[-2000:])
        assert_clean(jid, text, 2)


def test_tag_output_reader_gone():
    """Workers that write a few lines and exit 0 into a stdout or stderr whose
    reader is already gone: a plain run's workers die of SIGPIPE (exit 141);
    the relaying launcher reports the loss the same way, never 0."""
    for stream in ("stdout", "stderr"):
        for tag in (False, True):
            fd = closed_pipe()
            try:
                code, text, _ = output_lost_run(tag, **{stream: fd})
            finally:
                os.close(fd)
            check(code == 128 + signal.SIGPIPE,
                  f"{stream} closed by its reader, tag={tag}: exit status {code}, expected 141",
                  text[-2000:])
            if tag and stream == "stdout":
                check("--tag-output: writing the ranks' output to stdout failed (Broken pipe)"
                      in text, "the loss must be said on stderr", text[-2000:])


def test_tag_output_lost_after_exit():
    """Workers that have written all their output and exited 0 before the
    relay finds its reader gone: no worker dies of SIGPIPE, so only the
    launcher can tell of the loss, and it must (exit 141, as the plain run's
    workers would), for one rank (deterministic: its only write lands in the
    pipe) and for two."""
    for n in (1, 2):
        for tag in (False, True):
            fd = closed_pipe()
            try:
                jid = job_id()
                with tempfile.TemporaryFile(mode="w+") as err:
                    cmd = [SHMRUN, *(["--tag-output"] if tag else []), "--job-id", jid, "-n",
                           str(n), "--", "/bin/sh", "-c", "echo one line"]
                    p = subprocess.run(cmd, stdout=fd, stderr=err, timeout=30,
                                       env=clean_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
                    err.seek(0)
                    text = err.read()
            finally:
                os.close(fd)
            check(p.returncode == 128 + signal.SIGPIPE,
                  f"n={n} tag={tag}: exit status {p.returncode}, expected 141", text[-2000:])
            if tag:
                check("--tag-output: writing the ranks' output to stdout failed (Broken pipe)"
                      in text, "the loss must be said on stderr", text[-2000:])
            check(not shm_entries(jid), f"segments left in /dev/shm: {shm_entries(jid)}", text)


def test_tag_output_write_error():
    """Relayed output that cannot be written for another reason (stdout on a
    full disk, /dev/full; stdout closed, `>&-`): exit status 1 with the cause
    on stderr (as cat(1)), not 0; the ranks' stderr still arrives tagged, and
    a closed stdout's number never carries the relay into a worker's pipe."""
    with open("/dev/full", "w") as full:
        code, text, _ = output_lost_run(True, stdout=full)
    check(code == 1, f"stdout on /dev/full: exit status {code}, expected 1", text[-2000:])
    check("to stdout failed (No space left on device)" in text, "ENOSPC must be named",
          text[-2000:])
    code, text, _ = output_lost_run(True, preexec_fn=lambda: os.close(1))
    check(code == 1, f"stdout closed: exit status {code}, expected 1", text[-2000:])
    check("to stdout failed (Bad file descriptor)" in text, "EBADF must be named", text[-2000:])
    tagged = [line for line in text.splitlines() if not line.startswith("shmrun: ")]
    for rank in (0, 1):
        want = [f"[{rank}] {rank} err {i} " for i in range(3)] + [f"[{rank}] {rank} err last"]
        got = [line[:len(want[0])] if " last" not in line else line
               for line in tagged if line.startswith(f"[{rank}]")]
        check(got == want, f"stdout closed: rank {rank}'s stderr lines {got}", text[-2000:])


def test_timeout():
    """A hanging job with --timeout 2: a clear message and exit status 124."""
    jid = job_id()
    p, elapsed = shmrun(jid, ["-n", "3", "--timeout", "2"], ["hang"])
    check(p.returncode == 124, f"exit status {p.returncode}, expected 124", p.stderr)
    check("shmrun: job exceeded --timeout 2 s; terminated 3 worker(s)" in p.stderr,
          "expected the timeout message", p.stderr)
    check(elapsed >= 2.0, f"ended after {elapsed:.2f} s, before the timeout")
    assert_clean(jid, p.stderr, 3)


def test_environment():
    """Rank variables, torchrun's variables, -x, pass-through settings, binding."""
    jid = job_id()
    env = dict(os.environ, MASTER_PORT="29511")
    env.pop("MASTER_ADDR", None)
    p, _ = shmrun(jid, ["-n", "3", "--bind-to", "core", "--threads", "1", "--slots", "8",
                        "--slot-bytes", "8192", "-x", "EXTRA=a b=c"], ["env"], env=env)
    check(p.returncode == 0, f"exit status {p.returncode}", p.stderr)
    allowed = sorted(os.sched_getaffinity(0))
    lines = sorted(p.stdout.splitlines())
    check(len(lines) == 3, "expected one line per rank", p.stdout)
    for r, line in enumerate(lines):
        v = dict(kv.split("=", 1) for kv in re.findall(r"\S+=(?:a b=c|\S*)", line))
        expect = {"rank": str(r), "SHMRING_RANK": str(r), "RANK": str(r), "LOCAL_RANK": str(r),
                  "SHMRING_LOCAL_RANK": str(r), "SHMRING_WORLD_SIZE": "3", "WORLD_SIZE": "3",
                  "LOCAL_WORLD_SIZE": "3", "SHMRING_LOCAL_WORLD_SIZE": "3",
                  "SHMRING_JOB_ID": jid, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
                  "SHMRING_THREADS": "1", "SHMRING_SLOTS": "8", "SHMRING_SLOT_BYTES": "8192",
                  "EXTRA": "a b=c", "cpus": str(allowed[r % len(allowed)]),
                  # Forked before any thread: the launcher stays single-threaded.
                  "launcher_threads": "1"}
        for k, want in expect.items():
            check(v.get(k) == want, f"rank {r}: {k}={v.get(k)!r}, expected {want!r}", line)
        bound = re.search(rf"shmrun: rank {r} \(pid \d+\) bound to core (\d+)", p.stderr)
        check(bound and int(bound[1]) == allowed[r % len(allowed)], "binding report", p.stderr)
    # Without MASTER_PORT set, shmrun picks one, the same for every rank.
    # mpirun's "-np" spelling works, and "-np" in the program's arguments is left alone.
    p, _ = shmrun(job_id(), ["-np", "2"], ["env", "-np"])
    ports = set(re.findall(r"MASTER_PORT=(\d+)", p.stdout))
    check(p.returncode == 0 and len(ports) == 1 and 0 < int(ports.pop()) < 65536,
          "expected one free MASTER_PORT for all ranks", p.stdout)
    # torchrun's two spellings of its option work as well.
    for spelling in (["--nproc-per-node", "2"], ["--nproc_per_node", "2"], ["--nproc_per_node=2"]):
        p, _ = shmrun(job_id(), spelling, ["env"])
        check(p.returncode == 0 and len(env_lines(p.stdout)) == 2, f"{spelling}: two ranks",
              p.stdout + p.stderr)


def start_creator(jid):
    """launcher_worker create: rank 0 of 2 of job `jid`, waiting for a rank
    1 that never comes (no launcher variables of ours leak into it)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SHMRING_") and k not in ("RANK", "WORLD_SIZE")}
    return subprocess.Popen([WORKER, "create", jid], env=env)


def test_status_while_starting():
    """--status shows a job whose ranks have not all attached yet: rank 0
    waits in its constructor for rank 1, which never comes."""
    jid = job_id()
    creator = start_creator(jid)
    try:
        deadline = time.monotonic() + 20
        while True:
            p = subprocess.run([SHMRUN, "--status", "--job-id", jid], capture_output=True,
                               text=True, timeout=20)
            if p.returncode == 0:
                break
            check("no running shmring job" in p.stdout, "unexpected --status output",
                  p.stdout + p.stderr)
            check(time.monotonic() < deadline, "--status never found the starting job", p.stdout)
            time.sleep(0.05)
        check(re.search(rf"^job segment shmring-{os.getuid()}-{re.escape(jid)}-\S+: 2 ranks, "
                        r"starting \(1 attached\)$", p.stdout, re.M), "the job's line", p.stdout)
        check(re.search(rf"^\s*0\s+{creator.pid}\s+starting: waits for every rank to attach",
                        p.stdout, re.M), "rank 0's row", p.stdout)
        check(re.search(r"^\s*0\s+\d+\s+starting: waits for every rank to attach\s+-\s+-\s+"
                        r"waits for rank 1", p.stdout, re.M), "rank 0 waits for rank 1", p.stdout)
        check(re.search(r"^\s*1\s+-\s+not attached", p.stdout, re.M), "rank 1's row", p.stdout)
    finally:
        creator.kill()
        creator.wait()
        for n in shm_entries(jid):
            os.unlink(f"/dev/shm/{n}")


def test_list_cleanup():
    """--list shows a stale segment (creator dead); --cleanup removes it."""
    # A segment is stale once its creator (rank 0) died before every rank
    # attached: here rank 1 of 2 never comes, and rank 0 is SIGKILLed.
    jid = job_id()
    creator = start_creator(jid)
    try:
        # Wait until the creator has filled the header and holds its lock.
        deadline = time.monotonic() + 20
        alive = re.compile(rf"^shmring-{os.getuid()}-{re.escape(jid)}-\S+ .*"
                           rf"creator pid {creator.pid} \(alive\)$", re.M)
        while True:
            p = subprocess.run([SHMRUN, "--list"], capture_output=True, text=True, timeout=20)
            if alive.search(p.stdout):
                break
            check(time.monotonic() < deadline, "--list never showed the live creator", p.stdout)
            time.sleep(0.02)
        creator.kill()
        creator.wait()
        name = shm_entries(jid)[0]
        p = subprocess.run([SHMRUN, "--list"], capture_output=True, text=True, timeout=20)
        check(p.returncode == 0, f"--list exit status {p.returncode}", p.stderr)
        check(re.search(rf"^{re.escape(name)} .*creator pid {creator.pid} \(dead\)$", p.stdout,
                        re.M), "--list must show the segment with its dead creator", p.stdout)
        check(shm_entries(jid), "--list must not remove anything")
        time.sleep(1.1)  # --cleanup leaves segments younger than 1 s alone
        # --job-id keeps this test away from other jobs' stale segments.
        p = subprocess.run([SHMRUN, "--cleanup", "--job-id", jid], capture_output=True, text=True,
                           timeout=20)
        check(p.returncode == 0, f"--cleanup exit status {p.returncode}", p.stdout + p.stderr)
        check(f"removed {name}" in p.stdout, "--cleanup must report the removal", p.stdout)
        check(not shm_entries(jid), "--cleanup left the stale segment")
    finally:
        creator.kill()
        creator.wait()
        for n in shm_entries(jid):
            os.unlink(f"/dev/shm/{n}")


def test_usage_errors():
    """Bad options get a clear message and status 2; a missing program gets 127."""
    cases = [(["-n", "0", "true"], "-n"), (["--bind-to", "socket", "-n", "2", "true"], "socket"),
             (["-n", "2"], "program"), (["--timeout", "-1", "-n", "1", "true"], "--timeout"),
             (["-x", "1X=2", "-n", "1", "true"], "1X=2"),
             (["--slot-bytes", "5000", "-n", "1", "true"], "4096"),
             (["--job-id", "a/b", "-n", "1", "true"], "a/b"),
             # Not a number at all: said so (and never a crash).
             (["-n", "abc", "true"], "'abc': expected an integer from 1 to 4096"),
             (["--timeout", "soon", "-n", "1", "true"], "'soon': expected a number"),
             (["--slot-bytes", "big", "-n", "1", "true"], "'big': expected a multiple of 4096"),
             # Decimal, not octal: 010000 is ten thousand, no multiple of 4096.
             (["--slot-bytes", "010000", "-n", "1", "true"], "10000': expected a multiple"),
             # CLI11's own words for these ("At Most 1 required but received 2")
             # are put plainly.
             (["-n"], "--np needs a value after it"),
             (["-n", "2", "--timeout"], "--timeout needs a value after it"),
             (["-n", "2", "-n", "3", "true"], "--np was given more than once")]
    for args, word in cases:
        p = subprocess.run([SHMRUN, *args], capture_output=True, text=True, timeout=20)
        check(p.returncode == 2, f"{args}: exit status {p.returncode}, expected 2", p.stderr)
        check(word in p.stderr, f"{args}: message should name {word!r}", p.stderr)
    # --status, --list and --cleanup start no program and take no launch options.
    for args, word in [(["--status", "-n", "2", "--", "true"], "-n"),
                       (["--status", "true"], "'true'"), (["--list", "-n", "2"], "-n"),
                       (["--cleanup", "-x", "A=1"], "-x"),
                       (["--status", "--bind-to", "core"], "--bind-to")]:
        p = subprocess.run([SHMRUN, *args], capture_output=True, text=True, timeout=20)
        check(p.returncode == 2, f"{args}: exit status {p.returncode}, expected 2", p.stderr)
        check(word in p.stderr, f"{args}: message should name {word!r}", p.stderr)
    p = subprocess.run([SHMRUN, "-n", "3", "/nonexistent/prog"], capture_output=True, text=True,
                       timeout=20)
    check(p.returncode == 127, f"missing program: exit status {p.returncode}", p.stderr)
    check(p.stderr.count("cannot run '/nonexistent/prog'") == 1, "one message", p.stderr)
    check("setting OMP_NUM_THREADS" not in p.stderr,
          "no word of the threads it set for a program that never ran", p.stderr)
    p = subprocess.run([SHMRUN, "-n", "2", "--bogus", "--", "true"], capture_output=True,
                       text=True, timeout=20)
    check(p.returncode == 2 and "unknown option '--bogus'" in p.stderr,
          f"an unknown option is a usage error, not the program (status {p.returncode})", p.stderr)
    check(p.stderr.startswith("shmrun: "), "usage errors start with 'shmrun: '", p.stderr)
    p = subprocess.run([SHMRUN, "-n", "1", "no-such-program-here"], capture_output=True,
                       text=True, timeout=20)
    check(p.returncode == 127 and "PATH" in p.stderr, "a bare name says it was looked up on PATH",
          p.stderr)
    p = subprocess.run([SHMRUN, "--version"], capture_output=True, text=True, timeout=20)
    check(p.returncode == 0 and p.stdout.startswith("shmrun (shmring) "), "--version", p.stdout)


def test_every_rank_reports():
    """A bad setting fails every rank alike: each prints its error before the
    teardown (shmrun waits a moment after the first failure), status 1."""
    jid = job_id()
    p, elapsed = shmrun(jid, ["-n", "4", "-x", "SHMRING_SLOTS=1"], ["comm"])
    check(p.returncode == 1, f"exit status {p.returncode}, expected 1", p.stderr)
    said = {int(m) for m in re.findall(r"launcher_worker: rank (\d+): .*SHMRING_SLOTS='1'",
                                         p.stderr)}
    check(said == {0, 1, 2, 3}, f"ranks that printed the error: {sorted(said)}", p.stderr)
    check(elapsed < 5.0, f"took {elapsed:.2f} s", p.stderr)
    assert_clean(jid, p.stderr, 4)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "SHMRING_JOB_ID")}
    env.update(extra)
    return env


def env_lines(stdout):
    out = {}
    for line in stdout.splitlines():
        v = dict(kv.split("=", 1) for kv in re.findall(r"\S+=\S*", line))
        out[int(v["rank"])] = v
    return out


def test_threads_env():
    """OMP_NUM_THREADS and MKL_NUM_THREADS = CPUs / ranks unless set, said once."""
    per_rank = str(max(1, len(os.sched_getaffinity(0)) // 2))
    p, _ = shmrun(job_id(), ["-n", "2"], ["env"], env=clean_env())
    check(p.returncode == 0, f"exit status {p.returncode}", p.stderr)
    for r, v in env_lines(p.stdout).items():
        check(v["OMP_NUM_THREADS"] == per_rank and v["MKL_NUM_THREADS"] == per_rank,
              f"rank {r}: expected {per_rank} threads", p.stdout)
    said = re.findall(r"^shmrun: setting OMP_NUM_THREADS and MKL_NUM_THREADS=(\d+) for each rank",
                      p.stderr, re.M)
    check(said == [per_rank], "one line saying so", p.stderr)
    cpus = len(os.sched_getaffinity(0))
    check(f"({cpus} CPU{'s' if cpus > 1 else ''} / 2 ranks)" in p.stderr, "says why", p.stderr)
    p, _ = shmrun(job_id(), ["-n", "1"], ["env"], env=clean_env())
    check(f"CPU{'s' if cpus > 1 else ''} / 1 rank)" in p.stderr, "one rank, not '1 ranks'",
          p.stderr)
    # Bound to cores: each rank's share is its own cores, even when the
    # ranks outnumber the cores (not "4 CPUs" on a 2-CPU machine).
    p, _ = shmrun(job_id(), ["-n", "4", "--bind-to", "core"], ["env"], env=clean_env())
    check(p.returncode == 0, f"exit status {p.returncode}", p.stderr)
    check("=1 for each rank (--bind-to core: 1 core(s) per rank)" in p.stderr,
          "bound ranks: one core each", p.stderr)
    # The user's own setting wins, from the environment or -x; only the
    # other one is set (and named).
    p, _ = shmrun(job_id(), ["-n", "2"], ["env"], env=clean_env(OMP_NUM_THREADS="3"))
    for r, v in env_lines(p.stdout).items():
        check(v["OMP_NUM_THREADS"] == "3" and v["MKL_NUM_THREADS"] == per_rank, f"rank {r}",
              p.stdout)
    check("setting MKL_NUM_THREADS=" in p.stderr and "OMP_NUM_THREADS and" not in p.stderr,
          "names only what it set", p.stderr)
    p, _ = shmrun(job_id(), ["-n", "2", "-x", "OMP_NUM_THREADS=5", "-x", "MKL_NUM_THREADS=6"],
                  ["env"], env=clean_env())
    for r, v in env_lines(p.stdout).items():
        check(v["OMP_NUM_THREADS"] == "5" and v["MKL_NUM_THREADS"] == "6", f"rank {r}", p.stdout)
    check("setting" not in p.stderr, "nothing to say", p.stderr)


def test_job_id_export():
    """-x SHMRING_JOB_ID=ID is --job-id ID; -x of a rank variable is refused;
    each job gets a nonce of its own, the same on its ranks."""
    jid = job_id()
    p = subprocess.run([SHMRUN, "-n", "2", "-x", f"SHMRING_JOB_ID={jid}", "--", WORKER, "env"],
                       capture_output=True, text=True, timeout=30, env=clean_env())
    check(p.returncode == 0, f"exit status {p.returncode}", p.stderr)
    lines = env_lines(p.stdout)
    check({v["SHMRING_JOB_ID"] for v in lines.values()} == {jid}, "job id honoured", p.stdout)
    nonces = {v["SHMRING_JOB_NONCE"] for v in lines.values()}
    check(len(nonces) == 1 and re.fullmatch(r"[0-9a-f]{16}", next(iter(nonces))),
          "one nonce per job", p.stdout)
    p2 = subprocess.run([SHMRUN, "-n", "1", "-x", f"SHMRING_JOB_ID={jid}", "--", WORKER, "env"],
                        capture_output=True, text=True, timeout=30, env=clean_env())
    check(env_lines(p2.stdout)[0]["SHMRING_JOB_NONCE"] not in nonces, "a fresh nonce per job",
          p2.stdout)
    cases = [(["--job-id", "a", "-x", "SHMRING_JOB_ID=b"], "disagrees with --job-id"),
             (["-x", "SHMRING_JOB_ID=a/b"], "a/b"),
             (["-x", "SHMRING_RANK=1"], "shmrun sets SHMRING_RANK"),
             (["-x", "WORLD_SIZE=4"], "shmrun sets WORLD_SIZE"),
             # A flag and -x for one setting must agree (the flag used to win
             # without a word).
             (["--threads", "3", "-x", "SHMRING_THREADS=2"],
              "SHMRING_THREADS=2 disagrees with --threads 3"),
             (["-x", "SHMRING_SLOTS=8", "--slots", "4"], "SHMRING_SLOTS=8 disagrees with --slots 4"),
             (["--slot-bytes", "8192", "-x", "SHMRING_SLOT_BYTES=8k"],
              "SHMRING_SLOT_BYTES=8k disagrees with --slot-bytes 8192")]
    for args, word in cases:
        p = subprocess.run([SHMRUN, "-n", "2", *args, "--", WORKER, "env"], capture_output=True,
                           text=True, timeout=20)
        check(p.returncode == 2, f"{args}: exit status {p.returncode}, expected 2", p.stderr)
        check(word in p.stderr, f"{args}: message should name {word!r}", p.stderr)
    # The same value twice is no conflict.
    p = subprocess.run([SHMRUN, "-n", "2", "--threads", "2", "-x", "SHMRING_THREADS=2", "--",
                        WORKER, "env"], capture_output=True, text=True, timeout=30, env=clean_env())
    check(p.returncode == 0, f"--threads 2 -x SHMRING_THREADS=2: exit status {p.returncode}",
          p.stderr)
    check({v["SHMRING_THREADS"] for v in env_lines(p.stdout).values()} == {"2"},
          "SHMRING_THREADS=2 on every rank", p.stdout)


def test_two_jobs_same_id():
    """Two shmruns given one --job-id at the same moment (job-identity.md,
    input 1): never a wrong sum; a job either runs correctly or fails within
    seconds saying that two jobs share the job id."""
    failed = 0
    for attempt in range(5):
        jid = job_id()
        env = clean_env(SHMRING_TIMEOUT="20")
        start = time.monotonic()
        procs = [subprocess.Popen([SHMRUN, "-n", "2", "--job-id", jid, "--", WORKER, "sum",
                                   str(base)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env) for base in (1000, 2000)]
        outs = [p.communicate(timeout=60) for p in procs]
        elapsed = time.monotonic() - start
        for base, p, (out, err) in zip((1000, 2000), procs, outs):
            sums = re.findall(r"sum=(\d+)", out)
            if p.returncode == 0:
                check(sums == [str(2 * base + 1)] * 2, f"attempt {attempt}: wrong sums {sums}",
                      out + err)
            else:
                failed += 1
                check(all(s == str(2 * base + 1) for s in sums),
                      f"attempt {attempt}: wrong sums {sums}", out + err)
                check("two jobs share job id" in err, f"attempt {attempt}: job {base}: the "
                      "error must say that two jobs share the job id", err)
        check(elapsed < 10, f"attempt {attempt}: took {elapsed:.1f} s", "")
        check(not shm_entries(jid), f"segments left in /dev/shm: {shm_entries(jid)}")
    print(f"{failed} of 10 jobs failed with the diagnosis, the others ran correctly")


if __name__ == "__main__":
    globals()["test_" + sys.argv[3]]()
