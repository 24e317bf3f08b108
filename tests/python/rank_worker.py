"""One rank of a multi-process test: `rank_worker.py SCENARIO RANK SIZE JOB_ID`.

Started by test_multi_rank.py, one process per rank. It builds a
Communicator from explicit arguments, runs the scenario and exits 0 when
every check held; a failed check raises and the exit code is non-zero, with
the reason on stderr.
"""

import os
import signal
import sys
import threading
import time

import numpy as np

import shmring

NUMPY_TYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64]
FLOAT_OPS = [shmring.ReduceOp.SUM, shmring.ReduceOp.PROD, shmring.ReduceOp.MIN,
             shmring.ReduceOp.MAX, shmring.ReduceOp.AVG]
INT_OPS = FLOAT_OPS[:4]
# Counts around the interesting edges: empty, one, fewer than the ranks, not a
# multiple of them, and larger than one slot.
COUNTS = [0, 1, 3, 1001, 300_007]


def values(rank, count):
    """Small integers, distinct per (rank, index), exactly representable in
    every datatype (int8 and bfloat16 included) and whose sums, products,
    minima and maxima over a few ranks stay exact too."""
    i = np.arange(count, dtype=np.int64)
    return ((i * 7 + rank * 3) % 5 + 1).astype(np.int64)  # 1..5


def expected(op, size, count):
    per_rank = np.stack([values(r, count) for r in range(size)]).astype(np.float64)
    if op == shmring.ReduceOp.SUM:
        return per_rank.sum(0)
    if op == shmring.ReduceOp.PROD:
        return per_rank.prod(0)
    if op == shmring.ReduceOp.MIN:
        return per_rank.min(0)
    if op == shmring.ReduceOp.MAX:
        return per_rank.max(0)
    return per_rank.sum(0) / size


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def close_enough(got, want, rel):
    """AVG divides: exact for float32/float64 here except for rounding of /size."""
    return np.allclose(got, want, rtol=rel, atol=0)


def scenario_collectives(comm):
    rank, size = comm.rank, comm.size
    for dtype in NUMPY_TYPES:
        ops = FLOAT_OPS if np.issubdtype(dtype, np.floating) else INT_OPS
        for op in ops:
            for count in COUNTS:
                if op == shmring.ReduceOp.PROD and np.dtype(dtype).itemsize == 1:
                    continue  # 5**4 wraps int8/uint8; covered by the C++ tests.
                buf = values(rank, count).astype(dtype)
                address = buf.__array_interface__["data"][0]
                out = comm.allreduce(buf, op)
                check(out is buf, "in place: allreduce returns the buffer it was given")
                check(buf.__array_interface__["data"][0] == address, "no reallocation")
                want = expected(op, size, count)
                rel = 1e-3 if dtype == np.float16 else 1e-6
                ok = close_enough(buf.astype(np.float64), want, rel)
                check(ok, f"numpy {np.dtype(dtype).name} {op} count {count}: "
                          f"{buf[:8]} != {want[:8]}")
    # Out of place into a separate array: the input is left alone.
    src = values(rank, 1001).astype(np.float32)
    src.flags.writeable = False  # Only read: read-only is fine here.
    dst = np.empty_like(src)
    check(comm.allreduce(src, out=dst) is dst, "out= returns out")
    check(np.array_equal(dst, expected(shmring.ReduceOp.SUM, size, 1001)), "out= values")
    check(np.array_equal(src, values(rank, 1001)), "out= leaves the input unchanged")
    # Multi-dimensional, contiguous: fine; counts are elements, not rows.
    m = values(rank, 12).astype(np.float64).reshape(3, 4)
    comm.allreduce(m)
    check(np.array_equal(m.reshape(-1), expected(shmring.ReduceOp.SUM, size, 12)), "2-D array")
    # Other buffer-protocol objects: bytearray is uint8.
    b = bytearray(values(rank, 10).astype(np.uint8).tobytes())
    comm.allreduce(b, shmring.ReduceOp.MAX)
    check(list(b) == list(expected(shmring.ReduceOp.MAX, size, 10).astype(int)), "bytearray")

    try:
        import torch
    except ImportError:
        print("torch is not installed: torch buffers not checked")
        return
    torch.set_num_threads(1)
    torch_types = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                   torch.uint8, torch.int32, torch.int64]
    for dtype in torch_types:
        ops = FLOAT_OPS if dtype.is_floating_point else INT_OPS
        for op in ops:
            for count in [0, 1, 1001, 300_007]:
                if op == shmring.ReduceOp.PROD and dtype in (torch.int8, torch.uint8):
                    continue
                t = torch.from_numpy(values(rank, count)).to(dtype)
                ptr = t.data_ptr()
                out = comm.allreduce(t, op)
                check(out is t and t.data_ptr() == ptr, f"torch {dtype}: in place, same storage")
                want = torch.from_numpy(expected(op, size, count))
                if op == shmring.ReduceOp.AVG:
                    # Reference rounding: average in float64, round once to dtype.
                    ok = torch.allclose(t.double(), want.to(dtype).double(), rtol=1e-2, atol=0)
                else:
                    # Exact, but a product of four values may need rounding
                    # to bfloat16's 8 bits (partial products stay exact).
                    ok = torch.equal(t.double(), want.to(dtype).double())
                check(ok, f"torch {dtype} {op} count {count}: {t[:8]} != {want[:8]}")
    # A contiguous view into a larger tensor (DLPack byte_offset / data pointer).
    base = torch.zeros(20)
    view = base[5:15]
    view.copy_(torch.from_numpy(values(rank, 10)).float())
    comm.allreduce(view)
    check(torch.equal(base[5:15].double(), torch.from_numpy(expected(shmring.ReduceOp.SUM, size, 10))),
          "view of a larger tensor reduced in place")
    check(torch.count_nonzero(base[:5]) == 0 and torch.count_nonzero(base[15:]) == 0,
          "memory around the view untouched")
    # Every rank ends with the same bits, also in bfloat16.
    noisy = torch.randn(10_000, generator=torch.Generator().manual_seed(rank)).bfloat16()
    comm.allreduce(noisy)
    gathered = torch.zeros(size, 10_000, dtype=torch.bfloat16)
    gathered[rank] = noisy
    comm.allreduce(gathered)  # Sum with zeros: an allgather.
    check(all(torch.equal(gathered[0], gathered[r]) for r in range(size)),
          "bitwise identical bfloat16 results on every rank")


def scenario_family(comm):
    """reduce_scatter, allgather, broadcast, reduce, barrier and split, on
    numpy and torch buffers, in and out of place."""
    rank, size = comm.rank, comm.size
    k = 1001
    full = expected(shmring.ReduceOp.SUM, size, size * k)
    # reduce_scatter, out of place and in place (out is this rank's slice of send).
    send = values(rank, size * k).astype(np.float64)
    out = np.empty(k)
    check(comm.reduce_scatter(send, out) is out, "reduce_scatter returns out")
    check(np.array_equal(out, full[rank * k:(rank + 1) * k]), "reduce_scatter values")
    send = values(rank, size * k).astype(np.float64)
    comm.reduce_scatter(send, send[rank * k:(rank + 1) * k])
    check(np.array_equal(send[rank * k:(rank + 1) * k], full[rank * k:(rank + 1) * k]),
          "reduce_scatter in place")
    # allgather: rank order, and in place from this rank's slice.
    mine = np.full(k, rank + 1, dtype=np.int32)
    gathered = np.zeros(size * k, dtype=np.int32)
    comm.allgather(mine, gathered)
    check(np.array_equal(gathered, np.repeat(np.arange(1, size + 1), k)), "allgather values")
    gathered = np.zeros(size * k, dtype=np.int32)
    gathered[rank * k:(rank + 1) * k] = rank + 1
    comm.allgather(gathered[rank * k:(rank + 1) * k], gathered)
    check(np.array_equal(gathered, np.repeat(np.arange(1, size + 1), k)), "allgather in place")
    # broadcast from the last rank, whose buffer may be read-only.
    root = size - 1
    b = np.arange(k, dtype=np.float32) if rank == root else np.zeros(k, dtype=np.float32)
    if rank == root:
        b.flags.writeable = False
    comm.broadcast(b, root)
    check(np.array_equal(b, np.arange(k, dtype=np.float32)), "broadcast values")
    # reduce to rank 1 (or 0), in place at the root.
    root = 1 % size
    r = values(rank, k).astype(np.int64)
    comm.reduce(r, shmring.ReduceOp.MAX, root)
    if rank == root:
        check(np.array_equal(r, expected(shmring.ReduceOp.MAX, size, k)), "reduce at root")
    else:
        check(np.array_equal(r, values(rank, k)), "reduce leaves non-root buffers alone")
    comm.barrier()
    # split: even and odd ranks, reversed by key.
    with comm.split(rank % 2, key=-rank) as sub:
        members = [r for r in range(size) if r % 2 == rank % 2]
        check(sub.size == len(members), "split size")
        check(sub.rank == sorted(members, reverse=True).index(rank), "split rank order by key")
        x = np.array([rank], dtype=np.int64)
        sub.allreduce(x)
        check(x[0] == sum(members), "allreduce on the split communicator")
    try:
        import torch
    except ImportError:
        return
    t = torch.full((k,), float(rank + 1), dtype=torch.bfloat16)
    g = torch.zeros(size * k, dtype=torch.bfloat16)
    comm.allgather(t, g)
    check(torch.equal(g.float(), torch.arange(1, size + 1).float().repeat_interleave(k)),
          "allgather of bfloat16 tensors")
    h = torch.full((k,), 7.0 if rank == 0 else 0.0, dtype=torch.float16)
    comm.broadcast(h, 0)
    check(bool((h == 7).all()), "broadcast of float16 tensors")


def scenario_mismatch(comm):
    # Ranks disagree on the count: every rank must get MismatchError, then
    # the communicator refuses further work with AbortedError.
    buf = np.ones(100 + comm.rank, dtype=np.float32)
    try:
        comm.allreduce(buf)
    except shmring.MismatchError as e:
        check(e.code == shmring.ErrorCode.MISMATCH, "code attribute")
        check(isinstance(e, shmring.Error) and isinstance(e, RuntimeError), "hierarchy")
    else:
        raise AssertionError("no MismatchError")
    try:
        comm.allreduce(np.ones(4, dtype=np.float32))
    except shmring.AbortedError:
        pass
    else:
        raise AssertionError("no AbortedError after a mismatch")


def scenario_peer_failure(comm):
    if comm.rank == comm.size - 1:
        os._exit(0)  # Dies without a word: the others must notice.
    try:
        comm.allreduce(np.ones(1000, dtype=np.float32))
    except shmring.PeerFailureError as e:
        check(isinstance(e, ConnectionError), "PeerFailureError is a ConnectionError")
        check(e.code == shmring.ErrorCode.PEER_FAILURE, "code attribute")
    except shmring.AbortedError:
        pass  # Another survivor saw the death first and aborted the job.
    else:
        raise AssertionError("no PeerFailureError")


def scenario_timeout(comm):
    # Rank 0 waits (timeout 2 s, set by the test) for a rank that is alive
    # but late; it must get the builtin-compatible TimeoutError.
    if comm.rank == 0:
        try:
            comm.allreduce(np.ones(10, dtype=np.float32))
        except TimeoutError as e:
            check(isinstance(e, shmring.TimeoutError), "shmring.TimeoutError")
            check(e.code == shmring.ErrorCode.TIMEOUT, "code attribute")
        else:
            raise AssertionError("no TimeoutError")
    else:
        time.sleep(4)
        try:
            comm.allreduce(np.ones(10, dtype=np.float32))
        except shmring.Error:
            pass  # Aborted by rank 0's timeout (or timed out itself).
        else:
            raise AssertionError("a late rank completed an allreduce its peer gave up on")


def interrupted(wait, what):
    """Sends this process SIGINT 0.5 s from now and runs wait(): it must
    raise KeyboardInterrupt within about a wait-check period, not after the
    timeout (60 s here)."""
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        wait()
    except KeyboardInterrupt:
        took = time.monotonic() - start
        check(took < 3.0, f"KeyboardInterrupt {took:.2f} s into {what} (signal at 0.5 s)")
    else:
        raise AssertionError(f"{what} returned, or raised something else")


def aborted_by_interrupt(fn, needle="interrupted by a signal (KeyboardInterrupt)"):
    try:
        fn()
    except shmring.AbortedError as e:
        check(needle in str(e), str(e))
    else:
        raise AssertionError(f"no AbortedError naming {needle!r}")


def late_peer_sees_interrupt(comm):
    time.sleep(4)
    aborted_by_interrupt(lambda: comm.allreduce(np.ones(10, dtype=np.float32)),
                         "rank 0: aborted the job: interrupted by a signal (KeyboardInterrupt)")


def scenario_interrupt(comm):
    # Ctrl-C while rank 0's blocking allreduce waits for a late peer; the
    # interrupt aborts the communicator, and the peer's next collective
    # fails naming it.
    if comm.rank == 0:
        interrupted(lambda: comm.allreduce(np.ones(10, dtype=np.float32)), "the allreduce")
        aborted_by_interrupt(comm.barrier)
    else:
        late_peer_sees_interrupt(comm)


def scenario_interrupt_request(comm):
    # The same for a non-blocking allreduce, untimed or timed Request.wait()
    # (the progress thread runs the collective); the request then fails
    # with the abort.
    timed = os.environ.get("WORKER_TIMED") == "1"
    if comm.rank == 0:
        req = comm.allreduce(np.ones(10, dtype=np.float32), async_op=True)
        interrupted(lambda: req.wait(timeout=30.0) if timed else req.wait(), "Request.wait")
        aborted_by_interrupt(lambda: req.wait(timeout=10.0))
    else:
        late_peer_sees_interrupt(comm)


def scenario_gil(comm):
    # Rank 0's main thread sits in an allreduce that rank 1 joins only after
    # rank 0's *second* thread has met it in an allreduce on a side
    # communicator. That thread can only run if the first allreduce released
    # the GIL; if it did not, both ranks stall until the timeout and fail.
    side_id = comm.config["job_id"] + "-side"
    with shmring.Communicator(rank=comm.rank, size=comm.size, job_id=side_id,
                              timeout=comm.config["timeout_s"]) as side:
        token = np.ones(1, dtype=np.float32)
        if comm.rank == 0:
            errors = []

            def helper():
                try:
                    time.sleep(0.2)  # Let the main thread enter its allreduce first.
                    side.allreduce(np.ones(1, dtype=np.float32))
                except Exception as e:  # Reported by the main thread.
                    errors.append(e)

            thread = threading.Thread(target=helper)
            thread.start()
            comm.allreduce(token)
            thread.join()
            check(not errors, f"side allreduce failed: {errors}")
        else:
            side.allreduce(np.ones(1, dtype=np.float32))
            comm.allreduce(token)
        check(token[0] == comm.size, "allreduce result")


def main():
    scenario, rank, size, job_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    timeout = float(os.environ.get("WORKER_TIMEOUT", "60"))
    with shmring.Communicator(rank=rank, size=size, job_id=job_id, timeout=timeout) as comm:
        check((comm.rank, comm.size) == (rank, size), "rank and size")
        globals()["scenario_" + scenario](comm)


if __name__ == "__main__":
    main()
