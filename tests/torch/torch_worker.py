"""One rank of a torch.distributed test job (tests/torch).

    torch_worker.py SCENARIO RANK SIZE INIT OUTDIR [BACKEND]

INIT is a file:// URL (a FileStore the ranks share) or "env" (env://, rank
and size from RANK / WORLD_SIZE, as torchrun and shmrun set them). BACKEND is
shmring (default) or gloo. The worker prints "JOB_ID <id>" for each shmring
group it makes (the test checks /dev/shm for them afterwards) and exits 0
only when every check passed.
"""

import datetime
import gc
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import shmring.torch  # noqa: F401  registers "shmring"

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int8, torch.uint8, torch.int32, torch.int64]
FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def init(backend, init, rank, size):
    kw = dict(timeout=datetime.timedelta(seconds=60))
    if init == "env":
        dist.init_process_group(backend, init_method="env://", **kw)
    else:
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=size, **kw)
    report_job(dist.distributed_c10d._get_default_group())


def report_job(pg):
    job = getattr(pg, "job_id", None)
    if job:
        print("JOB_ID", job, flush=True)


def values(rank, n, op, dtype):
    """Distinct per (rank, index), small enough that every sum, product,
    min and max is exact in every dtype (bfloat16 included)."""
    i = torch.arange(n, dtype=torch.int64)
    if op == "PRODUCT":
        v = (rank + i) % 3 + 1  # 1..3: a product of 3 ranks <= 27
    elif op in ("MIN", "MAX"):
        v = (rank * 5 + i * 11) % 23 - 11
    else:
        v = (rank * 7 + i * 3) % 17 - 8
    if dtype == torch.uint8:
        v = v.abs()
    return v.to(dtype)


def reference(size, n, op, dtype):
    stack = torch.stack([values(r, n, op, dtype).to(torch.float64) for r in range(size)])
    if op == "SUM":
        out = stack.sum(0)
    elif op == "AVG":
        out = stack.sum(0) / size
    elif op == "PRODUCT":
        out = stack.prod(0)
    elif op == "MIN":
        out = stack.min(0).values
    else:
        out = stack.max(0).values
    return out


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_close(got, want, what, op="SUM"):
    got64 = got.to(torch.float64)
    if op == "AVG":
        # sum / size rounds once in the tensor's dtype.
        tol = {torch.float16: 1e-2, torch.bfloat16: 1e-1}.get(got.dtype, 1e-6)
        ok = torch.allclose(got64, want, rtol=0, atol=tol)
    else:
        ok = torch.equal(got64, want)
    if not ok:
        bad = (got64 - want).abs().argmax().item()
        raise AssertionError(f"{what}: element {bad} is {got64[bad].item()}, expected "
                             f"{want[bad].item()}")


def expect_error(fn, *needles):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        for n in needles:
            check(n in msg, f"error message lacks {n!r}: {msg}")
        return msg
    raise AssertionError(f"no RuntimeError (expected one naming {needles})")


# ---------------------------------------------------------------- scenarios

def scenario_ops(rank, size):
    """Every operation and dtype against a reference computed here."""
    for dtype in DTYPES:
        ops = ["SUM", "PRODUCT", "MIN", "MAX"] + (["AVG"] if dtype in FLOATS else [])
        for op in ops:
            for n in (0, 1, 5, 1000):
                t = values(rank, n, op, dtype)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                check_close(t, reference(size, n, op, dtype), f"all_reduce {op} {dtype} n={n}", op)
        n = 37
        # broadcast from each root
        for root in range(size):
            t = values(rank, n, "SUM", dtype)
            dist.broadcast(t, src=root)
            check(torch.equal(t, values(root, n, "SUM", dtype)), f"broadcast {dtype} root {root}")
        # all_gather into a list, and _all_gather_base into one tensor
        outs = [torch.empty(n, dtype=dtype) for _ in range(size)]
        dist.all_gather(outs, values(rank, n, "SUM", dtype))
        for r in range(size):
            check(torch.equal(outs[r], values(r, n, "SUM", dtype)), f"all_gather {dtype} slot {r}")
        flat = torch.empty(size * n, dtype=dtype)
        dist._all_gather_base(flat, values(rank, n, "SUM", dtype))
        want = torch.cat([values(r, n, "SUM", dtype) for r in range(size)])
        check(torch.equal(flat, want), f"_all_gather_base {dtype}")
        # reduce_scatter (list) and _reduce_scatter_base (flat): rank r gets
        # the sum of slot r; each rank's slot values are distinct per index.
        full = [values(rank * size + j, n, "SUM", dtype) for j in range(size)]
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter(out, full, op=dist.ReduceOp.SUM)
        want = sum(values(r * size + rank, n, "SUM", dtype).to(torch.float64) for r in range(size))
        check_close(out, want, f"reduce_scatter {dtype}")
        out2 = torch.empty(n, dtype=dtype)
        dist._reduce_scatter_base(out2, torch.cat(full), op=dist.ReduceOp.SUM)
        check_close(out2, want, f"_reduce_scatter_base {dtype}")
        # reduce to each root: only the root's tensor changes
        for root in range(size):
            t = values(rank, n, "MAX", dtype)
            dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
            if rank == root:
                check_close(t, reference(size, n, "MAX", dtype), f"reduce {dtype} root {root}")
            else:
                check(torch.equal(t, values(rank, n, "MAX", dtype)), f"reduce changed rank {rank}")
    # allreduce_coalesced: several tensors (one dtype), one collective
    ts = [values(rank, k, "SUM", torch.float32).reshape(-1) for k in (3, 0, 17)]
    ts[2] = ts[2].reshape(1, 17)
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.SUM)
    for k, t in zip((3, 0, 17), ts):
        check_close(t.reshape(-1), reference(size, k, "SUM", torch.float32),
                    f"all_reduce_coalesced n={k}")
    # broadcast and all_gather move any dtype as bytes (bool, int16, complex)
    for dtype in (torch.bool, torch.int16, torch.complex64):
        t = (torch.arange(11) * (rank + 1) % 2).to(dtype) if dtype == torch.bool else \
            (torch.arange(11) + 100 * rank).to(dtype)
        root_val = t.clone() if rank == size - 1 else None
        dist.broadcast(t, src=size - 1)
        if rank == size - 1:
            check(torch.equal(t, root_val), f"broadcast {dtype} changed the root")
        outs = [torch.empty(11, dtype=dtype) for _ in range(size)]
        dist.all_gather(outs, t)
        check(all(torch.equal(o, t) for o in outs), f"all_gather {dtype}")
    # The object collectives ride on all_gather and broadcast of uint8/int64.
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "pad": "x" * rank * 10})
    check(objs == [{"rank": r, "pad": "x" * r * 10} for r in range(size)], f"objects: {objs}")
    lst = [f"from {rank}", rank] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    check(lst == ["from 1", 1], f"broadcast_object_list: {lst}")
    dist.barrier()
    print("ops ok", flush=True)


def scenario_layout(rank, size):
    """Non-contiguous tensors are staged: results land in the caller's view,
    and memory outside the view is untouched."""
    base = torch.full((6, 8), -1.0)
    view = base[:, ::2]  # 6 x 4, stride 2: not contiguous
    view.copy_(values(rank, 24, "SUM", torch.float32).reshape(6, 4))
    dist.all_reduce(view)
    check_close(view.reshape(-1), reference(size, 24, "SUM", torch.float32), "strided all_reduce")
    check(torch.equal(base[:, 1::2], torch.full((6, 4), -1.0)), "all_reduce wrote outside the view")
    t = values(rank, 12, "SUM", torch.float64).reshape(3, 4).t()  # transposed
    dist.broadcast(t, src=0)
    check(torch.equal(t, values(0, 12, "SUM", torch.float64).reshape(3, 4).t()), "transposed bcast")
    outs = [torch.zeros(4, 2).t() for _ in range(size)]  # non-contiguous outputs
    dist.all_gather(outs, values(rank, 8, "SUM", torch.float32).reshape(2, 4))
    for r in range(size):
        check(torch.equal(outs[r], values(r, 8, "SUM", torch.float32).reshape(2, 4)),
              f"all_gather into transposed slot {r}")
    out = torch.zeros(size * 5, 2)[:, 0]  # strided output
    dist._all_gather_base(out, values(rank, 5, "SUM", torch.float32))
    want = torch.cat([values(r, 5, "SUM", torch.float32) for r in range(size)])
    check(torch.equal(out, want), "_all_gather_base into a strided output")
    red = torch.zeros(5, 3)[:, 1]
    dist._reduce_scatter_base(red, torch.cat([values(rank * size + j, 5, "SUM", torch.float32)
                                              for j in range(size)]))
    want = sum(values(r * size + rank, 5, "SUM", torch.float32).to(torch.float64)
               for r in range(size))
    check_close(red, want, "_reduce_scatter_base into a strided output")
    print("layout ok", flush=True)


def scenario_async(rank, size):
    """Work and future: wait, is_completed, result; a future callback that
    issues a collective and waits on its future (as PowerSGD's hook does)."""
    t = values(rank, 1000, "SUM", torch.float32)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    check(work.is_completed(), "is_completed after wait")
    check_close(t, reference(size, 1000, "SUM", torch.float32), "async all_reduce")
    second = values(rank, 64, "MAX", torch.float32)

    def chained(fut):
        first = fut.value()[0]
        inner = dist.all_reduce(second, op=dist.ReduceOp.MAX, async_op=True)
        return inner.get_future().wait()[0] + first.sum()

    t2 = values(rank, 1000, "SUM", torch.float32)
    fut = dist.all_reduce(t2, async_op=True).get_future().then(chained)
    got = fut.wait()
    want = reference(size, 64, "MAX", torch.float32) + reference(size, 1000, "SUM",
                                                                 torch.float32).sum()
    check_close(got, want, "collective issued from a future callback")
    # Many in flight at once, completed in order.
    ts = [values(rank + k, 100 + k, "SUM", torch.float32) for k in range(20)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    futs = [w.get_future() for w in works]
    for k, f in enumerate(futs):
        vals = f.wait()
        check(len(vals) == 1 and vals[0] is not None, "future value is the tensor list")
        want = sum(values(r + k, 100 + k, "SUM", torch.float32).to(torch.float64)
                   for r in range(size))
        check_close(ts[k], want, f"in-flight all_reduce {k}")
    dist.barrier(async_op=True).wait()
    print("async ok", flush=True)


def scenario_refusals(rank, size):
    """What the backend refuses raises RuntimeError naming it, and the group
    stays usable (the refusal happens before anything reaches shmring)."""
    t = torch.ones(4)
    for op in ("BAND", "BOR", "BXOR"):
        expect_error(lambda: dist.all_reduce(t.int(), op=getattr(dist.ReduceOp, op)), op)
    if hasattr(dist, "_make_nccl_premul_sum"):
        expect_error(lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)), "PREMUL_SUM")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), "int16", "allreduce")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)), "allreduce")
    pg = dist.distributed_c10d._get_default_group()
    expect_error(lambda: pg.allreduce([torch.ones(2), torch.ones(2)]), "exactly one")
    expect_error(lambda: dist.all_reduce(torch.ones(2).to_sparse()), "allreduce")
    expect_error(lambda: dist.recv(t), "recvAnysource")
    expect_error(lambda: dist.all_gather([torch.empty(4)], t), "group size")
    expect_error(lambda: dist.broadcast(t, src=size), "root")
    # Still usable after all that.
    x = values(rank, 10, "SUM", torch.float32)
    dist.all_reduce(x)
    check_close(x, reference(size, 10, "SUM", torch.float32), "all_reduce after refusals")
    print("refusals ok", flush=True)


def scenario_p2p(rank, size):
    """send/recv: a batch_isend_irecv ring (isend to the right and irecv from
    the left, in that order on every rank, then both ways), blocking
    dist.send/recv, isend/irecv around a collective, a dtype moved as bytes,
    a non-contiguous recv tensor. Values distinct per (sender, receiver, tag)."""
    right, left = (rank + 1) % size, (rank - 1) % size

    def msg(src, dst, tag, n, dtype=torch.float32):
        i = torch.arange(n, dtype=torch.int64)
        return (src * 1000 + dst * 100 + tag * 10 + i % 7).to(dtype)

    for n in (1, 1000, 300_000):
        out = msg(rank, right, 0, n)
        inb = torch.zeros(n)
        ops = [dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, inb, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(torch.equal(inb, msg(left, rank, 0, n)), f"batch ring n={n}")
        # Both neighbours at once.
        to_l, from_r = msg(rank, left, 1, n), torch.zeros(n)
        ops = [dist.P2POp(dist.isend, out, right), dist.P2POp(dist.isend, to_l, left),
               dist.P2POp(dist.irecv, inb, left), dist.P2POp(dist.irecv, from_r, right)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(torch.equal(inb, msg(left, rank, 0, n)) and torch.equal(from_r, msg(right, rank, 1, n)),
              f"batch both ways n={n}")
    # Blocking send/recv along the ring: rank 0 starts, the others pass it on.
    t = torch.zeros(50, dtype=torch.int64)
    if rank == 0:
        dist.send(msg(0, 1, 2, 50, torch.int64), dst=1, tag=2)
        dist.recv(t, src=left, tag=2)
        check(torch.equal(t, msg(left, 0, 2, 50, torch.int64)), "blocking ring back at 0")
    else:
        dist.recv(t, src=left, tag=2)
        check(torch.equal(t, msg(left, rank, 2, 50, torch.int64)), "blocking ring")
        dist.send(msg(rank, right, 2, 50, torch.int64), dst=right, tag=2)
    # isend/irecv posted around an all_reduce, waited after it.
    a = dist.isend(msg(rank, right, 3, 4096), right, tag=3)
    x = torch.ones(8)
    dist.all_reduce(x)
    b = dist.irecv(inb[:4096], left, tag=3)
    a.wait()
    b.wait()
    check(torch.equal(inb[:4096], msg(left, rank, 3, 4096)) and torch.equal(x, torch.full((8,), float(size))),
          "around all_reduce")
    # int16 (no shmring dtype: moved as bytes) into a non-contiguous tensor.
    dst = torch.zeros(20, 2, dtype=torch.int16)[:, 0]
    w = dist.isend(msg(rank, right, 4, 20, torch.int16), right, tag=4)
    dist.recv(dst, src=left, tag=4)
    w.wait()
    check(torch.equal(dst, msg(left, rank, 4, 20, torch.int16)), "int16 non-contiguous")
    print("p2p ok", flush=True)


def strided(n, fill=0.0, dtype=torch.float32):
    """A fresh 1-D tensor of n elements with stride 2 (column 0 of an n x 2
    tensor whose column 1 holds -7: the check that nothing outside the view
    was written)."""
    base = torch.full((n, 2), -7.0, dtype=dtype)
    base[:, 0] = fill
    return base[:, 0]


def untouched(view):
    """Column 1 of the strided() base behind `view` still holds -7 (any
    other tensor: True)."""
    if view.dim() != 1 or view.stride() != (2,):
        return True
    base = view.as_strided((view.numel(), 2), (2, 1))
    return torch.equal(base[:, 1], torch.full((view.numel(),), -7.0, dtype=view.dtype))


def check_layout_op(rank, size, what, op):
    """`op(async_op)` issues one operation on fresh non-contiguous tensors and
    returns (work, outputs, wants): the caller's tensors the result lands in
    and their expected values (and, as a 4th item, what the future's value
    holds when that is not `outputs`). Checked blocking, then through the Work's
    future: a callback chained with then() must see the result already in the
    caller's tensors (the future completes after the copy back), and the
    future's value is those tensors. Each rank in turn issues late, so the
    other rank's callback is chained before its operation completes."""
    _, outs, wants, *_ = op(False)
    for o, w in zip(outs, wants):
        check(torch.equal(o, w), f"{what} (blocking): got {o.tolist()}, expected {w.tolist()}")
        check(untouched(o), f"{what} (blocking) wrote outside the view")
    for late in range(size):
        if rank == late:
            time.sleep(0.05)
        work, outs, wants, *results = op(True)
        results = results[0] if results else outs
        # all_reduce_coalesced(async_op=True) gives the future itself.
        fut = work.get_future() if hasattr(work, "get_future") else work
        seen = fut.then(lambda f: [o.clone() for o in outs]).wait()
        for s, o, w in zip(seen, outs, wants):
            check(torch.equal(s, w), f"{what} (future, rank {late} late): a then() callback saw "
                  f"{s.tolist()}, expected {w.tolist()}")
            check(torch.equal(o, w), f"{what} (future, rank {late} late): got {o.tolist()}")
            check(untouched(o), f"{what} (future) wrote outside the view")
        value = fut.value()
        check(len(value) == len(results) and all(v.data_ptr() == o.data_ptr()
                                                  and v.stride() == o.stride()
                                                  for v, o in zip(value, results)),
              f"{what}: the future's value is not the caller's tensors")


def scenario_noncontig(rank, size):
    """Every operation on non-contiguous (strided, transposed) inputs and
    outputs, blocking and through futures; values distinct per (rank,
    index)."""
    total = size * (size + 1) / 2

    def all_reduce(async_op):
        view = strided(8, rank + 1.0)
        return dist.all_reduce(view, async_op=async_op), [view], [torch.full((8,), total)]

    def all_reduce_coalesced(async_op):
        a = strided(5, rank + 1.0)
        b = (torch.arange(12.0).reshape(3, 4) + rank).t()
        work = dist.all_reduce_coalesced([a, b], async_op=async_op)
        want_b = sum((torch.arange(12.0).reshape(3, 4) + r).t() for r in range(size))
        return work, [a, b], [torch.full((5,), total), want_b]

    def broadcast(root):
        def run(async_op):
            t = (torch.arange(12.0).reshape(3, 4) + 100 * rank).t()
            work = dist.broadcast(t, src=root, async_op=async_op)
            return work, [t], [(torch.arange(12.0).reshape(3, 4) + 100 * root).t()]
        return run

    def reduce(root):
        def run(async_op):
            base = torch.arange(12.0).reshape(3, 4).t()
            t = base + rank  # transposed: not contiguous
            work = dist.reduce(t, dst=root, async_op=async_op)
            # Only the root's tensor changes (to the sum); the others keep theirs.
            want = sum(base + r for r in range(size)) if rank == root else base + rank
            return work, [t], [want]
        return run

    def send_value(r, n):
        return torch.arange(n, dtype=torch.float32) + 100 * r

    def all_gather(async_op):
        x = strided(4)
        x.copy_(send_value(rank, 4))
        outs = [strided(4) for _ in range(size)]
        work = dist.all_gather(outs, x, async_op=async_op)
        return work, outs, [send_value(r, 4) for r in range(size)]

    def all_gather_base(async_op):
        x = strided(3)
        x.copy_(send_value(rank, 3))
        out = strided(3 * size)
        work = dist._all_gather_base(out, x, async_op=async_op)
        return work, [out], [torch.cat([send_value(r, 3) for r in range(size)])]

    def block(r, j, n):  # rank r's input block for rank j
        return torch.arange(n, dtype=torch.float32) + 100 * r + 10 * j

    def reduce_scatter(async_op):
        ins = [strided(4) for _ in range(size)]
        for j, t in enumerate(ins):
            t.copy_(block(rank, j, 4))
        out = strided(4)
        work = dist.reduce_scatter(out, ins, async_op=async_op)
        return work, [out], [sum(block(r, rank, 4) for r in range(size))]

    def reduce_scatter_base(async_op):
        x = strided(3 * size)
        x.copy_(torch.cat([block(rank, j, 3) for j in range(size)]))
        out = strided(3)
        work = dist._reduce_scatter_base(out, x, async_op=async_op)
        return work, [out], [sum(block(r, rank, 3) for r in range(size))]

    def all_to_all_single(async_op):
        x = strided(2 * size)
        x.copy_(torch.cat([block(rank, j, 2) for j in range(size)]))
        out = strided(2 * size)
        work = dist.all_to_all_single(out, x, async_op=async_op)
        return work, [out], [torch.cat([block(r, rank, 2) for r in range(size)])]

    def all_to_all(async_op):
        ins = [block(rank, j, 6).reshape(2, 3).t() for j in range(size)]
        outs = [torch.zeros(2, 3).t() for _ in range(size)]
        work = dist.all_to_all(outs, ins, async_op=async_op)
        return work, outs, [block(r, rank, 6).reshape(2, 3).t() for r in range(size)]

    def gather(root):
        def run(async_op):
            x = strided(4)
            x.copy_(send_value(rank, 4))
            outs = [strided(4) for _ in range(size)] if rank == root else None
            work = dist.gather(x, outs, dst=root, async_op=async_op)
            # The input is left as it was everywhere; a non-root's future
            # holds no tensor.
            if rank != root:
                return work, [x], [send_value(rank, 4)], []
            return work, outs, [send_value(r, 4) for r in range(size)]
        return run

    def scatter(root):
        def run(async_op):
            ins = None
            if rank == root:
                ins = [strided(4) for _ in range(size)]
                for j, t in enumerate(ins):
                    t.copy_(block(root, j, 4))
            out = strided(4)
            work = dist.scatter(out, ins, src=root, async_op=async_op)
            return work, [out], [block(root, rank, 4)]
        return run

    check_layout_op(rank, size, "all_reduce", all_reduce)
    check_layout_op(rank, size, "all_reduce_coalesced", all_reduce_coalesced)
    for root in range(size):
        check_layout_op(rank, size, f"broadcast root {root}", broadcast(root))
        check_layout_op(rank, size, f"reduce root {root}", reduce(root))
        check_layout_op(rank, size, f"gather root {root}", gather(root))
        check_layout_op(rank, size, f"scatter root {root}", scatter(root))
    check_layout_op(rank, size, "all_gather", all_gather)
    check_layout_op(rank, size, "_all_gather_base", all_gather_base)
    check_layout_op(rank, size, "reduce_scatter", reduce_scatter)
    check_layout_op(rank, size, "_reduce_scatter_base", reduce_scatter_base)
    check_layout_op(rank, size, "all_to_all_single", all_to_all_single)
    check_layout_op(rank, size, "all_to_all", all_to_all)

    # Point-to-point around the ring: a strided send, a transposed recv.
    right, left = (rank + 1) % size, (rank - 1) % size

    def send_recv(async_op):
        x = strided(6)
        x.copy_(block(rank, right, 6))
        out = torch.zeros(2, 3).t()
        if not async_op:
            if rank % 2 == 0:
                dist.send(x, right)
                dist.recv(out, src=left)
            else:
                dist.recv(out, src=left)
                dist.send(x, right)
            return None, [out], [block(left, rank, 6).reshape(3, 2)]
        sent = dist.isend(x, right)
        work = dist.irecv(out, src=left)
        sent.wait()
        return work, [out], [block(left, rank, 6).reshape(3, 2)]

    check_layout_op(rank, size, "send/recv", send_recv)
    noncontig_ddp(rank, size)
    print("noncontig ok", flush=True)


def strided_hook(state, bucket):
    """A DDP comm hook whose allreduce runs on a non-contiguous copy of the
    bucket: the future's value must hold the reduced gradients."""
    world = dist.get_world_size()
    buffer = bucket.buffer()
    staging = strided(buffer.numel())
    staging.copy_(buffer)
    fut = dist.all_reduce(staging, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] / world)


def noncontig_ddp(rank, size):
    """DDP with strided_hook trains as DDP without a hook."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    params = []
    for hook in (None, strided_hook):
        torch.manual_seed(100 + rank)
        model = DDP(nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3)))
        if hook is not None:
            model.register_comm_hook(None, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1000 * rank + 7)
        for _ in range(3):
            x = torch.randn(8, 10, generator=gen)
            y = torch.randint(0, 3, (8,), generator=gen)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    for i, (a, b) in enumerate(zip(*params)):
        diff = (a - b).abs().max().item()
        check(diff <= 1e-6, f"DDP with a strided comm hook: parameter {i} differs by {diff}")


def scenario_ops_all(rank, size):
    scenario_ops(rank, size)
    scenario_layout(rank, size)
    scenario_async(rank, size)
    scenario_refusals(rank, size)


def scenario_mismatch(rank, size):
    """Ranks disagree on the count: shmring's mismatch error on every rank,
    then the group refuses later operations."""
    t = torch.ones(10 + rank)
    msg = expect_error(lambda: dist.all_reduce(t))
    print("first error:", msg, flush=True)
    msg2 = expect_error(lambda: dist.all_reduce(torch.ones(4)))
    check("unusable" in msg2 or "abort" in msg2.lower() or "mismatch" in msg2.lower(),
          f"later operation: {msg2}")
    print("mismatch ok", flush=True)


def scenario_leaving(rank, size, init_method, barrier=False):
    """Rank 0 destroys the group while rank 1 still calls all_reduce: rank
    1's error says that rank 0 is leaving (its finalize), not that it
    called a barrier rank 1's code never made. With `barrier`, rank 1 calls
    dist.barrier() instead: it fails the same way, rather than returning
    before a later call finds rank 0 gone."""
    init("shmring", init_method, rank, size)
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        dist.destroy_process_group()
    else:
        call = dist.barrier if barrier else lambda: dist.all_reduce(torch.ones(8))
        msg = expect_error(call, "finalize() [the rank is leaving")
        check(barrier or "barrier()" not in msg, msg)
        dist.destroy_process_group()
    print("leaving ok", flush=True)


def scenario_timeouts(rank, size):
    """Work.wait(timeout) gives up without breaking the group; a peer that
    never comes gives shmring's timeout error (SHMRING_TIMEOUT=3) on every
    rank."""
    t = torch.ones(100)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        expect_error(lambda: work.wait(timeout=datetime.timedelta(milliseconds=200)),
                     "did not complete within")
        work.wait()  # rank 1 arrives after 1.5 s
        check(torch.equal(t, torch.full((100,), 2.0)), "all_reduce after a wait timeout")
        t0 = time.monotonic()
        msg = expect_error(lambda: dist.all_reduce(t), "timed out")
        check(time.monotonic() - t0 < 30, "timeout took too long")
        print("rank 0 timed out:", msg, flush=True)
    else:
        time.sleep(1.5)
        dist.all_reduce(t)
        time.sleep(6)  # rank 0 waits for us past SHMRING_TIMEOUT
        msg = expect_error(lambda: dist.all_reduce(t))
        print("rank 1 refused:", msg, flush=True)
    expect_error(lambda: dist.all_reduce(torch.ones(3)))
    print("timeouts ok", flush=True)


def scenario_interrupt(rank, size):
    """Ctrl-C while rank 0's blocking all_reduce (Work.wait, GIL released by
    torch) waits for a late peer: the handler runs within a wait-check
    period, not at the timeout (60 s here), the job is aborted, and the
    error names the interrupt on both ranks."""
    t = torch.ones(100)
    if rank == 0:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        msg = expect_error(lambda: dist.all_reduce(t),
                           "aborted the job: interrupted by a signal (KeyboardInterrupt)")
        took = time.monotonic() - t0
        check(took < 3.0, f"the interrupt ended the wait {took:.2f} s in (signal at 0.5 s)")
    else:
        time.sleep(4)
        expect_error(lambda: dist.all_reduce(t),
                     "rank 0: aborted the job: interrupted by a signal (KeyboardInterrupt)")
    print("interrupt ok", flush=True)


def scenario_p2p_ended_early(rank, size):
    """A dist.isend whose Work is dropped while pending (SHMRING_TIMEOUT=1):
    the send times out on the progress thread, rank 0 then reuses the tensor
    (7.0) and stays alive; rank 1's late recv raises instead of returning
    the reused values, and the group refuses later operations."""
    n = 1 << 18  # 1 MiB of float32: single copy, or staged (SHMRING_CMA=0)
    if rank == 0:
        t = torch.full((n,), 42.0)
        w = dist.isend(t, 1, tag=9)
        del w
        gc.collect()
        time.sleep(1.5)  # past SHMRING_TIMEOUT: the send has failed
        t.fill_(7.0)
        time.sleep(2.5)  # alive while rank 1 receives
    else:
        time.sleep(2.5)
        t = torch.full((n,), -1.0)
        t0 = time.monotonic()
        msg = expect_error(lambda: dist.recv(t, 0, tag=9), "rank 0", "send(")
        check(not bool((t == 7.0).any()), "the reused tensor's 7.0 arrived")
        check(time.monotonic() - t0 < 10, "the recv took 10 s or more to fail")
        print("rank 1 refused:", msg, flush=True)
    expect_error(lambda: dist.send(torch.ones(3), 1 - rank, tag=1), "unusable")
    print("p2p_ended_early ok", flush=True)


def scenario_p2p_dropped_irecv(rank, size):
    """A dist.irecv whose Work is dropped while pending (SHMRING_TIMEOUT=1):
    the recv times out on the progress thread and breaks the group, so rank
    0's later dist.send raises at once, naming rank 1's recv, instead of
    waiting for a recv that is gone; nothing lands in the dropped tensor."""
    n = 1 << 18
    if rank == 1:
        t = torch.full((n,), -1.0)
        w = dist.irecv(t, 0, tag=9)
        del w
        gc.collect()
        time.sleep(3.0)  # rank 0 sends meanwhile
        check(bool((t == -1.0).all()), "the dropped irecv's tensor was written")
    else:
        time.sleep(1.8)  # past rank 1's SHMRING_TIMEOUT
        t0 = time.monotonic()
        msg = expect_error(lambda: dist.send(torch.full((n,), 42.0), 1, tag=9),
                           "rank 1: timed out", "recv(count=262144, float32)")
        check(time.monotonic() - t0 < 0.5,
              f"the send took {time.monotonic() - t0:.2f} s to fail")
        print("rank 0 refused:", msg, flush=True)
    expect_error(lambda: dist.recv(torch.ones(3), 1 - rank, tag=1))
    print("p2p_dropped_irecv ok", flush=True)


def scenario_peer_death(rank, size):
    """Rank 1 is SIGKILLed mid-training; the others get RuntimeError with
    shmring's message (naming rank 1) quickly, and later operations fail."""
    t = torch.ones(1 << 16)
    for step in range(3):
        dist.all_reduce(t)
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    msg = None
    try:
        for _ in range(1000):
            dist.all_reduce(t)
    except RuntimeError as e:
        msg = str(e)
    elapsed = time.monotonic() - t0
    check(msg is not None, "no error after the peer died")
    print(f"error after {elapsed:.2f} s: {msg}", flush=True)
    check("rank 1" in msg and "died" in msg, f"message does not name the dead rank: {msg}")
    check(elapsed < 30, f"error took {elapsed:.1f} s")
    expect_error(lambda: dist.all_reduce(torch.ones(3)))
    print("peer_death ok", flush=True)
    # The dead peer's group cannot be torn down collectively: leave at once.
    sys.stdout.flush()
    os._exit(0)


def scenario_new_group(rank, size):
    """Subgroups are communicators of their own, with their own job ids."""
    world = dist.distributed_c10d._get_default_group()
    even = dist.new_group([0, 2])
    tail = dist.new_group([1, 2])
    if rank in (0, 2):
        report_job(even)
        check(even.size() == 2 and even.job_id != world.job_id, "even group")
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=even)
        check(torch.equal(t, torch.full((5,), 4.0)), f"even group all_reduce: {t}")
    if rank in (1, 2):
        report_job(tail)
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=tail)
        check(torch.equal(t, torch.full((5,), 5.0)), f"tail group all_reduce: {t}")
        t = torch.arange(3.0) + rank
        dist.broadcast(t, src=2, group=tail)  # global rank 2 = group rank 1
        check(torch.equal(t, torch.arange(3.0) + 2), "tail group broadcast")
    # A group destroyed with a collective still in flight completes it first.
    if rank in (0, 2):
        pending = torch.ones(1 << 16)
        work = dist.all_reduce(pending, group=even, async_op=True)
        dist.destroy_process_group(even)
        work.wait()
        check(torch.equal(pending, torch.full((1 << 16,), 2.0)), "in flight at destroy")
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((5,), 6.0)), "world all_reduce after the groups")
    print("new_group ok", flush=True)


def thread_names():
    """The names of this process's threads, sorted."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass  # ended meanwhile
    return sorted(names)


def shmring_threads():
    """Names of this process's threads that belong to shmring (the progress
    and point-to-point threads name themselves), and how many threads it
    has in all."""
    names = thread_names()
    return [n for n in names if n.startswith("shmring")], len(names)


def shm_mappings():
    """This process's mappings of files in /dev/shm (address range and
    name). A segment shows under its name ("...<job id> (deleted)") on the
    ranks that opened it, but as "/dev/shm/#<inode> (deleted)" on the rank
    that created it unnamed (O_TMPFILE): compare with the set taken before
    the group, not by job id."""
    with open("/proc/self/maps") as f:
        fields = (line.split(maxsplit=5) for line in f)
        return {(x[0], x[5].strip()) for x in fields
                if len(x) == 6 and x[5].startswith("/dev/shm/")}


def left_over(before, settle_s=2.0):
    """The /dev/shm mappings and shmring threads that were not there at
    `before` (a (shm_mappings(), shmring_threads()) pair). A thread that was
    just joined may still be listed in /proc/self/task for a moment (the
    kernel wakes the joiner before it reaps the thread), so the threads get
    up to settle_s to match before they count as left over."""
    deadline = time.monotonic() + settle_s
    while True:
        maps, threads = shm_mappings() - before[0], shmring_threads()
        if threads == before[1] or time.monotonic() > deadline:
            return sorted(maps), (threads if threads != before[1] else None)
        time.sleep(0.01)


def scenario_reinit(rank, size, backend, init_method, rounds=6):
    """init_process_group, all_reduce, destroy_process_group, six times, with
    the garbage collector off, every round's groups (the default one and a
    new_group) still referenced (as a DDP model would) and an all_reduce of
    each still pending at destroy: every round works, the pending ones
    complete, and destroy releases each group's segment and threads at once;
    the old groups then refuse operations. First six bare rounds, nothing
    between destroy and the next init: a rank that left destroy while rank 0
    still served the old env:// store would reach it in its next rendezvous
    and lose it (Connection reset by peer)."""
    gc.disable()
    for i in range(rounds):
        init(backend, init_method, rank, size)
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        check(torch.equal(t, torch.full((4,), size * (size + 1) / 2)), f"bare round {i}: {t}")
        dist.destroy_process_group()
    kept = []
    members = list(range(size - 1, -1, -2))  # a subgroup: every other rank, from the last
    for i in range(rounds):
        before = (shm_mappings(), shmring_threads())
        init(backend, init_method, rank, size)
        world = dist.distributed_c10d._get_default_group()
        sub = dist.new_group(members)
        ours = [world] + ([sub] if rank in members else [])
        for g in ours[1:]:
            report_job(g)
        t = torch.full((4,), float(rank + 1 + i))
        dist.all_reduce(t)
        check(torch.equal(t, torch.full((4,), size * (size + 1) / 2 + size * i)),
              f"round {i}: all_reduce gave {t.tolist()}")
        pending = [(torch.full((1 << 16,), float(rank + 1)), None)]
        if rank in members:
            pending.append((torch.full((1 << 10,), float(rank + 1)), sub))
        works = [dist.all_reduce(x, group=g, async_op=True) for x, g in pending]
        kept.append((ours, works))
        dist.destroy_process_group()
        for (x, g), w in zip(pending, works):
            w.wait()
            want = sum(r + 1 for r in (members if g is sub else range(size)))
            check(torch.equal(x, torch.full_like(x, float(want))),
                  f"round {i}: an all_reduce pending at destroy gave {x[0].item()}")
        maps, threads = left_over(before)
        check(maps == [], f"round {i}: still mapped after destroy: {maps}")
        check(threads is None, f"round {i}: threads (shmring's, all) {before[1]} before init, "
              f"{threads} after destroy: {thread_names()}")
        for g in ours:
            expect_error(lambda: g.allreduce([torch.ones(2)]).wait(), "destroyed")
        print(f"round {i} ok", flush=True)
    print("reinit ok", flush=True)


def scenario_torch_destroy(rank, size, init_method):
    """torch's own destroy_process_group (the one shmring.torch wraps),
    with the garbage collector off: a group that nothing else holds goes at
    once, communicator, segment and threads, so nothing of ours (a reference
    cycle through a Work, a future callback, DDP's reducer) keeps it alive
    until a collection. Three rounds: the default group, a new_group, an
    all_reduce through a future with a then() callback that holds its Work,
    a DDP step on the subgroup; each round in a store of its own (a file://
    URL per round), since torch's destroy does not wait for the peers."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch_destroy = dist.distributed_c10d.destroy_process_group.__wrapped__
    gc.disable()
    members = list(range(size))[::2]

    def round_(i):
        init("shmring", f"{init_method}.{i}", rank, size)
        sub = dist.new_group(members)
        if rank in members:
            report_job(sub)
        t = torch.full((4,), float(rank + 1))
        work = dist.all_reduce(t, async_op=True)
        seen = work.get_future().then(lambda f: (work, t.clone())).wait()
        check(torch.equal(seen[1], torch.full((4,), size * (size + 1) / 2)),
              f"torch_destroy round {i}: all_reduce gave {seen[1].tolist()}")
        if rank in members:
            model = DDP(nn.Linear(4, 2), process_group=sub)
            model(torch.ones(3, 4)).sum().backward()
        dist.barrier()
        torch_destroy()

    for i in range(3):
        before = (shm_mappings(), shmring_threads())
        round_(i)
        maps, threads = left_over(before)
        check(maps == [], f"torch_destroy round {i}: still mapped after torch's destroy: {maps}")
        check(threads is None, f"torch_destroy round {i}: threads (shmring's, all) {before[1]} "
              f"before init, {threads} after torch's destroy: {thread_names()}")
    print("torch_destroy ok", flush=True)


def scenario_job(rank, size):
    """One allreduce whose value names this job (JOB_VALUE): two jobs on one
    host with the same launcher ids must each see only their own ranks."""
    base = float(os.environ["JOB_VALUE"])
    t = torch.full((1000,), base * (rank + 1))
    for _ in range(20):
        x = t.clone()
        dist.all_reduce(x)
        check(torch.equal(x, torch.full((1000,), base * size * (size + 1) / 2)),
              f"job {base}: got {x[0].item()}")
    print("job ok", flush=True)


def scenario_smoke(rank, size):
    check(dist.get_rank() == rank and dist.get_world_size() == size, "rank and size")
    check(dist.get_backend() == "shmring", f"backend is {dist.get_backend()}")
    t = torch.full((100,), float(rank))
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((100,), float(sum(range(size))))), "smoke all_reduce")
    print("smoke ok", flush=True)


# -------------------------------------------------------------------- DDP

def ddp_models():
    """(name, builder, DDP kwargs, hook). Small models: the point is the
    backend's behaviour under DDP, not the training."""
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    def mlp():
        return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                             nn.Linear(16, 4))

    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = mlp()
            self.unused = nn.Linear(20, 4)

        def forward(self, x):
            return self.used(x)

    def bn():
        return nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))

    def powersgd(pg):
        state = psgd.PowerSGDState(process_group=pg, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, random_seed=0)
        return state, psgd.powerSGD_hook

    return [
        ("plain", mlp, {}, None),
        ("small_buckets", mlp, {"bucket_cap_mb": 0.001}, None),
        ("bucket_view", mlp, {"gradient_as_bucket_view": True, "static_graph": True}, None),
        ("allreduce_hook", mlp, {}, lambda pg: (pg, default_hooks.allreduce_hook)),
        ("fp16_hook", mlp, {}, lambda pg: (pg, default_hooks.fp16_compress_hook)),
        ("powersgd", mlp, {}, powersgd),
        ("unused", Unused, {"find_unused_parameters": True}, None),
        ("batchnorm", bn, {}, None),
    ]


def scenario_ddp(rank, size, outdir, steps=4):
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    for name, build, kwargs, hook in ddp_models():
        torch.manual_seed(100 + rank)  # ranks start apart: DDP's broadcast must fix that
        model = DDP(build(), **kwargs)
        if hook is not None:
            state, fn = hook(None)
            model.register_comm_hook(state, fn)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(1000 * rank + 7)
        for step in range(steps):
            x = torch.randn(8, 20, generator=gen)
            y = torch.randint(0, 4, (8,), generator=gen)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        state = {"params": [p.detach().clone() for p in model.parameters()],
                 "buffers": [b.detach().clone().double() for b in model.buffers()]}
        torch.save(state, os.path.join(outdir, f"{name}_rank{rank}.pt"))
        print(f"ddp {name} done", flush=True)
    print("ddp ok", flush=True)


def main():
    scenario, rank, size, init_method, outdir = sys.argv[1:6]
    backend = sys.argv[6] if len(sys.argv) > 6 else "shmring"
    rank, size = int(rank), int(size)
    if init_method == "env":
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if scenario == "reinit":  # makes and destroys its groups itself
        scenario_reinit(rank, size, backend, init_method)
        return
    if scenario == "torch_destroy":  # likewise
        scenario_torch_destroy(rank, size, init_method)
        return
    if scenario in ("leaving", "leaving_barrier"):  # likewise
        scenario_leaving(rank, size, init_method, barrier=scenario == "leaving_barrier")
        return
    init(backend, init_method, rank, size)
    if scenario == "ddp":
        scenario_ddp(rank, size, outdir)
    else:
        globals()["scenario_" + scenario](rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
