"""One rank of a refusal test: `refusal_worker.py SCENARIO RANK SIZE JOB_ID`.

Started by test_refusals.py through conftest.run_ranks. Rank 1 makes a call
that the Python bindings refuse before the core sees it (wrong dtype,
layout, size...); the other ranks make the matching good call. Every rank
must raise at once (never wait until the timeout): rank 1 its own error,
the others MismatchError naming rank 1; afterwards the communicator is
broken on every rank alike (AbortedError). Exits 0 when every check held.
"""

import os
import sys
import time

import numpy as np

import shmring

BAD_RANK = 1
# Far above what a refusal may take, far below the communicator's timeout
# (WORKER_TIMEOUT): a peer that waited for the refusing rank cannot pass.
FAST_S = 10.0


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def values(rank, count, dtype=np.float32):
    """Distinct per (rank, index)."""
    return (np.arange(count) * 3 + rank * 100 + 1).astype(dtype)


def released_memoryview():
    m = memoryview(bytearray(16))
    m.release()
    return m


# name -> (bad call on rank 1, good call on the others, what rank 1 raises,
#          words rank 1's message must hold)
def cases(size):
    n = 8
    return {
        "allreduce_dtype": (
            lambda c: c.allreduce(np.ones(n, dtype=np.complex64)),
            lambda c: c.allreduce(values(c.rank, n)),
            shmring.InvalidArgumentError,
            ["rank 1", "allreduce", "dtype complex64 (element format 'Zf', 8 bytes)"]),
        "allreduce_readonly": (
            lambda c: c.allreduce(np.frombuffer(bytes(4 * n), dtype=np.float32)),
            lambda c: c.allreduce(values(c.rank, n)),
            shmring.InvalidArgumentError, ["rank 1", "read-only"]),
        "allreduce_noncontiguous": (
            lambda c: c.allreduce(values(c.rank, 2 * n)[::2]),
            lambda c: c.allreduce(values(c.rank, n)),
            shmring.InvalidArgumentError, ["rank 1", "not C-contiguous"]),
        "allreduce_out_mismatch": (
            lambda c: c.allreduce(values(c.rank, n), out=np.empty(n + 1, dtype=np.float32)),
            lambda c: c.allreduce(values(c.rank, n), out=np.empty(n, dtype=np.float32)),
            shmring.InvalidArgumentError, ["rank 1", "out holds"]),
        "allgather_size": (
            lambda c: c.allgather(values(c.rank, n), np.empty(size * n - 1, dtype=np.float32)),
            lambda c: c.allgather(values(c.rank, n), np.empty(size * n, dtype=np.float32)),
            shmring.InvalidArgumentError, ["rank 1", "allgather", str(size * n - 1)]),
        "reduce_scatter_size": (
            lambda c: c.reduce_scatter(values(c.rank, size * n + 1),
                                       np.empty(n, dtype=np.float32)),
            lambda c: c.reduce_scatter(values(c.rank, size * n), np.empty(n, dtype=np.float32)),
            shmring.InvalidArgumentError, ["rank 1", "reduce_scatter", str(size * n + 1)]),
        "reduce_scatter_dtype": (
            lambda c: c.reduce_scatter(values(c.rank, size * n, np.float64),
                                       np.empty(n, dtype=np.float32)),
            lambda c: c.reduce_scatter(values(c.rank, size * n), np.empty(n, dtype=np.float32)),
            shmring.InvalidArgumentError, ["rank 1", "float64", "float32"]),
        "broadcast_readonly": (
            lambda c: c.broadcast(np.frombuffer(bytes(4 * n), dtype=np.float32), 0),
            lambda c: c.broadcast(values(c.rank, n), 0),
            shmring.InvalidArgumentError, ["rank 1", "broadcast", "read-only"]),
        "reduce_out": (
            lambda c: c.reduce(values(c.rank, n), root=0, out=np.empty(n, dtype=np.float64)),
            lambda c: c.reduce(values(c.rank, n), root=0),
            shmring.InvalidArgumentError, ["rank 1", "reduce", "float64"]),
        "not_a_buffer": (
            lambda c: c.allreduce([1.0, 2.0]),
            lambda c: c.allreduce(values(c.rank, n)),
            shmring.InvalidArgumentError, ["rank 1", "list"]),
        # The buffer's own export fails: the Python error stays as it was.
        "released_memoryview": (
            lambda c: c.allreduce(released_memoryview()),
            lambda c: c.allreduce(values(c.rank, n)),
            ValueError, ["released"]),
        # Arguments pybind11 would otherwise convert before the call.
        "op_type": (
            lambda c: c.allreduce(values(c.rank, n), "sum"),
            lambda c: c.allreduce(values(c.rank, n), shmring.ReduceOp.SUM),
            TypeError, ["'sum'", "ReduceOp"]),
        "root_type": (
            lambda c: c.broadcast(values(c.rank, n), root=None),
            lambda c: c.broadcast(values(c.rank, n), root=0),
            TypeError, ["None", "int"]),
        "root_bool": (
            lambda c: c.broadcast(values(c.rank, n), root=False),
            lambda c: c.broadcast(values(c.rank, n), root=0),
            TypeError, ["rank 1", "an argument is bool False, expected an int"]),
        "reduce_out_size": (
            lambda c: c.reduce(values(c.rank, n), root=BAD_RANK,
                               out=np.empty(n - 1, dtype=np.float32)),
            lambda c: c.reduce(values(c.rank, n), root=BAD_RANK),
            shmring.InvalidArgumentError, ["rank 1", "reduce", f"out holds {n - 1}"]),
        "alltoall_size": (
            lambda c: c.alltoall(values(c.rank, size * n), np.empty(size * n + 1, np.float32)),
            lambda c: c.alltoall(values(c.rank, size * n), np.empty(size * n, np.float32)),
            shmring.InvalidArgumentError, ["rank 1", "alltoall", str(size * n + 1)]),
        "alltoallv_counts": (
            lambda c: c.alltoallv(values(c.rank, size * n), [n] * (size + 1),
                                  np.empty(size * n, np.float32), [n] * size),
            lambda c: c.alltoallv(values(c.rank, size * n), [n] * size,
                                  np.empty(size * n, np.float32), [n] * size),
            shmring.InvalidArgumentError, ["rank 1", "alltoallv", f"{size + 1} entries"]),
        "alltoallv_count_past_int64": (
            lambda c: c.alltoallv(values(c.rank, size * n), [2**64] + [n] * (size - 1),
                                  np.empty(size * n, np.float32), [n] * size),
            lambda c: c.alltoallv(values(c.rank, size * n), [n] * size,
                                  np.empty(size * n, np.float32), [n] * size),
            shmring.InvalidArgumentError,
            ["rank 1", "alltoallv", "send_counts[0]=18446744073709551616 is too large"]),
        "alltoallv_block_outside": (
            lambda c: c.alltoallv(values(c.rank, size * n), [n] * size,
                                  np.empty(size * n - 1, np.float32), [n] * size),
            lambda c: c.alltoallv(values(c.rank, size * n), [n] * size,
                                  np.empty(size * n, np.float32), [n] * size),
            shmring.InvalidArgumentError, ["rank 1", "alltoallv", f"its {size * n - 1} elements"]),
        "gather_out_size": (
            lambda c: c.gather(values(c.rank, n), np.empty(size * n + 2, np.float32),
                               root=BAD_RANK),
            lambda c: c.gather(values(c.rank, n), None, root=BAD_RANK),
            shmring.InvalidArgumentError, ["rank 1", "gather", str(size * n + 2)]),
        "gather_no_out": (
            lambda c: c.gather(values(c.rank, n), None, root=BAD_RANK),
            lambda c: c.gather(values(c.rank, n), None, root=BAD_RANK),
            shmring.InvalidArgumentError, ["rank 1", "gather", "needs `out`"]),
        "scatter_send_size": (
            lambda c: c.scatter(values(c.rank, size * n - 1), np.empty(n, np.float32),
                                root=BAD_RANK),
            lambda c: c.scatter(None, np.empty(n, np.float32), root=BAD_RANK),
            shmring.InvalidArgumentError, ["rank 1", "scatter", str(size * n - 1)]),
        "allgatherv_block_outside": (
            lambda c: c.allgatherv(values(c.rank, n), np.empty(size * n - 3, np.float32),
                                   [n] * size),
            lambda c: c.allgatherv(values(c.rank, n), np.empty(size * n, np.float32), [n] * size),
            shmring.InvalidArgumentError, ["rank 1", "allgatherv", f"its {size * n - 3} elements"]),
        "allgatherv_negative": (
            lambda c: c.allgatherv(values(c.rank, n), np.empty(size * n, np.float32),
                                   [n] * (size - 1) + [-5]),
            lambda c: c.allgatherv(values(c.rank, n), np.empty(size * n, np.float32), [n] * size),
            shmring.InvalidArgumentError, ["rank 1", "allgatherv", "=-5 must be >= 0"]),
        "reduce_scatter_v_out": (
            lambda c: c.reduce_scatter_v(values(c.rank, size * n), np.empty(n + 4, np.float32),
                                         [n] * size),
            lambda c: c.reduce_scatter_v(values(c.rank, size * n), np.empty(n, np.float32),
                                         [n] * size),
            shmring.InvalidArgumentError, ["rank 1", "reduce_scatter_v", f"out holds {n + 4}"]),
        "reduce_scatter_v_send": (
            lambda c: c.reduce_scatter_v(values(c.rank, size * n + 1), np.empty(n, np.float32),
                                         [n] * size),
            lambda c: c.reduce_scatter_v(values(c.rank, size * n), np.empty(n, np.float32),
                                         [n] * size),
            shmring.InvalidArgumentError, ["rank 1", "reduce_scatter_v", str(size * n + 1)]),
        "async_allgather_size": (
            lambda c: c.allgather(values(c.rank, n), np.empty(size * n + 1, np.float32),
                                  async_op=True),
            lambda c: c.allgather(values(c.rank, n), np.empty(size * n, np.float32),
                                  async_op=True).wait(),
            shmring.InvalidArgumentError, ["rank 1", "allgather", str(size * n + 1)]),
        "async_reduce_scatter_v_out": (
            lambda c: c.reduce_scatter_v(values(c.rank, size * n), np.empty(n + 1, np.float32),
                                         [n] * size, async_op=True),
            lambda c: c.reduce_scatter_v(values(c.rank, size * n), np.empty(n, np.float32),
                                         [n] * size, async_op=True).wait(),
            shmring.InvalidArgumentError, ["rank 1", "reduce_scatter_v", f"out holds {n + 1}"]),
        "async_type": (
            lambda c: c.alltoall(values(c.rank, size * n), np.empty(size * n, np.float32),
                                 async_op="yes"),
            lambda c: c.alltoall(values(c.rank, size * n), np.empty(size * n, np.float32),
                                 async_op=True).wait(),
            TypeError, ["'yes'", "bool"]),
        # Eager: the root returns before the readers take their blocks.
        "scatter_out_readonly": (
            lambda c: c.scatter(None, np.frombuffer(bytes(4 * n), dtype=np.float32), root=0),
            lambda c: c.scatter(values(c.rank, size * n) if c.rank == 0 else None,
                                np.empty(n, np.float32), root=0),
            shmring.InvalidArgumentError, ["rank 1", "scatter", "read-only"]),
        # Arguments pybind11 cannot bind, refused before the bindings' checks.
        "misbound_keyword": (
            lambda c: c.allreduce(values(c.rank, n), bogus=1),
            lambda c: c.allreduce(values(c.rank, n)),
            TypeError, ["rank 1", "allreduce() takes (buffer", "bogus=int"]),
        "misbound_count": (
            lambda c: c.broadcast(values(c.rank, n), 0, 1),
            lambda c: c.broadcast(values(c.rank, n), 0),
            TypeError, ["rank 1", "broadcast() takes", "(ndarray, int, int)"]),
        "none_op": (
            lambda c: c.allreduce(values(c.rank, n), None),
            lambda c: c.allreduce(values(c.rank, n)),
            TypeError, ["rank 1: allreduce: an argument is NoneType None", "shmring.ReduceOp"]),
        "root_out_of_range": (
            lambda c: c.broadcast(values(c.rank, n), root=2**40),
            lambda c: c.broadcast(values(c.rank, n), root=0),
            shmring.InvalidArgumentError, ["rank 1", "1099511627776", "out of range"]),
        "split_color_type": (
            lambda c: c.split("red"),
            lambda c: c.split(0),
            TypeError, ["rank 1", "split: an argument is str 'red', expected an int"]),
        "split_keyword": (
            lambda c: c.split(colour=0),
            lambda c: c.split(0),
            TypeError, ["rank 1", "split() takes (color, key=0), not (colour=int)"]),
        "split_color_out_of_range": (
            lambda c: c.split(2**40),
            lambda c: c.split(0),
            shmring.InvalidArgumentError, ["rank 1", "1099511627776", "out of range"]),
        # Non-blocking: refused at once, and told to the peers too.
        "async_dtype": (
            lambda c: c.allreduce(np.ones(n, dtype=np.complex64), async_op=True),
            lambda c: c.allreduce(values(c.rank, n), async_op=True).wait(),
            shmring.InvalidArgumentError, ["rank 1", "allreduce"]),
    }


def expect(fn, exc_type, words):
    t0 = time.monotonic()
    try:
        fn()
    except exc_type as e:
        elapsed = time.monotonic() - t0
        check(elapsed < FAST_S, f"raised after {elapsed:.1f} s: {e}")
        for w in words:
            check(w in str(e), f"{type(e).__name__} lacks {w!r}: {e}")
        return e
    except Exception as e:  # noqa: BLE001  reported with its type
        raise AssertionError(f"expected {exc_type.__name__} naming {words}, got "
                             f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}")
    raise AssertionError(f"no {exc_type.__name__} (expected one naming {words})")


def run_case(comm, name, bad, good, exc_type, words):
    # A gather's non-roots and a scatter's root may return without waiting
    # (the eager paths): they learn of the refusal at their next call, which
    # fails on every rank before it moves data (docs/guide/errors.md).
    eager = name.startswith(("gather", "scatter"))
    buf = np.ones(2, dtype=np.float32)
    follow_up = lambda: comm.allreduce(buf)  # noqa: E731
    if comm.rank == BAD_RANK:
        expect(lambda: bad(comm), exc_type, words)
    elif eager:
        try:
            good(comm)
        except shmring.MismatchError as e:
            check(f"rank {BAD_RANK} made an invalid call" in str(e), str(e))
        else:
            expect(follow_up, shmring.MismatchError, [f"rank {BAD_RANK} made an invalid call"])
            check(np.array_equal(buf, np.ones(2, dtype=np.float32)),
                  f"{name}: the failed call wrote {buf}")
    else:
        expect(lambda: good(comm), shmring.MismatchError,
               [f"rank {BAD_RANK} made an invalid call"])
    # Broken alike on every rank, the refusing one included.
    expect(follow_up, shmring.AbortedError,
           ["unusable", f"rank {BAD_RANK} made an invalid call"])
    print(f"{name} ok", flush=True)


def scenario_one_rank(rank, size, job_id, timeout, only):
    """Each case on a communicator of its own (a refusal breaks it)."""
    for name, case in cases(size).items():
        if only and name not in only:
            continue
        with shmring.Communicator(rank=rank, size=size, job_id=f"{job_id}-{name}",
                                  timeout=timeout) as comm:
            run_case(comm, name, *case)


# Far below WORKER_TIMEOUT: a peer's error must arrive at once, not after a wait.
PEER_FAST_S = 3.0


def scenario_told_why(rank, size, job_id, timeout, only):
    """Rank 1 passes an output of the wrong shape; each peer's MismatchError
    arrives within PEER_FAST_S and names rank 1 and what was wrong with its
    call (the refusing rank's own words), not only that it refused."""
    n = 8
    calls = {
        # out has 2 x n elements instead of n: send is not size() x out.
        "reduce_scatter_out": (
            lambda c: c.reduce_scatter(values(c.rank, size * n), np.empty((2, n), np.float32)),
            lambda c: c.reduce_scatter(values(c.rank, size * n), np.empty(n, np.float32)),
            [f"send holds {size * n} elements, expected size() x out = {size} x {2 * n}"]),
        # out has one row too few.
        "allgather_out": (
            lambda c: c.allgather(values(c.rank, n), np.empty((size - 1, n), np.float32)),
            lambda c: c.allgather(values(c.rank, n), np.empty((size, n), np.float32)),
            [f"out holds {(size - 1) * n} elements, expected size() x send"]),
        "async_allgather_out": (
            lambda c: c.allgather(values(c.rank, n), np.empty(size * n + 1, np.float32),
                                  async_op=True),
            lambda c: c.allgather(values(c.rank, n), np.empty(size * n, np.float32),
                                  async_op=True).wait(),
            [f"out holds {size * n + 1} elements"]),
        "allreduce_out_dtype": (
            lambda c: c.allreduce(values(c.rank, n), out=np.empty(n, np.float64)),
            lambda c: c.allreduce(values(c.rank, n), out=np.empty(n, np.float32)),
            ["float32", "float64"]),
    }
    for name, (bad, good, words) in calls.items():
        if only and name not in only:
            continue
        with shmring.Communicator(rank=rank, size=size, job_id=f"{job_id}-{name}",
                                  timeout=timeout) as comm:
            if rank == BAD_RANK:
                e = expect(lambda: bad(comm), shmring.InvalidArgumentError, ["rank 1"] + words)
            else:
                t0 = time.monotonic()
                e = expect(lambda: good(comm), shmring.MismatchError,
                           [f"rank {BAD_RANK} made an invalid call"] + words)
                elapsed = time.monotonic() - t0
                check(elapsed < PEER_FAST_S, f"{name}: the peer's error took {elapsed:.2f} s: {e}")
            print(f"{name} ok: {e}", flush=True)


def scenario_queued(rank, size, job_id, timeout, only):
    """A refusal while requests are pending keeps the call order: the pending
    ones complete with the right values on every rank, the refused call
    fails on every rank after them."""
    n = 1000
    with shmring.Communicator(rank=rank, size=size, job_id=job_id, timeout=timeout) as comm:
        first = values(rank, n)
        r1 = comm.allreduce(first, async_op=True)
        second = values(rank, n) * 2
        r2 = comm.allreduce(second, async_op=True)
        if rank == BAD_RANK:
            expect(lambda: comm.allreduce(np.ones(n, dtype=np.complex64), async_op=True),
                   shmring.InvalidArgumentError, ["rank 1", "element format"])
        else:
            r3 = comm.allreduce(values(rank, n), async_op=True)
        r1.wait()
        r2.wait()
        want = sum(values(r, n) for r in range(size))
        check(np.array_equal(first, want), "first pending allreduce")
        check(np.array_equal(second, want * 2), "second pending allreduce")
        if rank != BAD_RANK:
            expect(r3.wait, shmring.MismatchError, [f"rank {BAD_RANK} made an invalid call"])
        expect(lambda: comm.barrier(), shmring.AbortedError, ["unusable"])
        print("queued ok", flush=True)


def scenario_every_rank(rank, size, job_id, timeout, only):
    """Refused alike on every rank: nobody waits, the communicator stays
    usable and the next collective is right."""
    n = 16
    with shmring.Communicator(rank=rank, size=size, job_id=job_id, timeout=timeout) as comm:
        for _ in range(3):
            expect(lambda: comm.allreduce(np.ones(n, dtype=np.complex64)),
                   shmring.InvalidArgumentError, [f"rank {rank}", "element format"])
            expect(lambda: comm.allgather(values(rank, n), np.empty(n, dtype=np.float32),
                                          async_op=True),
                   shmring.InvalidArgumentError, [f"rank {rank}", "allgather"])
            expect(lambda: comm.allreduce(values(rank, n), op=None, bogus=2), TypeError,
                   [f"rank {rank}", "bogus=int"])
        buf = values(rank, n)
        comm.allreduce(buf)
        check(np.array_equal(buf, sum(values(r, n) for r in range(size))), "allreduce after")
        # Displacements positionally, as documented (MPI's argument order).
        counts = [r + 1 for r in range(size)]
        displs = [sum(counts[:r]) + r for r in range(size)]
        out = np.zeros(displs[-1] + counts[-1], np.float32)
        comm.allgatherv(np.full(rank + 1, rank, np.float32), out, counts, displs)
        for r in range(size):
            check(np.all(out[displs[r]:displs[r] + counts[r]] == r), f"allgatherv block {r}: {out}")
        send = np.full(size, rank, np.float32)
        got = np.zeros(2 * size, np.float32)
        comm.alltoallv(send, [1] * size, got, [1] * size, list(range(size)),
                       [2 * r for r in range(size)])
        check(np.array_equal(got[::2], np.arange(size, dtype=np.float32)), f"alltoallv: {got}")
        print("every rank ok", flush=True)


def scenario_busy_thread(rank, size, job_id, timeout, only):
    """While a thread of rank 0 runs a collective, its second thread makes
    calls the bindings refuse: each raises (the one-thread rule, or its own
    TypeError) and nothing reaches the call order, so the running collective
    and the next one complete right on every rank."""
    import threading
    n = 1 << 16
    with shmring.Communicator(rank=rank, size=size, job_id=job_id, timeout=timeout) as comm:
        big = values(rank, n)
        if rank == 0:
            failed = []

            def run():
                try:
                    comm.allreduce(big)
                except Exception as e:  # noqa: BLE001  reported below
                    failed.append(e)

            t = threading.Thread(target=run)
            t.start()
            time.sleep(0.5)  # the thread waits in its allreduce for rank 1 (2 s away)
            expect(lambda: comm.allreduce(np.ones(4, dtype=np.complex64)),
                   shmring.InvalidArgumentError,
                   ["rank 0", "already running a collective in another thread"])
            expect(lambda: comm.allreduce(values(rank, 4), op="max"), TypeError, ["ReduceOp"])
            expect(lambda: comm.allreduce(values(rank, 4), bogus=1), TypeError, ["bogus"])
            t.join()
            check(not failed, f"the running allreduce failed: {failed}")
        else:
            time.sleep(2.0)
            comm.allreduce(big)
        check(np.array_equal(big, sum(values(r, n) for r in range(size))), "the running allreduce")
        buf = values(rank, 8)
        comm.allreduce(buf)
        check(np.array_equal(buf, sum(values(r, 8) for r in range(size))), "the next allreduce")
        print("busy thread ok", flush=True)


def main():
    scenario, rank, size, job_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    timeout = float(os.environ.get("WORKER_TIMEOUT", "60"))
    only = set(filter(None, os.environ.get("WORKER_CASES", "").split(",")))
    globals()["scenario_" + scenario](rank, size, job_id, timeout, only)


if __name__ == "__main__":
    main()
