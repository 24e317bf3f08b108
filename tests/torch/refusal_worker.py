"""One rank of a torch refusal test (tests/torch/test_refusals.py).

    refusal_worker.py SCENARIO RANK SIZE INIT OUTDIR

Rank 1 makes a call the backend refuses (unsupported operator, a sparse
tensor, several tensors per list, sizes that disagree, an
unsupported operation) while the others make a good one: every rank must
raise at once, rank 1 the backend's refusal, the others shmring's mismatch
naming rank 1 and carrying its reason, and the group is then broken on every
rank. Each case runs
on a group of its own (dist.new_group). Exits 0 when every check held.
"""

import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

import shmring.torch  # noqa: F401  registers "shmring"
from torch_worker import check, expect_error, report_job, values

BAD = 1
FAST_S = 15.0  # far below the groups' 60 s timeout


def cases(rank, size):
    n = 6

    def sum_(g, async_op=False):
        t = values(rank, n, "SUM", torch.int32)
        w = dist.all_reduce(t, group=g, async_op=async_op)
        if async_op:
            w.wait()

    return {
        "band": (lambda g: dist.all_reduce(values(rank, n, "SUM", torch.int32),
                                           op=dist.ReduceOp.BAND, group=g),
                 sum_, ["BAND"]),
        "band_async": (lambda g: dist.all_reduce(values(rank, n, "SUM", torch.int32),
                                                 op=dist.ReduceOp.BAND, group=g, async_op=True),
                       lambda g: sum_(g, async_op=True), ["BAND"]),
        # (A CUDA or meta tensor never reaches the backend on a CPU-only
        # torch: the dispatcher refuses it the same on every rank.)
        "sparse": (lambda g: dist.all_reduce(torch.ones(n, dtype=torch.int32).to_sparse(),
                                             group=g),
                   sum_, ["layout"]),
        "two_tensors": (lambda g: g.allreduce([values(rank, n, "SUM", torch.int32),
                                               values(rank, n, "SUM", torch.int32)]),
                        sum_, ["exactly one"]),
        "dtype": (lambda g: dist.all_reduce(torch.ones(n, dtype=torch.int16), group=g),
                  sum_, ["int16"]),
        "allgather_list": (
            lambda g: dist.all_gather([torch.empty(n) for _ in range(size - 1)],
                                      torch.ones(n), group=g),
            lambda g: dist.all_gather([torch.empty(n) for _ in range(size)], torch.ones(n),
                                      group=g),
            ["group size"]),
        "allgather_numel": (
            lambda g: dist.all_gather([torch.empty(n + 1) for _ in range(size)],
                                      torch.ones(n), group=g),
            lambda g: dist.all_gather([torch.empty(n) for _ in range(size)], torch.ones(n),
                                      group=g),
            ["elements"]),
        "reduce_scatter_base": (
            lambda g: dist._reduce_scatter_base(torch.empty(n), torch.ones(size * n + 1),
                                                group=g),
            lambda g: dist._reduce_scatter_base(torch.empty(n), torch.ones(size * n), group=g),
            ["elements"]),
        "broadcast_root": (lambda g: g.broadcast([torch.ones(n)], _bad_root_opts(size)),
                           lambda g: dist.broadcast(torch.ones(n), src=0, group=g), ["root"]),
        # An operation the backend lacks, on rank 1 only, against the
        # others' all_reduce.
        "unsupported": (lambda g: g.allgather_coalesced([[torch.empty(n) for _ in range(size)]],
                                                        [torch.ones(n)]),
                        sum_, ["does not support"]),
    }


def _bad_root_opts(size):
    o = dist.BroadcastOptions()
    o.rootRank = size
    o.rootTensor = 0
    return o


def timed(fn, *needles):
    t0 = time.monotonic()
    msg = expect_error(fn, *needles)
    elapsed = time.monotonic() - t0
    check(elapsed < FAST_S, f"error after {elapsed:.1f} s: {msg}")
    return msg


def scenario_one_rank(rank, size):
    for name, (bad, good, words) in cases(rank, size).items():
        g = dist.new_group(list(range(size)))
        report_job(g)
        if rank == BAD:
            timed(lambda: bad(g), *words)
        else:
            # The peers' error carries rank 1's own reason, not only its rank.
            timed(lambda: good(g), f"rank {BAD} made an invalid call", *words)
        # Broken on every rank alike, the refusing one included.
        timed(lambda: dist.all_reduce(torch.ones(2), group=g), "unusable",
              f"rank {BAD} made an invalid call")
        dist.destroy_process_group(g)
        print(f"{name} ok", flush=True)
    # The default group never saw any of it.
    t = values(rank, 10, "SUM", torch.float32)
    dist.all_reduce(t)
    check(torch.equal(t, sum(values(r, 10, "SUM", torch.float32) for r in range(size))),
          "default group after the refusals")
    print("one_rank ok", flush=True)


def scenario_one_rank_hosts(rank, size):
    """As one_rank, on a group across two hosts (rank 1 alone on its own):
    the refusal reaches the other host's ranks too, through the store and
    gloo, not only the refusing rank's node-mates through shmring. Each
    case runs twice: refused by rank 1 (alone on its host), then by rank 2
    (beside rank 0). Last, a call every rank refuses leaves the group
    usable."""
    hosts = [None] * size
    dist.all_gather_object(hosts, socket.gethostname())
    check(hosts[0] == hosts[2] != hosts[1], f"hosts {hosts}")
    heard = []  # seconds until this rank raised another rank's refusal
    for bad_rank in (1, 2):
        for name in ("band", "dtype", "allgather_list", "broadcast_root", "reduce_scatter_base"):
            bad, good, words = cases(rank, size)[name]
            g = dist.new_group(list(range(size)))
            report_job(g)
            if rank == bad_rank:
                timed(lambda: bad(g), *words)
            else:
                # A rank whose part of the call needs nothing of the
                # refusing rank (a broadcast's node-mates of the root) may
                # complete it; every other rank raises at once.
                t0 = time.monotonic()
                try:
                    good(g)
                except RuntimeError as e:
                    check(f"rank {bad_rank} made an invalid call" in str(e),
                          f"the error does not name rank {bad_rank}'s invalid call: {e}")
                    check(all(w in str(e) for w in words),
                          f"the error does not carry rank {bad_rank}'s reason {words}: {e}")
                    heard.append(time.monotonic() - t0)
                check(time.monotonic() - t0 < FAST_S, f"{name}: not within {FAST_S} s")
            # From the next call on, the group is broken on every rank alike.
            timed(lambda: dist.all_reduce(torch.ones(2), group=g),
                  f"rank {bad_rank} made an invalid call")
            dist.destroy_process_group(g)
            print(f"{name} refused by rank {bad_rank} ok", flush=True)
    # A refusal reaches the peers once the refusing rank has waited 1 s
    # (kRefusalAgreement) for the others' marks, not later: a wait of the
    # store's own (FileStore counts whole seconds) made that 2 s. The
    # quickest case, so that a loaded machine cannot fail this.
    check(heard and min(heard) < 1.75, f"refusals heard after {heard} s")
    # Refused alike by every rank: nothing ran anywhere, and the group
    # stays usable, as on one host.
    g = dist.new_group(list(range(size)))
    report_job(g)
    bad, _, words = cases(rank, size)["band"]
    timed(lambda: bad(g), *words)
    # A result tensor whose elements share memory (expand()): refused before
    # anything moves, not when the result is copied into it.
    timed(lambda: dist.all_reduce(torch.tensor([float(rank)]).expand(5), group=g),
          "has elements that share memory")
    t = values(rank, 10, "SUM", torch.float32)
    dist.all_reduce(t, group=g)
    check(torch.equal(t, sum(values(r, 10, "SUM", torch.float32) for r in range(size))),
          "a group across hosts after a call every rank refused")
    dist.destroy_process_group(g)
    print("refused by every rank ok", flush=True)
    t = values(rank, 10, "SUM", torch.float32)
    dist.all_reduce(t)
    check(torch.equal(t, sum(values(r, 10, "SUM", torch.float32) for r in range(size))),
          "default group after the refusals")
    print("one_rank_hosts ok", flush=True)


def scenario_detail_hosts(rank, size):
    """Run with TORCH_DISTRIBUTED_DEBUG=DETAIL on a group across two hosts
    (rank 1 alone on its own): calls whose arguments are each valid but
    differ between ranks (a size, a dtype, a root, all_to_all sizes, an
    all_gather list's split) raise
    the same error on every rank, naming the two calls, before anything
    moved, and the group stays usable. Without the comparison gloo ends a
    process on a size check or returns wrong data."""
    hosts = [None] * size
    dist.all_gather_object(hosts, socket.gethostname())
    check(hosts[0] == hosts[2] != hosts[1], f"hosts {hosts}")
    head = "collective mismatch across the group"

    def same_everywhere(msg):
        msgs = [None] * size
        dist.all_gather_object(msgs, msg)
        check(all(m == msgs[0] for m in msgs), f"the ranks' errors differ: {msgs}")

    n = 2000 if rank == 1 else 1000
    same_everywhere(timed(lambda: dist.all_reduce(torch.ones(n)), head,
                          "rank 0 called ALLREDUCE(SUM, torch.float32, 1000 elements) but rank 1 "
                          "called ALLREDUCE(SUM, torch.float32, 2000 elements)", "stays usable"))
    dtype = torch.float64 if rank == 1 else torch.float32
    same_everywhere(timed(lambda: dist.all_reduce(torch.ones(8, dtype=dtype)), head,
                          "torch.float32", "rank 1 called ALLREDUCE(SUM, torch.float64, 8 "
                          "elements)"))
    src = 2 if rank == 2 else 0
    same_everywhere(timed(lambda: dist.broadcast(torch.zeros(7), src=src), head,
                          "rank 0 called BROADCAST(torch.float32, 7 elements, root 0) but rank 2 "
                          "called BROADCAST(torch.float32, 7 elements, root 2)"))
    op = dist.ReduceOp.MAX if rank == 2 else dist.ReduceOp.SUM
    same_everywhere(timed(lambda: dist.all_reduce(torch.ones(4), op=op), head,
                          "rank 2 called ALLREDUCE(MAX, torch.float32, 4 elements)"))
    # all_to_all_single: rank 1 expects 2 elements from rank 0, which sends 1.
    out_splits = [2, 1, 1] if rank == 1 else [1, 1, 1]
    same_everywhere(timed(
        lambda: dist.all_to_all_single(torch.zeros(sum(out_splits)), torch.ones(3),
                                       output_split_sizes=out_splits,
                                       input_split_sizes=[1, 1, 1]),
        head, "rank 0 sends 4 bytes to rank 1, which expects 8 bytes from it"))
    gathered = [torch.zeros(3) for _ in range(size)] if rank == 0 else None
    m = 5 if rank == 2 else 3
    same_everywhere(timed(lambda: dist.gather(torch.ones(m), gathered, dst=0), head,
                          "rank 2 called GATHER(torch.float32, 5 elements, root 0)"))
    # all_gather into lists of the same total, split otherwise on rank 1:
    # each rank's own call is valid, and gloo would move the blocks wrong.
    sizes = [4, 2, 2] if rank == 1 else [2, 4, 2]
    outs = [torch.zeros(k) for k in sizes]
    same_everywhere(timed(lambda: dist.all_gather(outs, torch.ones(sizes[rank])), head,
                          "rank 0 and rank 1 called ALLGATHER(torch.float32, 8 elements) with "
                          "tensor lists whose element counts differ"))
    # The same uneven lists on every rank are a valid call.
    sizes = [2, 4, 2]
    outs = [torch.zeros(k) for k in sizes]
    dist.all_gather(outs, torch.full((sizes[rank],), float(rank + 1)))
    check(all(torch.equal(o, torch.full((k,), float(r + 1))) for r, (o, k) in
              enumerate(zip(outs, sizes))), f"uneven all_gather {outs}")
    # Nothing moved in any of them: the group is as it was.
    t = values(rank, 1000, "SUM", torch.float32)
    dist.all_reduce(t)
    check(torch.equal(t, sum(values(r, 1000, "SUM", torch.float32) for r in range(size))),
          "all_reduce after the mismatches")
    out = torch.zeros(3)
    dist.all_to_all_single(out, torch.full((3,), float(rank)))
    check(torch.equal(out, torch.arange(3, dtype=torch.float32)), f"all_to_all_single {out}")
    print("detail_hosts ok", flush=True)


def main():
    scenario, rank, size, init_method = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4]
    kw = dict(timeout=datetime.timedelta(seconds=60))
    if scenario == "bad_setting":
        # One rank's own backend setting is bad: every rank's
        # init_process_group raises at once, naming that rank and the value.
        if rank == BAD:
            os.environ["SHMRING_TORCH_SHARD_BYTES"] = "4MiB"
        timed(lambda: dist.init_process_group("shmring", init_method=init_method, rank=rank,
                                              world_size=size, **kw),
              f"rank {BAD}: SHMRING_TORCH_SHARD_BYTES='4MiB': expected a number of bytes")
        print("bad_setting ok", flush=True)
        return
    if scenario == "host":
        # Rank 1 runs under another hostname (the test puts it in a UTS
        # namespace of its own): the group spans two hosts, ranks 0 and 2 on
        # one (a shmring communicator), rank 1 alone on the other, gloo
        # between them; every operation still gives the exact result.
        dist.init_process_group("shmring", init_method=init_method, rank=rank, world_size=size,
                                **kw)
        report_job(dist.distributed_c10d._get_default_group())
        hosts = [None] * size
        dist.all_gather_object(hosts, socket.gethostname())
        check(hosts[0] == hosts[2] != hosts[1], f"hosts {hosts}")
        for n in (1, 1000, 1 << 17):
            t = values(rank, n, "SUM", torch.float32)
            dist.all_reduce(t)
            check(torch.equal(t, sum(values(r, n, "SUM", torch.float32) for r in range(size))),
                  f"all_reduce n={n} across hosts {hosts}")
        t = torch.full((7,), float(rank))
        dist.broadcast(t, src=1)
        check(torch.equal(t, torch.full((7,), 1.0)), "broadcast from the lone host")
        dist.barrier()
        dist.destroy_process_group()
        print("host ok:", " ".join(hosts), flush=True)
        return
    dist.init_process_group("shmring", init_method=init_method, rank=rank, world_size=size, **kw)
    report_job(dist.distributed_c10d._get_default_group())
    globals()["scenario_" + scenario](rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
