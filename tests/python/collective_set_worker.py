"""One rank of an issue-14 collective test:
`collective_set_worker.py SCENARIO RANK SIZE JOB_ID`.

Started by test_collective_set.py, one process per rank; exits 0 when every
check held (a failed check raises: non-zero exit, reason on stderr).
"""

import sys

import numpy as np

import shmring


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def values(rank, count, dtype=np.int64):
    """Distinct per (rank, index)."""
    return (rank * 1_000_003 + np.arange(count, dtype=np.int64)).astype(dtype)


def pair_count(i, j):
    """Elements rank i sends to rank j in alltoallv: uneven, some zero."""
    return 0 if (i + j) % 3 == 1 else i * 3 + j + 1


def scenario_alltoall(comm):
    rank, size = comm.rank, comm.size
    for k in [0, 1, 5, 70_001]:
        for async_op in [False, True]:
            send = values(rank, size * k)
            out = np.full(size * k, -1, np.int64)
            r = comm.alltoall(send, out, async_op=async_op)
            if async_op:
                r.wait()
                r = r.result
            check(r is out, "returns out")
            for j in range(size):
                want = values(j, size * k)[rank * k:(rank + 1) * k]
                check(np.array_equal(out[j * k:(j + 1) * k], want), f"k={k} block {j}")


def scenario_alltoallv(comm):
    rank, size = comm.rank, comm.size
    sc = [pair_count(rank, j) for j in range(size)]
    rc = [pair_count(j, rank) for j in range(size)]
    send = values(rank, sum(sc), np.float32)
    for async_op in [False, True]:
        out = np.full(sum(rc) + 3, -1, np.float32)
        # Explicit displacements: blocks in reverse order, after 3 spare elements.
        rd, at = [0] * size, 3
        for j in reversed(range(size)):
            rd[j] = at
            at += rc[j]
        r = comm.alltoallv(send, sc, out, rc, recv_displs=rd, async_op=async_op)
        if async_op:
            r.wait()
        for j in range(size):
            off = sum(pair_count(j, q) for q in range(rank))
            want = values(j, off + rc[j], np.float32)[off:]
            check(np.array_equal(out[rd[j]:rd[j] + rc[j]], want), f"from {j}")
        check(np.all(out[:3] == -1), "spare elements untouched")


def scenario_gather_scatter(comm):
    rank, size = comm.rank, comm.size
    for root in range(size):
        for k in [0, 3, 50_000]:
            send = values(rank, k, np.int32)
            out = np.full(size * k, -1, np.int32) if rank == root else None
            r = comm.gather(send, out, root=root)
            if rank == root:
                check(r is out, "gather returns out at the root")
                for j in range(size):
                    check(np.array_equal(out[j * k:(j + 1) * k], values(j, k, np.int32)), "gather")
            else:
                check(r is None, "gather returns None elsewhere")
            full = values(root, size * k, np.int32) if rank == root else None
            mine = np.full(k, -1, np.int32)
            req = comm.scatter(full, mine, root=root, async_op=True)
            req.wait()
            check(np.array_equal(mine, values(root, size * k, np.int32)[rank * k:(rank + 1) * k]),
                  "scatter")


def scenario_allgatherv(comm):
    rank, size = comm.rank, comm.size
    rc = [0 if (size > 2 and j == size // 2) else 2 * j + 1 for j in range(size)]
    send = values(rank, rc[rank], np.float64)
    for async_op in [False, True]:
        out = np.full(sum(rc), -1.0)
        r = comm.allgatherv(send, out, rc, async_op=async_op)
        if async_op:
            r.wait()
        at = 0
        for j in range(size):
            check(np.array_equal(out[at:at + rc[j]], values(j, rc[j], np.float64)), f"from {j}")
            at += rc[j]
    # In place: send is this rank's block of out.
    out = np.full(sum(rc), -1.0)
    at = sum(rc[:rank])
    out[at:at + rc[rank]] = send
    comm.allgatherv(out[at:at + rc[rank]], out, rc)
    check(np.array_equal(out[:rc[0]], values(0, rc[0], np.float64)), "in place")
    # Counts computed with numpy (an array of np.int64, numpy scalars in a list).
    for counts in [np.array(rc), [np.int32(c) for c in rc]]:
        out = np.full(sum(rc), -1.0)
        comm.allgatherv(send, out, counts)
        check(np.array_equal(out[sum(rc[:size - 1]):], values(size - 1, rc[-1], np.float64)),
              "numpy counts")


def scenario_reduce_scatter_v(comm):
    rank, size = comm.rank, comm.size
    rc = [0 if (size > 2 and j == size // 2) else 3 * j + 2 for j in range(size)]
    total = sum(rc)
    send = (values(rank, total) % 1000).astype(np.float32)
    ref = sum((values(q, total) % 1000).astype(np.float32) for q in range(size))
    at = sum(rc[:rank])
    for async_op in [False, True]:
        out = np.full(rc[rank], -1, np.float32)
        r = comm.reduce_scatter_v(send, out, rc, async_op=async_op)
        if async_op:
            r.wait()
        check(np.array_equal(out, ref[at:at + rc[rank]]), "sum")
    # float16 max, in place.
    h = (values(rank, total) % 2000).astype(np.float16)
    comm.reduce_scatter_v(h, h[at:at + rc[rank]], rc, shmring.ReduceOp.MAX)
    want = np.max([(values(q, total) % 2000).astype(np.float16) for q in range(size)], axis=0)
    check(np.array_equal(h[at:at + rc[rank]], want[at:at + rc[rank]]), "float16 max in place")


def scenario_errors(comm):
    rank, size = comm.rank, comm.size
    a = np.zeros(size * 2, np.float32)
    # Argument errors raise here, before anything is published.
    for bad, needle in [(lambda: comm.allgatherv(a[:1], a, "ab"), "sequence"),
                        (lambda: comm.allgatherv(a[:1], a, [1] * (size + 1)), "entries"),
                        (lambda: comm.allgatherv(a[:1], a, [-1] * size), ">= 0"),
                        (lambda: comm.allgatherv(a[:1], a, [1.0] * size), "must be an integer"),
                        (lambda: comm.alltoallv(a, [2] * size, a, [2] * size,
                                                send_displs=[5] * size), "outside")]:
        try:
            bad()
            check(False, f"no error for {needle}")
        except shmring.InvalidArgumentError as e:
            check(needle in str(e) and f"rank {rank}" in str(e), str(e))
    # A mismatch fails every rank with the values.
    rc = [1] * size
    if rank == 0:
        rc[size - 1] = 2
    try:
        comm.reduce_scatter_v(np.zeros(sum(rc), np.float32), np.zeros(rc[rank], np.float32), rc)
        check(False, "no mismatch")
    except shmring.MismatchError as e:
        check(f"recv_counts[{size - 1}]=" in str(e), str(e))


def main():
    scenario, rank, size, job_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with shmring.Communicator(rank=rank, size=size, job_id=job_id) as comm:
        globals()["scenario_" + scenario](comm)


if __name__ == "__main__":
    main()
