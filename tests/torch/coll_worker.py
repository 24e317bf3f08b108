"""One rank of a torch.distributed test job for the staged collectives on the
shmring backend: all_to_all_single (even and uneven splits), all_to_all
(tensor lists), gather, scatter, all_gather with uneven sizes and
reduce_scatter with uneven sizes (tests/torch/test_collectives.py).

    coll_worker.py SCENARIO RANK SIZE INIT OUTDIR [BACKEND]

Same arguments and output as torch_worker.py, whose helpers it uses. Every
expected value is computed here from the inputs every rank would have: the
inputs are distinct per (rank, index), so a block from the wrong rank or at
the wrong offset fails.
"""

import sys

import torch
import torch.distributed as dist

import torch_worker as tw
from torch_worker import DTYPES, check, check_close, expect_error, values

# Moved as bytes: dtypes shmring cannot reduce.
BYTE_DTYPES = [torch.bool, torch.int16, torch.complex64]


def data(rank, n, dtype, salt=0):
    """n values distinct per (rank, salt, index) in any dtype (exact in
    bfloat16: small integers; bool alternates with rank and index)."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i * 7 + rank * 31 + salt * 13 + 3) % 199 - 99
    if dtype == torch.bool:
        return ((i + rank + salt) % 2).to(torch.bool)
    if dtype == torch.uint8:
        v = v + 99
    if dtype.is_complex:
        return torch.complex(v.float(), (v + 1).float()).to(dtype)
    return v.to(dtype)


def splits(src, dst, size, salt=0):
    """Rows rank src sends rank dst in the uneven tests: zeros included,
    (src, dst) different from (dst, src)."""
    return (src + 2 * dst + salt) % 4


# ---------------------------------------------------------------- scenarios

def scenario_alltoall(rank, size):
    """all_to_all_single, even and with split sizes; all_to_all of lists."""
    for dtype in DTYPES + BYTE_DTYPES:
        # Even: dim 0 split in `size` blocks of 3 rows of 2.
        rows = 3
        send = data(rank, size * rows * 2, dtype).reshape(size * rows, 2)
        out = torch.empty(size * rows, 2, dtype=dtype)
        dist.all_to_all_single(out, send)
        want = torch.cat([data(j, size * rows * 2, dtype).reshape(size * rows, 2)
                          [rank * rows:(rank + 1) * rows] for j in range(size)])
        check(torch.equal(out, want), f"all_to_all_single even {dtype}")
        # Uneven split sizes, rows of 3 elements.
        in_splits = [splits(rank, j, size) for j in range(size)]
        out_splits = [splits(j, rank, size) for j in range(size)]
        send = data(rank, sum(in_splits) * 3, dtype, salt=1).reshape(-1, 3)
        out = torch.empty(sum(out_splits), 3, dtype=dtype)
        dist.all_to_all_single(out, send, out_splits, in_splits)
        parts = []
        for j in range(size):
            theirs = [splits(j, k, size) for k in range(size)]
            full = data(j, sum(theirs) * 3, dtype, salt=1).reshape(-1, 3)
            start = sum(theirs[:rank])
            parts.append(full[start:start + theirs[rank]])
        check(torch.equal(out, torch.cat(parts)), f"all_to_all_single uneven {dtype}")
    # Split sizes given but equal: alltoallv with equal counts.
    send = data(rank, size * 4, torch.float32)
    out = torch.empty(size * 4)
    dist.all_to_all_single(out, send, [4] * size, [4] * size)
    want = torch.cat([data(j, size * 4, torch.float32)[rank * 4:(rank + 1) * 4]
                      for j in range(size)])
    check(torch.equal(out, want), "all_to_all_single with equal split sizes")
    # Empty split sizes mean equal ones: rank 0 gives none, the others give
    # them (equal), and every rank must make the same call.
    out = torch.empty(size * 4)
    if rank == 0:
        dist.all_to_all_single(out, send)
    else:
        dist.all_to_all_single(out, send, [4] * size, [4] * size)
    check(torch.equal(out, want), "all_to_all_single, empty splits beside equal ones")
    # Rank 0's blocks are all equal (2 rows each way), the others' are not:
    # rank 0 gives no split sizes, yet its call is uneven for the others.
    in_splits = [2 + rank * j % 3 for j in range(size)]
    out_splits = [2 + j * rank % 3 for j in range(size)]
    send = data(rank, sum(in_splits), torch.float32, salt=3)
    out = torch.empty(sum(out_splits))
    if rank == 0:
        dist.all_to_all_single(out, send)
    else:
        dist.all_to_all_single(out, send, out_splits, in_splits)
    parts = []
    for j in range(size):
        theirs = [2 + j * k % 3 for k in range(size)]
        start = sum(theirs[:rank])
        parts.append(data(j, sum(theirs), torch.float32, salt=3)[start:start + theirs[rank]])
    check(torch.equal(out, torch.cat(parts)), "all_to_all_single, even on rank 0 only")
    # Large and uneven: several slices per block.
    in_splits = [(1 << 16) * (1 + (rank + j) % 3) + j for j in range(size)]
    out_splits = [(1 << 16) * (1 + (j + rank) % 3) + rank for j in range(size)]
    send = data(rank, sum(in_splits), torch.float32, salt=2)
    out = torch.empty(sum(out_splits))
    dist.all_to_all_single(out, send, out_splits, in_splits)
    offset = 0
    for j in range(size):
        theirs = [(1 << 16) * (1 + (j + k) % 3) + k for k in range(size)]
        start = sum(theirs[:rank])
        piece = out[offset:offset + out_splits[j]]
        check(torch.equal(piece, data(j, sum(theirs), torch.float32, salt=2)
                          [start:start + theirs[rank]]), f"large all_to_all_single from {j}")
        offset += out_splits[j]
    # Non-contiguous input and output.
    base_in = data(rank, size * 2 * 4, torch.float64).reshape(size * 2, 4)
    strided_in = base_in[:, ::2]  # size*2 x 2, not contiguous
    base_out = torch.full((size * 2, 4), -1.0, dtype=torch.float64)
    strided_out = base_out[:, 1::2]
    dist.all_to_all_single(strided_out, strided_in)
    want = torch.cat([data(j, size * 2 * 4, torch.float64).reshape(size * 2, 4)[:, ::2]
                      [rank * 2:(rank + 1) * 2] for j in range(size)])
    check(torch.equal(strided_out, want), "all_to_all_single strided")
    check(torch.equal(base_out[:, ::2], torch.full((size * 2, 2), -1.0, dtype=torch.float64)),
          "all_to_all_single wrote outside the strided output")
    # Lists: tensor j to rank j, of shapes that differ per pair (zeros too).
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.int16):
        ins = [data(rank * size + j, splits(rank, j, size, 1) * 2, dtype).reshape(-1, 2)
               for j in range(size)]
        outs = [torch.empty(splits(j, rank, size, 1), 2, dtype=dtype) for j in range(size)]
        dist.all_to_all(outs, ins)
        for j in range(size):
            want = data(j * size + rank, splits(j, rank, size, 1) * 2, dtype).reshape(-1, 2)
            check(torch.equal(outs[j], want), f"all_to_all {dtype} from {j}")
    # Async, several in flight.
    sends = [data(rank, size * (k + 1), torch.float32, salt=k) for k in range(5)]
    outs = [torch.empty(size * (k + 1)) for k in range(5)]
    works = [dist.all_to_all_single(o, s, async_op=True) for o, s in zip(outs, sends)]
    for k, w in enumerate(works):
        w.wait()
        want = torch.cat([data(j, size * (k + 1), torch.float32, salt=k)[rank * (k + 1):
                                                                         (rank + 1) * (k + 1)]
                          for j in range(size)])
        check(torch.equal(outs[k], want), f"async all_to_all_single {k}")
    print("alltoall ok", flush=True)


def scenario_gather_scatter(rank, size):
    """gather and scatter from every root, every dtype, non-contiguous outputs."""
    for dtype in DTYPES + BYTE_DTYPES:
        for n in (0, 1, 37):
            for root in range(size):
                t = data(rank, n, dtype, salt=root)
                outs = [torch.empty(n, dtype=dtype) for _ in range(size)] if rank == root else None
                dist.gather(t, outs, dst=root)
                if rank == root:
                    for r in range(size):
                        check(torch.equal(outs[r], data(r, n, dtype, salt=root)),
                              f"gather {dtype} n={n} root {root} slot {r}")
                check(torch.equal(t, data(rank, n, dtype, salt=root)), "gather changed the input")
                ins = ([data(r + 10, n, dtype, salt=root) for r in range(size)]
                       if rank == root else None)
                out = torch.empty(n, dtype=dtype)
                dist.scatter(out, ins, src=root)
                check(torch.equal(out, data(rank + 10, n, dtype, salt=root)),
                      f"scatter {dtype} n={n} root {root}")
    # Non-contiguous: a gather into transposed tensors, a scatter into a strided view.
    root = size - 1
    outs = [torch.zeros(4, 2).t() for _ in range(size)] if rank == root else None
    dist.gather(data(rank, 8, torch.float32).reshape(2, 4), outs, dst=root)
    if rank == root:
        for r in range(size):
            check(torch.equal(outs[r], data(r, 8, torch.float32).reshape(2, 4)),
                  f"gather into transposed slot {r}")
    base = torch.full((6, 2), -1.0)
    view = base[:, 0]
    ins = [data(r, 6, torch.float32, salt=5) for r in range(size)] if rank == 0 else None
    dist.scatter(view, ins, src=0)
    check(torch.equal(view, data(rank, 6, torch.float32, salt=5)), "scatter into a strided view")
    check(torch.equal(base[:, 1], torch.full((6,), -1.0)), "scatter wrote outside the view")
    # Async.
    t = data(rank, 100, torch.float32)
    outs = [torch.empty(100) for _ in range(size)] if rank == 0 else None
    dist.gather(t, outs, dst=0, async_op=True).wait()
    if rank == 0:
        check(all(torch.equal(outs[r], data(r, 100, torch.float32)) for r in range(size)),
              "async gather")
    print("gather_scatter ok", flush=True)


def uneven_sizes(size):
    """Per-rank element counts of the uneven all_gather / reduce_scatter: a
    zero in the middle for N >= 3."""
    return [[5, 0, 9, 2][r % 4] + r for r in range(size)] if size > 2 else [3, 8][:size]


def scenario_uneven(rank, size):
    """all_gather with uneven output sizes (allgatherv) and reduce_scatter with
    uneven input sizes (reduce_scatter_v), against references."""
    counts = uneven_sizes(size)
    for dtype in DTYPES + BYTE_DTYPES:
        outs = [torch.empty(c, dtype=dtype) for c in counts]
        dist.all_gather(outs, data(rank, counts[rank], dtype))
        for r in range(size):
            check(torch.equal(outs[r], data(r, counts[r], dtype)), f"all_gather uneven {dtype} {r}")
    # Shapes differ too; outputs non-contiguous.
    outs = [torch.zeros(2, c, dtype=torch.float64).t() for c in counts]  # c x 2, transposed
    dist.all_gather(outs, data(rank, counts[rank] * 2, torch.float64).reshape(counts[rank], 2))
    for r in range(size):
        check(torch.equal(outs[r], data(r, counts[r] * 2, torch.float64).reshape(counts[r], 2)),
              f"all_gather uneven into transposed slot {r}")
    for dtype in DTYPES:
        ops = ["SUM", "MIN", "MAX", "PRODUCT"] + (["AVG"] if dtype in tw.FLOATS else [])
        for op in ops:
            ins = [values(rank * size + j, counts[j], op, dtype) for j in range(size)]
            out = torch.empty(counts[rank], dtype=dtype)
            dist.reduce_scatter(out, ins, op=getattr(dist.ReduceOp, op))
            stack = torch.stack([values(r * size + rank, counts[rank], op, dtype).to(torch.float64)
                                 for r in range(size)])
            want = {"SUM": lambda: stack.sum(0), "AVG": lambda: stack.sum(0) / size,
                    "PRODUCT": lambda: stack.prod(0), "MIN": lambda: stack.min(0).values,
                    "MAX": lambda: stack.max(0).values}[op]()
            check_close(out, want, f"reduce_scatter uneven {op} {dtype}", op)
    # Large: several slices.
    big = [(1 << 17) + 3 * r for r in range(size)]
    outs = [torch.empty(c) for c in big]
    dist.all_gather(outs, data(rank, big[rank], torch.float32))
    check(all(torch.equal(outs[r], data(r, big[r], torch.float32)) for r in range(size)),
          "large uneven all_gather")
    ins = [values(rank * size + j, big[j], "SUM", torch.float32) for j in range(size)]
    out = torch.empty(big[rank])
    work = dist.reduce_scatter(out, ins, async_op=True)
    work.wait()
    want = sum(values(r * size + rank, big[rank], "SUM", torch.float32).to(torch.float64)
               for r in range(size))
    check_close(out, want, "large uneven reduce_scatter (async)")
    print("uneven ok", flush=True)


def scenario_refusals(rank, size):
    """Bad arguments raise RuntimeError naming the problem on the calling
    rank; refused alike on every rank, the group stays usable."""
    t = torch.ones(size * 2)
    expect_error(lambda: dist.all_to_all_single(torch.empty(size * 2), t, [1] * size,
                                                [3] * size), "split sizes sum to")
    expect_error(lambda: dist.all_to_all_single(torch.empty(size * 2), t, [2] * size,
                                                [2] * (size + 1)), "group size")
    if size > 1:
        expect_error(lambda: dist.all_to_all_single(torch.empty(size * 2 + 1),
                                                    torch.ones(size * 2 + 1)), "multiple")
    expect_error(lambda: dist.all_to_all_single(torch.empty(size * 2), t.int()), "dtype")
    expect_error(lambda: dist.all_to_all([torch.empty(1)] * size,
                                         [torch.ones(1)] * (size + 1)), "group size")
    expect_error(lambda: dist.all_gather([torch.empty(3)] * rank + [torch.empty(2)]
                                         + [torch.empty(3)] * (size - rank - 1), torch.ones(3)),
                 "this rank's")
    # A result tensor whose elements share memory (expand()) cannot hold a
    # result: refused before anything moves, in shmring's words, not left
    # to fail in the copy back after the collective ran.
    shared = "has elements that share memory"
    expect_error(lambda: dist.all_reduce(torch.tensor([float(rank)]).expand(5)), "allreduce",
                 shared)
    expect_error(lambda: dist.all_gather([torch.zeros(1).expand(3)] * size, torch.ones(3)),
                 "allgather", shared)
    expect_error(lambda: dist.all_reduce_coalesced([torch.ones(2), torch.ones(1).expand(3)]),
                 "allreduce_coalesced", shared)
    # A broadcast's root only reads its tensor: an expanded one is valid there.
    root_in = torch.tensor([3.0]).expand(4) if rank == 0 else torch.zeros(4)
    dist.broadcast(root_in, src=0)
    check(torch.equal(root_in, torch.full((4,), 3.0)), f"broadcast from an expanded root {root_in}")
    # A refusal at the root only: the other ranks' matching call fails at
    # once naming the root, and that group is broken on every rank alike.
    root_only = [
        (lambda g: dist.gather(torch.ones(4), [torch.empty(4)] * (size + 1), dst=0, group=g),
         lambda g: dist.gather(torch.ones(4), None, dst=0, group=g), "group size"),
        (lambda g: dist.gather(torch.ones(4), [torch.empty(5)] * size, dst=0, group=g),
         lambda g: dist.gather(torch.ones(4), None, dst=0, group=g), "elements"),
        (lambda g: dist.scatter(torch.empty(4), [torch.ones(5)] * size, src=0, group=g),
         lambda g: dist.scatter(torch.empty(4), None, src=0, group=g), "elements"),
    ]
    for i, (bad, good, words) in enumerate(root_only):
        g = dist.new_group(list(range(size)))
        # A small gather's non-roots return before the root's check (as in
        # MPI): they fail at their next call on the group, here a barrier.
        gather = i < 2
        if rank == 0:
            expect_error(lambda: bad(g), words)
            if gather:
                try:
                    dist.barrier(group=g)
                except RuntimeError:
                    pass
        elif size > 1:
            expect_error(lambda: (good(g), dist.barrier(group=g) if gather else None),
                         "rank 0 made an invalid call")
        dist.destroy_process_group(g)
    x = values(rank, 10, "SUM", torch.float32)
    dist.all_reduce(x)
    check_close(x, tw.reference(size, 10, "SUM", torch.float32), "all_reduce after refusals")
    print("coll refusals ok", flush=True)


def scenario_mismatch(rank, size):
    """Ranks disagree on the split sizes of an all_to_all_single (rank 0
    expects 3 elements from rank 1, which sends 2): an error on every rank,
    not a hang or garbage."""
    in_splits = [2] * size
    out_splits = [2] * size
    if rank == 0:
        out_splits[1] = 3
    out = torch.empty(sum(out_splits))
    msg = expect_error(lambda: dist.all_to_all_single(out, torch.ones(sum(in_splits)), out_splits,
                                                      in_splits))
    print("mismatch error:", msg, flush=True)
    print("coll mismatch ok", flush=True)


def scenario_bytes_dtypes(rank, size):
    """dtypes shmring moves as bytes (bool, int16, complex): ranks that pass
    different ones of the same byte count get an error on every rank, and
    nothing moves, instead of reinterpreted bytes."""
    # Both move as bytes: compared before anything moves, refused on every
    # rank alike, and the group stays usable.
    if rank == 0:
        t = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex128)
    else:
        t = torch.zeros(4, dtype=torch.complex64)
    before = t.clone()
    expect_error(lambda: dist.broadcast(t, src=0), "broadcast",
                 "rank 0 passed a tensor of dtype torch.complex128 but rank 1 one of dtype "
                 "torch.complex64", "nothing was moved")
    check(torch.equal(t, before), f"broadcast refused, yet the tensor changed: {t}")
    mine = torch.tensor([1, 2], dtype=torch.int16) if rank == 0 else torch.ones(4, dtype=torch.bool)
    out = [torch.zeros_like(mine) for _ in range(size)]
    expect_error(lambda: dist.all_gather(out, mine), "allgather", "torch.int16", "torch.bool")
    check(all(torch.equal(o, torch.zeros_like(mine)) for o in out),
          f"all_gather refused, yet its outputs changed: {out}")
    # The same dtype everywhere still moves, and the group works after.
    flags = torch.tensor([rank == 0, rank == 1])
    dist.broadcast(flags, src=0)
    check(torch.equal(flags, torch.tensor([True, False])), f"bool broadcast {flags}")
    x = values(rank, 10, "SUM", torch.float32)
    dist.all_reduce(x)
    check_close(x, tw.reference(size, 10, "SUM", torch.float32), "all_reduce after the refusals")
    # One of shmring's dtypes against one moved as bytes (uint8 and bool):
    # the two ranks run different calls, a mismatch on every rank (the group
    # breaks, as for any mismatch), and the receiver's tensor is unchanged.
    if size > 1:
        g = dist.new_group(list(range(size)))
        if rank == 0:
            b = torch.tensor([True, False, True, True])
        else:
            b = torch.full((4,), 7, dtype=torch.uint8)
        before = b.clone()
        expect_error(lambda: dist.broadcast(b, src=0, group=g), "mismatch")
        check(torch.equal(b, before), f"mismatched broadcast changed the tensor: {b}")
        dist.destroy_process_group(g)
    print("coll bytes dtypes ok", flush=True)


def scenario_all(rank, size):
    scenario_alltoall(rank, size)
    scenario_gather_scatter(rank, size)
    scenario_uneven(rank, size)
    scenario_refusals(rank, size)


def main():
    scenario, rank, size, init_method, outdir = sys.argv[1:6]
    backend = sys.argv[6] if len(sys.argv) > 6 else "shmring"
    rank, size = int(rank), int(size)
    tw.init(backend, init_method, rank, size)
    globals()["scenario_" + scenario](rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
