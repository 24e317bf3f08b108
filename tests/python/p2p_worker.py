"""One rank of a send/recv test: `p2p_worker.py SCENARIO RANK SIZE JOB_ID`.

Started by test_p2p.py, one process per rank; exits 0 when every check held
(a failed check raises: non-zero exit, reason on stderr).
"""

import gc
import sys
import time
import warnings

import numpy as np

import shmring


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def message(src, dst, tag, count, dtype=np.int64):
    """Distinct per (sender, receiver, tag, index)."""
    i = np.arange(count, dtype=np.int64)
    return (src * 1_000_003 + dst * 10_007 + tag * 131 + i * 7).astype(dtype)


def scenario_ring(comm):
    """isend to the right, blocking recv from the left, numpy zero copy, every
    path (inline, staged, single copy) and several dtypes."""
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    for count in [0, 1, 5, 1000, 100_000, (1 << 20) + 3]:
        for dtype in [np.int64, np.float32, np.uint8]:
            out = message(rank, right, 1, count, dtype)
            inb = np.full(count, 0, dtype)
            req = comm.send(out, right, 1, async_op=True)
            got = comm.recv(inb, left, 1)
            req.wait()
            check(got is inb, "recv returns its buffer")
            check(np.array_equal(inb, message(left, rank, 1, count, dtype)),
                  f"ring count {count} {dtype}: wrong data")
    # irecv first, then a blocking send; the request's result is the buffer.
    out = message(rank, left, 2, 777)
    r = comm.recv(np.zeros(777, np.int64), right, 2, async_op=True)
    comm.send(out, left, 2)
    r.wait()
    check(np.array_equal(r.result, message(right, rank, 2, 777)), "irecv result")


def scenario_errors(comm):
    """Argument errors and a dtype mismatch on both ranks (N=2)."""
    rank, peer = comm.rank, 1 - comm.rank
    x = np.zeros(100, np.float32)
    for bad_peer in [rank, 2, -1]:
        try:
            comm.send(x, bad_peer)
            raise AssertionError(f"peer {bad_peer} accepted")
        except shmring.InvalidArgumentError as e:
            check(f"rank {rank}" in str(e) and f"peer {bad_peer}" in str(e), str(e))
    try:
        comm.recv(x, peer, tag=-1)
        raise AssertionError("tag -1 accepted")
    except ValueError as e:  # InvalidArgumentError is a ValueError too
        check("tag -1" in str(e), str(e))
    try:
        comm.recv(np.zeros(3, np.float32)[::2], peer)
        raise AssertionError("a strided buffer was accepted")
    except shmring.InvalidArgumentError:
        pass
    # float32 against int32, 20 KB (above the eager limit: the send waits for
    # the receiver): both ranks raise MismatchError naming both.
    try:
        if rank == 0:
            comm.send(np.zeros(5000, np.float32), peer, 4)
        else:
            comm.recv(np.zeros(5000, np.int32), peer, 4)
        raise AssertionError("mismatch not raised")
    except shmring.MismatchError as e:
        check("float32" in str(e) and "int32" in str(e), str(e))
    # 400 B goes eager: the send returns before the receiver sees it, and the
    # sender's next send to that peer raises the mismatch.
    if rank == 0:
        comm.send(np.zeros(100, np.float32), peer, 6)
        comm.recv(np.zeros(1, np.int64), peer, 7)  # the receiver has failed by now
        try:
            comm.send(np.zeros(1, np.int64), peer, 6)
            raise AssertionError("buffered mismatch not raised at the next send")
        except shmring.MismatchError as e:
            check("float32" in str(e) and "int32" in str(e), str(e))
    else:
        try:
            comm.recv(np.zeros(100, np.int32), peer, 6)
            raise AssertionError("mismatch not raised")
        except shmring.MismatchError as e:
            check("float32" in str(e) and "int32" in str(e), str(e))
        comm.send(np.zeros(1, np.int64), peer, 7)
    # Still usable.
    out = message(rank, peer, 5, 10)
    r = comm.send(out, peer, 5, async_op=True)
    got = comm.recv(np.zeros(10, np.int64), peer, 5)
    r.wait()
    check(np.array_equal(got, message(peer, rank, 5, 10)), "after errors")


BIG = 1 << 18  # 1 MiB of float32: single copy, or staged (SHMRING_CMA=0)


def recv_must_fail(comm, src, tag):
    """The recv of a message whose send ended early raises (within 10 s,
    whatever SHMRING_TIMEOUT) and never delivers the sender's reused bytes."""
    buf = np.full(BIG, -1.0, np.float32)
    t0 = time.monotonic()
    try:
        comm.recv(buf, src, tag)
        raise AssertionError(
            f"the recv returned ({int((buf == 7.0).sum())} elements are the reused 7.0)")
    except shmring.Error as e:
        print(f"rank {comm.rank}: recv failed after {time.monotonic() - t0:.2f} s: {e}")
    check(not (buf == 7.0).any(), "bytes of the reused send buffer arrived")
    check(time.monotonic() - t0 < 10, "the recv took 10 s or more to fail")


def scenario_failed_send(comm):
    """A send that timed out (SHMRING_TIMEOUT=1, the receiver comes late):
    the caller reuses its buffer; the late recv raises, naming the send."""
    if comm.rank == 0:
        buf = np.full(BIG, 42.0, np.float32)
        try:
            comm.send(buf, 1, 9)
            raise AssertionError("the send did not time out")
        except shmring.TimeoutError:
            pass
        buf[:] = 7.0
        time.sleep(2.5)
        try:
            comm.send(buf[:1], 1, 1)
            raise AssertionError("a send after the failure succeeded")
        except shmring.AbortedError as e:
            check("unusable" in str(e), str(e))
    else:
        time.sleep(1.8)
        recv_must_fail(comm, 0, 9)


def scenario_dropped_request(comm):
    """A pending isend Request garbage-collected: dropping it waits for it
    (it fails at SHMRING_TIMEOUT), the buffer is reused, the recv raises."""
    if comm.rank == 0:
        buf = np.full(BIG, 42.0, np.float32)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            req = comm.send(buf, 1, 9, async_op=True)
            del req
            gc.collect()
        check(any("dropped before wait()" in str(w.message) for w in seen),
              f"no warning for the failed dropped request: {[str(w.message) for w in seen]}")
        buf[:] = 7.0
        time.sleep(2.5)
    else:
        time.sleep(1.8)
        recv_must_fail(comm, 0, 9)


def scenario_dropped_irecv(comm):
    """A pending irecv Request garbage-collected: dropping it waits for it
    (it fails at SHMRING_TIMEOUT, with a RuntimeWarning); rank 0's later
    send raises at once naming rank 1's recv, and nothing is written into
    the dropped recv's array."""
    if comm.rank == 1:
        buf = np.full(BIG, -1.0, np.float32)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            req = comm.recv(buf, 0, 9, async_op=True)
            del req
            gc.collect()
        check(any("dropped before wait()" in str(w.message) for w in seen),
              f"no warning for the failed dropped irecv: {[str(w.message) for w in seen]}")
        time.sleep(2.5)  # rank 0 sends meanwhile
        check((buf == -1.0).all(),
              f"{int((buf != -1.0).sum())} elements of the dropped recv's array were written")
    else:
        time.sleep(1.8)
        for n in (BIG, 3):  # rendezvous and inline
            t0 = time.monotonic()
            try:
                comm.send(np.full(n, 42.0, np.float32), 1, 9)
                raise AssertionError(f"a send of {n} after the dropped irecv returned")
            except shmring.Error as e:
                check("rank 1: timed out" in str(e) and "recv(count=262144, float32)" in str(e),
                      f"the send's error does not name rank 1's recv: {e}")
            check(time.monotonic() - t0 < 0.5,
                  f"the send of {n} took {time.monotonic() - t0:.2f} s to fail")


def main():
    scenario, rank, size, job_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with shmring.Communicator(rank=rank, size=size, job_id=job_id) as comm:
        globals()["scenario_" + scenario](comm)


if __name__ == "__main__":
    main()
