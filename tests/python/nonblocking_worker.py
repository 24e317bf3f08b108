"""One rank of a non-blocking test: `nonblocking_worker.py SCENARIO RANK SIZE JOB_ID`.

Started by test_nonblocking.py, one process per rank; exits 0 when every
check held (a failed check raises: non-zero exit, reason on stderr).
"""

import gc
import pathlib
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

import shmring


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def values(rank, count, salt=0):
    """Distinct per (rank, index), exact in float32 sums over a few ranks."""
    i = np.arange(count, dtype=np.int64)
    return (rank * 100_003 + (i * 7 + salt) % 65_521).astype(np.int64)


def scenario_family(comm):
    """Every collective with async_op=True equals its blocking form; all are
    in flight at once and waited in reverse order."""
    import torch

    rank, size = comm.rank, comm.size
    for count in [0, 1, size + 1, 1001, 300_007]:
        x = values(rank, count).astype(np.float64)
        ref_ar = comm.allreduce(x.copy())
        rs_send = values(rank, size * count, 3)
        ref_rs = comm.reduce_scatter(rs_send, np.empty(count, np.int64))
        ref_ag = comm.allgather(x, np.empty(size * count))
        bc = values(rank, count, 5).astype(np.int32) if rank == 1 % size else np.zeros(count, np.int32)
        ref_bc = comm.broadcast(bc.copy(), root=1 % size)
        ref_rd = comm.reduce(x.copy(), root=0)

        reqs = []
        ar = x.copy()
        reqs.append(comm.allreduce(ar, async_op=True))
        rs = np.full(count, -1, np.int64)
        reqs.append(comm.reduce_scatter(rs_send, rs, async_op=True))
        ag = np.full(size * count, -1.0)
        reqs.append(comm.allgather(x, ag, async_op=True))
        bco = bc.copy()
        reqs.append(comm.broadcast(bco, root=1 % size, async_op=True))
        rd = x.copy()
        reqs.append(comm.reduce(rd, root=0, async_op=True))
        # A torch tensor whose only reference is the request's: kept alive.
        t = torch.from_numpy(x.astype(np.float32))
        tr = comm.allreduce(t, async_op=True)
        del t
        gc.collect()
        reqs.append(tr)
        reqs.append(comm.barrier(async_op=True))
        for r in reversed(reqs):
            check(r.wait() is True, "wait() did not return True")
            check(r.is_completed(), "not completed after wait")
        check(np.array_equal(ar, ref_ar), f"allreduce {count}")
        check(np.array_equal(ar, sum(values(q, count) for q in range(size)).astype(np.float64)),
              f"allreduce {count} vs formula")
        check(np.array_equal(rs, ref_rs), f"reduce_scatter {count}")
        check(np.array_equal(ag, ref_ag), f"allgather {count}")
        check(np.array_equal(bco, ref_bc), f"broadcast {count}")
        if rank == 0:
            check(np.array_equal(rd, ref_rd), f"reduce {count}")
        got = tr.result.numpy()
        check(np.array_equal(got, ref_ar.astype(np.float32)), f"torch allreduce {count}")


def scenario_timeout(comm):
    """wait(timeout) is False while a peer is late, then True; is_completed
    polls without blocking."""
    buf = np.full(1000, comm.rank + 1, np.int32)
    if comm.rank == 1:
        time.sleep(0.4)
    req = comm.allreduce(buf, async_op=True)
    if comm.rank == 0:
        t0 = time.monotonic()
        check(req.wait(timeout=0.05) is False, "complete before the peer started")
        check(time.monotonic() - t0 < 5, "wait(timeout) overslept")
        check(not req.is_completed(), "is_completed true while pending")
        check(req.wait(timeout=-1) is False, "a negative timeout polls")
        try:
            req.wait(timeout=float("nan"))
            check(False, "wait(timeout=nan) accepted")
        except shmring.InvalidArgumentError as e:
            check("timeout=nan" in str(e), str(e))
        while not req.is_completed():
            time.sleep(0.001)
    check(req.wait(timeout=30) is True, "not complete")
    check(np.all(buf == 3), "values")


def scenario_errors(comm):
    """Mismatched counts: MismatchError from wait() on every rank; a request
    started after it raises AbortedError; an argument error raises at once."""
    buf = np.ones(100, np.float32)
    try:
        comm.allreduce(np.ones(3, np.int32), shmring.ReduceOp.AVG, async_op=True)
        raise AssertionError("avg on int32 accepted")
    except shmring.InvalidArgumentError:
        pass
    bad = comm.allreduce(buf[: 10 + comm.rank], async_op=True)
    later = comm.allreduce(buf, async_op=True)
    try:
        bad.wait()
        raise AssertionError("no MismatchError")
    except shmring.MismatchError as e:
        check("mismatch" in str(e), str(e))
    try:
        later.wait()
        raise AssertionError("no AbortedError")
    except shmring.AbortedError:
        pass


def scenario_gil(comm):
    """While one thread waits on a request, another Python thread runs."""
    buf = np.ones(1000, np.float32)
    if comm.rank == 1:
        time.sleep(0.5)
    req = comm.allreduce(buf, async_op=True)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.005)

    th = threading.Thread(target=ticker)
    th.start()
    req.wait()
    stop.set()
    th.join()
    if comm.rank == 0:
        check(len(ticks) >= 5, f"the other thread ran only {len(ticks)} times: GIL held")
    check(np.all(buf == 2), "values")


def raised(cls, fn):
    """The `cls` error fn() raises (AssertionError if none)."""
    try:
        fn()
    except cls as e:
        return e
    raise AssertionError(f"no {cls.__name__}")


def drop_and_catch(req):
    """Drops `req` (its last reference) and returns the warnings that gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del req
        gc.collect()
    return [w for w in caught if issubclass(w.category, RuntimeWarning)]


def scenario_dropped_timeout(comm):
    """Rank 0 drops a pending allreduce that rank 1 never joins: the drop
    returns after SHMRING_TIMEOUT with a RuntimeWarning naming the
    TimeoutError, and the next call raises AbortedError quoting it."""
    done = pathlib.Path(tempfile.gettempdir()) / f"{sys.argv[4]}.dropped"  # the job id
    if comm.rank == 1:
        # Stays alive (a dead peer is another error) until rank 0 is done.
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        done.unlink(missing_ok=True)
        return
    try:
        buf = np.ones(100, np.float32)
        caught = drop_and_catch(comm.allreduce(buf, async_op=True))
        check(len(caught) == 1, f"dropping a failed request warned {len(caught)} times")
        text = str(caught[0].message)
        check("wait()" in text and "TimeoutError: " in text, text)
        # The communicator keeps the error: the next call quotes it.
        later = str(raised(shmring.AbortedError, comm.barrier))
        check(text.split("TimeoutError: ", 1)[1] in later, f"{later!r} does not quote {text!r}")
    finally:
        done.touch()


def scenario_dropped(comm):
    """Dropped requests: a successful one, and one whose error wait() already
    raised, warn of nothing; a failed one nobody waited for warns with its
    MismatchError on every rank."""
    rank = comm.rank
    buf = values(rank, 1000).astype(np.float64)
    check(drop_and_catch(comm.allreduce(buf, async_op=True)) == [], "a success warned")
    check(np.array_equal(buf, sum(values(q, 1000) for q in range(comm.size))), "values")
    caught = drop_and_catch(comm.allreduce(buf[: 10 + rank], async_op=True))
    check(len(caught) == 1 and "MismatchError" in str(caught[0].message),
          f"a dropped mismatch warned: {[str(w.message) for w in caught]}")
    seen = comm.barrier(async_op=True)
    raised(shmring.AbortedError, seen.wait)
    check(drop_and_catch(seen) == [], "an error wait() raised was warned of again")


def scenario_finalize(comm):
    """finalize() returns after the rank's pending calls completed; a peer
    that meets it in another collective is told this rank is leaving."""
    rank, size = comm.rank, comm.size
    x = values(rank, 1001).astype(np.float64)
    req = comm.allreduce(x, async_op=True)
    comm.finalize()
    check(req.is_completed(), "the allreduce before finalize() is not complete")
    check(np.array_equal(x, sum(values(q, 1001) for q in range(size)).astype(np.float64)),
          "allreduce before finalize()")
    # Rank 0 leaves while the others still reduce: both sides fail at once.
    y = np.ones(8, np.float32)
    if rank == 0:
        err = raised(shmring.MismatchError, comm.finalize)
    else:
        err = raised(shmring.MismatchError, lambda: comm.allreduce(y))
        check("the rank is leaving" in str(err), f"rank {rank}: {err}")
    check(np.array_equal(y, np.ones(8, np.float32)), f"rank {rank}: y written")


def main():
    scenario, rank, size, job_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with shmring.Communicator(rank=rank, size=size, job_id=job_id) as comm:
        globals()["scenario_" + scenario](comm)


if __name__ == "__main__":
    main()
