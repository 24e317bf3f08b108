"""One rank of a single-copy round test (staged collectives reading the
writers' numpy arrays with process_vm_readv, blocks of 64-256 KiB at N=2):
`single_copy_worker.py SCENARIO RANK SIZE JOB_ID`. Exits 0 when every check
held."""

import gc
import sys
import time

import numpy as np

import shmring


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def values(rank, count, dtype, salt=0):
    """Distinct per (rank, index) as bytes: a mix of (rank, salt, index)."""
    i = np.arange(count * np.dtype(dtype).itemsize, dtype=np.uint64)
    x = (i * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64((rank << 56) | (salt << 40))
    x ^= x >> np.uint64(29)
    return x.astype(np.uint8).view(dtype)


def unaligned(a, skew):
    """A copy of `a` whose data starts `skew` bytes past an aligned address."""
    raw = np.empty(a.nbytes + 64, np.uint8)
    base = (-raw.ctypes.data) % 64 + skew
    out = raw[base:base + a.nbytes].view(a.dtype)
    out[...] = a
    return out


def scenario_sweep(comm):
    rank, size = comm.rank, comm.size
    salt = 0
    for dtype, nbytes, skew in [(np.int8, 65536, 1), (np.int8, 262145, 1), (np.float16, 65537, 2),
                                (np.float16, 131071, 0), (np.int32, 262144, 4),
                                (np.float64, 200000, 8)]:
        k = nbytes // np.dtype(dtype).itemsize
        k |= 1 if dtype == np.float16 else 0
        for async_op in [False, True]:
            salt += 1
            send = unaligned(values(rank, size * k, dtype, salt), skew)
            out = unaligned(np.zeros(size * k, dtype), skew)
            r = comm.alltoall(send, out, async_op=async_op)
            if async_op:
                r.wait()
            for j in range(size):
                want = values(j, size * k, dtype, salt)[rank * k:(rank + 1) * k]
                check(out[j * k:(j + 1) * k].tobytes() == want.tobytes(), f"alltoall {dtype} {k}")
            for root in range(size):
                send = unaligned(values(rank, k, dtype, salt), skew)
                out = unaligned(np.zeros(size * k, dtype), skew) if rank == root else None
                r = comm.gather(send, out, root=root, async_op=async_op)
                if async_op:
                    r.wait()
                if rank == root:
                    for j in range(size):
                        check(out[j * k:(j + 1) * k].tobytes() ==
                              values(j, k, dtype, salt).tobytes(), f"gather {dtype} {k}")
                full = unaligned(values(root, size * k, dtype, salt), skew) if rank == root else None
                mine = unaligned(np.zeros(k, dtype), skew)
                r = comm.scatter(full, mine, root=root, async_op=async_op)
                if async_op:
                    r.wait()
                check(mine.tobytes() == values(root, size * k, dtype, salt)[rank * k:(rank + 1) *
                                                                            k].tobytes(), "scatter")
            rc = [k if j % 2 == 0 else 3 for j in range(size)]
            send = unaligned(values(rank, rc[rank], dtype, salt), skew)
            out = unaligned(np.zeros(sum(rc), dtype), skew)
            r = comm.allgatherv(send, out, rc, async_op=async_op)
            if async_op:
                r.wait()
            at = 0
            for j in range(size):
                check(out[at:at + rc[j]].tobytes() == values(j, rc[j], dtype, salt).tobytes(),
                      "allgatherv")
                at += rc[j]


def scenario_temporaries(comm):
    """async_op with the only reference to the send array dropped at once:
    the binding must keep it alive until the readers took it."""
    rank, size = comm.rank, comm.size
    k = 100_000
    for it in range(10):
        root = it % size
        out = np.zeros(size * k, np.int8) if rank == root else None
        r = comm.gather(values(rank, k, np.int8, it), out, root=root, async_op=True)
        gc.collect()
        junk = [np.full(k, 0x77, np.int8) for _ in range(8)]  # reuse the freed memory
        if rank == root:
            time.sleep(0.05)  # the writers wait in their request meanwhile
        r.wait()
        del junk
        if rank == root:
            for j in range(size):
                check(out[j * k:(j + 1) * k].tobytes() == values(j, k, np.int8, it).tobytes(),
                      f"gather from {j}, iteration {it}")
        mine = np.zeros(k, np.int8)
        r = comm.alltoall(values(rank, size * k, np.int8, it + 100), np.zeros(size * k, np.int8),
                          async_op=True)
        gc.collect()
        junk = [np.full(k, 0x55, np.int8) for _ in range(8)]
        r.wait()
        del junk, mine
        comm.barrier()


def main():
    scenario, rank, size, job_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with shmring.Communicator(rank=rank, size=size, job_id=job_id) as comm:
        globals()["scenario_" + scenario](comm)


if __name__ == "__main__":
    main()
