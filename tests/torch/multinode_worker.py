"""One rank of a torch.distributed job across fake nodes
(tests/torch/test_multi_node.py), started by torchrun through
tools/fake-nodes --launcher torchrun:

    multinode_worker.py ops            every operation, checked
    multinode_worker.py kill VICTIM    VICTIM SIGKILLs itself mid-allreduce

Rank and size come from torchrun (RANK, WORLD_SIZE, GROUP_RANK: the fake
node). The default group is "shmring" (across the fake nodes: shmring inside
each, gloo between); a gloo group over the same ranks gives the reference
results where exact values cannot be written down. Prints "JOB_ID <id>" for
the default group, then one "<what> ok" line per part, and exits 0 only when
every check passed.
"""

import datetime
import os
import signal
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import coll_worker as cw
import torch_worker as tw
from torch_worker import check, check_close, values

TIMEOUT_S = 60


def node_layout(rank, size):
    """Every rank's fake node (its hostname), gathered over gloo."""
    mine = (rank, socket.gethostname(), int(os.environ["GROUP_RANK"]))
    everyone = [None] * size
    dist.all_gather_object(everyone, mine, group=GLOO)
    return everyone


def part_layout(rank, size):
    layout = node_layout(rank, size)
    for r, host, node in layout:
        check(host == f"fake-node-{node}", f"rank {r} runs on host {host}, node {node}")
    check(len({n for _, _, n in layout}) > 1, f"one node only: {layout}")
    print("layout ok:", " ".join(f"{r}@{h}" for r, h, _ in layout), flush=True)


def part_against_gloo(rank, size):
    """Random float32/float64 allreduces of many sizes (both paths across
    the nodes) against gloo's result; integers exactly."""
    gen = torch.Generator().manual_seed(rank)
    for n in (1, 7, 1000, 16384, 16385, 100003, 1 << 20):
        for dtype in (torch.float32, torch.float64, torch.int32):
            if dtype == torch.int32:
                x = torch.randint(-1000, 1000, (n,), generator=gen, dtype=torch.int32)
            else:
                x = torch.randn(n, generator=gen, dtype=dtype)
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=op)
                dist.all_reduce(b, op=op, group=GLOO)
                if dtype.is_floating_point and op == dist.ReduceOp.SUM:
                    ok = torch.allclose(a, b, rtol=1e-5, atol=1e-5)
                else:
                    ok = torch.equal(a, b)
                check(ok, f"all_reduce {op} {dtype} n={n} differs from gloo's by "
                          f"{(a.double() - b.double()).abs().max().item()}")
    # all_gather, broadcast and reduce_scatter of random data against gloo's.
    x = torch.randn(4097, generator=gen)
    outs = [torch.empty(4097) for _ in range(size)]
    refs = [torch.empty(4097) for _ in range(size)]
    dist.all_gather(outs, x)
    dist.all_gather(refs, x, group=GLOO)
    check(all(torch.equal(o, r) for o, r in zip(outs, refs)), "all_gather vs gloo")
    for root in range(size):
        a = torch.randn(5000, generator=gen)
        b = a.clone()
        dist.broadcast(a, src=root)
        dist.broadcast(b, src=root, group=GLOO)
        check(torch.equal(a, b), f"broadcast from {root} vs gloo")
    print("against gloo ok", flush=True)


def part_rounding(rank, size):
    """16-bit sums across nodes round once: rank 0 holds 1, rank 1 and the
    last rank 2^-8, the others 0; a node's partial rounded to 16 bits
    (1 + 2^-8 -> 1) would lose what the exact sum keeps."""
    for dtype in (torch.bfloat16, torch.float16):
        eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
        v = {0: 1.0, 1: eps, size - 1: eps}.get(rank, 0.0)
        t = torch.full((5,), v, dtype=dtype)
        dist.all_reduce(t)
        exact = 1.0 + 2 * eps if size > 2 else 1.0 + eps
        want = torch.full((5,), exact, dtype=torch.float64).to(dtype)
        check(torch.equal(t, want), f"{dtype} sum {t[0].item()}, expected {want[0].item()}")
        t = torch.full((3,), v, dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        want = torch.full((3,), exact / size, dtype=torch.float64).to(dtype)
        check(torch.equal(t, want), f"{dtype} avg {t[0].item()}, expected {want[0].item()}")
        # Large enough for the sharded path (SHMRING_TORCH_SHARD_BYTES=4096
        # on 2x2), whose shards round to 16 bits before the node's allgather;
        # contiguous, and a strided view (rounded after a float32 allgather).
        for op, div in ((dist.ReduceOp.SUM, 1), (dist.ReduceOp.AVG, size)):
            big = torch.full((2, 6000), v, dtype=dtype)
            big[1] = -big[1] * 3
            ref = big.double() * size
            ref[0], ref[1] = exact, -3 * exact
            for t in (big[:, ::2].contiguous(), big[:, ::2]):
                dist.all_reduce(t, op=op)
                want = (ref[:, ::2] / div).to(dtype)
                check(torch.equal(t, want), f"{dtype} {op} {tuple(t.shape)} stride "
                      f"{t.stride()}: {t[0, 0].item()}, {t[1, 0].item()}, expected "
                      f"{want[0, 0].item()}, {want[1, 0].item()}")
    print("rounding ok", flush=True)


def unsigned_bits(t):
    """The IEEE bits of floating tensor `t`'s elements, as unsigned numpy ints."""
    ints = {2: (torch.int16, np.uint16), 4: (torch.int32, np.uint32), 8: (torch.int64, np.uint64)}
    signed, unsigned = ints[t.element_size()]
    return t.contiguous().view(signed).numpy().view(unsigned)


def part_nan(rank, size):
    """A 16-bit NaN result across nodes is the default quiet NaN (0x7e00,
    0x7fc0), as inside a node (docs/guide/datatypes-and-accuracy.md), on
    every rounding path: the leaders' and the sharded allreduce, contiguous
    and strided, coalesced, reduce, reduce_scatter and its base form. In
    every triple of elements: +inf on rank 0 against -inf on the last rank
    (another node), which makes inf - inf; a negative NaN with a payload on
    rank 1; 0 everywhere."""
    quiet = {torch.float16: 0x7E00, torch.bfloat16: 0x7FC0}
    neg_payload = {torch.float16: 0xFE01, torch.bfloat16: 0xFFC1}

    def inputs(dtype, n):
        t = torch.zeros(n, dtype=dtype)
        if rank == 0:
            t[0::3] = float("inf")
        if rank == size - 1:
            t[0::3] = float("-inf")
        bits = t.view(torch.int16)
        if rank == 1:
            bits[1::3] = neg_payload[dtype] - 0x10000
        return t

    def expect(t, dtype, what):
        """Elements 3k and 3k + 1 hold the quiet NaN, 3k + 2 holds 0."""
        bits = unsigned_bits(t.reshape(-1))
        for j, want in enumerate((quiet[dtype], quiet[dtype], 0)):
            bad = np.flatnonzero(bits[j::3] != want)
            if bad.size:
                k = 3 * int(bad[0]) + j
                check(False, f"{what} {dtype}: element {k} is {hex(int(bits[k]))}, "
                      f"expected {hex(want)}")

    for dtype in (torch.float16, torch.bfloat16):
        for op in ("SUM", "AVG"):
            t = inputs(dtype, 9)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            expect(t, dtype, f"all_reduce {op}")
        # Large enough for the sharded path on 2x2 (SHMRING_TORCH_SHARD_BYTES);
        # a strided view rounds after a float32 allgather.
        big = inputs(dtype, 3 * 4000)
        dist.all_reduce(big)
        expect(big, dtype, "all_reduce large")
        strided = torch.stack([inputs(dtype, 3 * 2000), inputs(dtype, 3 * 2000)], dim=1)[:, 0]
        dist.all_reduce(strided)
        expect(strided, dtype, "all_reduce strided")
        ts = [inputs(dtype, 6), inputs(dtype, 3 * 700)]
        dist.all_reduce_coalesced(ts)
        for k, t in enumerate(ts):
            expect(t, dtype, f"all_reduce_coalesced tensor {k}")
        for root in (0, size - 1):
            t = inputs(dtype, 30)
            dist.reduce(t, dst=root)
            if rank == root:
                expect(t, dtype, f"reduce to {root}")
        out = torch.empty(30, dtype=dtype)
        dist.reduce_scatter(out, [inputs(dtype, 30) for _ in range(size)])
        expect(out, dtype, "reduce_scatter")
        out = torch.empty(30, dtype=dtype)
        dist._reduce_scatter_base(out, inputs(dtype, 30 * size))
        expect(out, dtype, "_reduce_scatter_base")
    print("nan ok", flush=True)


def part_minmax(rank, size):
    """MIN and MAX across nodes are IEEE 754-2019 minimum and maximum, as
    inside a node: a NaN on either side of the gloo stage wins (the default
    quiet NaN), -0 is below +0. In every group of four elements: -0 on the
    last rank (another node than rank 0) against +0; a NaN on the last rank;
    a NaN on rank 0; the rank. Small (the leaders' path) and large (sharded
    on 2x2)."""
    quiet = {torch.float32: 0x7FC00000, torch.float64: 0x7FF8000000000000,
             torch.float16: 0x7E00, torch.bfloat16: 0x7FC0}
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for n in (8, 4 * 3000):
            for op, zero, last in (("MIN", -0.0, 0), ("MAX", 0.0, size - 1)):
                t = torch.zeros(n, dtype=dtype)
                if rank == size - 1:
                    t[0::4] = -0.0
                    t[1::4] = float("nan")
                if rank == 0:
                    t[2::4] = float("nan")
                t[3::4] = rank
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                got = unsigned_bits(t)
                wants = (unsigned_bits(torch.tensor([zero], dtype=dtype))[0], quiet[dtype],
                         quiet[dtype], unsigned_bits(torch.tensor([last], dtype=dtype))[0])
                for j, want in enumerate(wants):
                    bad = np.flatnonzero(got[j::4] != want)
                    if bad.size:
                        k = 4 * int(bad[0]) + j
                        check(False, f"all_reduce {op} {dtype} n={n}: element {k} is "
                              f"{hex(int(got[k]))}, expected {hex(int(want))}")
    print("minmax ok", flush=True)


def part_p2p(rank, size):
    """send/recv between every pair of neighbours (across nodes too), both
    blocking and batched."""
    right, left = (rank + 1) % size, (rank - 1) % size
    out = torch.full((1000,), float(rank))
    got = torch.empty(1000)
    ops = [dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, got, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check(torch.equal(got, torch.full((1000,), float(left))), f"batch p2p from {left}")
    last = size - 1
    if rank == 0:
        dist.send(torch.arange(10, dtype=torch.int16), dst=last, tag=7)
        back = torch.empty(3, dtype=torch.float64)
        dist.recv(back, src=last, tag=8)
        check(torch.equal(back, torch.tensor([1.5, 2.5, 3.5], dtype=torch.float64)), "recv")
    elif rank == last:
        t = torch.empty(10, dtype=torch.int16)
        dist.recv(t, src=0, tag=7)
        check(torch.equal(t, torch.arange(10, dtype=torch.int16)), f"recv from 0: {t}")
        dist.send(torch.tensor([1.5, 2.5, 3.5], dtype=torch.float64), dst=0, tag=8)
    print("p2p ok", flush=True)


def part_groups(rank, size):
    """new_group across the nodes (first and last rank) and inside node 0."""
    last = size - 1
    g = dist.new_group([0, last])
    if rank in (0, last):
        tw.report_job(g)
        t = torch.full((9,), float(rank + 1))
        dist.all_reduce(t, group=g)
        check(torch.equal(t, torch.full((9,), float(last + 2))), f"new_group all_reduce {t}")
        b = torch.full((4,), float(rank))
        dist.broadcast(b, src=last, group=g)
        check(torch.equal(b, torch.full((4,), float(last))), "new_group broadcast")
        dist.barrier(group=g)
    layout = node_layout(rank, size)
    node0 = [r for r, _, n in layout if n == 0]
    h = dist.new_group(node0)
    if rank in node0:
        tw.report_job(h)
        t = torch.ones(3)
        dist.all_reduce(t, group=h)
        check(torch.equal(t, torch.full((3,), float(len(node0)))), "node-0 group all_reduce")
    dist.barrier()
    print("groups ok", flush=True)


def part_ddp(rank, size):
    """DDP on shmring (default comm and the tests' hooks) against DDP on the
    gloo group: the same parameters after a few steps."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    for name, build, kwargs, hook in tw.ddp_models():
        params = []
        for group in (None, GLOO):
            torch.manual_seed(100 + rank)
            model = DDP(build(), process_group=group, **kwargs)
            if hook is not None:
                state, fn = hook(group)
                model.register_comm_hook(state, fn)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            gen = torch.Generator().manual_seed(1000 * rank + 7)
            for _ in range(3):
                x = torch.randn(8, 20, generator=gen)
                y = torch.randint(0, 4, (8,), generator=gen)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            params.append([p.detach().clone() for p in model.parameters()])
        for a, b in zip(*params):
            check(torch.allclose(a, b, rtol=1e-4, atol=1e-5),
                  f"ddp {name}: shmring and gloo differ by {(a - b).abs().max().item()}")
    print("ddp ok", flush=True)


def scenario_ops(rank, size):
    part_layout(rank, size)
    tw.scenario_ops(rank, size)
    tw.scenario_layout(rank, size)
    tw.scenario_async(rank, size)
    cw.scenario_alltoall(rank, size)
    cw.scenario_gather_scatter(rank, size)
    cw.scenario_uneven(rank, size)
    part_against_gloo(rank, size)
    part_rounding(rank, size)
    part_nan(rank, size)
    part_minmax(rank, size)
    part_p2p(rank, size)
    part_groups(rank, size)
    part_ddp(rank, size)
    dist.destroy_process_group()
    print("multinode ops ok", flush=True)


def scenario_kill(rank, size, victim):
    """The victim SIGKILLs itself in the middle of a run of allreduces; every
    other rank, on every node, raises RuntimeError naming it, quickly."""
    # torchrun's agent polls its workers every second (tools/fake-nodes
    # passes --monitor_interval 1) and, once it sees the victim dead, sends
    # SIGTERM to the victim's node-mates. That race is not what this checks:
    # the survivors on the victim's node hold SIGTERM off until they have
    # reported (the agent waits 30 s before it sends SIGKILL).
    if rank != victim:
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
    t = torch.ones(1 << 18)
    dist.barrier()
    died_at = None
    try:
        for step in range(100000):
            if rank == victim and step == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t)
            died_at = time.monotonic()
            t.fill_(1.0)
        raise AssertionError("the allreduces went on without the victim")
    except RuntimeError as e:
        elapsed = time.monotonic() - (died_at or time.monotonic())
        msg = str(e)
        check(f"rank {victim} (pid" in msg and "died" in msg,
              f"the error does not say that rank {victim} died: {msg}")
        check(elapsed < 15, f"the error came {elapsed:.1f} s after the last allreduce: {msg}")
        print(f"kill ok on rank {rank} after {elapsed:.2f} s: {msg}", flush=True)
    # A broken group still ends cleanly (segments unlinked, threads joined).
    dist.destroy_process_group()


GLOO = None


def main():
    global GLOO
    scenario = sys.argv[1]
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("shmring", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    tw.report_job(dist.distributed_c10d._get_default_group())
    GLOO = dist.new_group(backend="gloo")
    if scenario == "ops":
        scenario_ops(rank, size)
    elif scenario == "kill":
        scenario_kill(rank, size, int(sys.argv[2]))
    else:
        raise SystemExit(f"multinode_worker.py: unknown scenario {scenario!r}")


if __name__ == "__main__":
    main()
