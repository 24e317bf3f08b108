#!/usr/bin/python3
"""torch_multinode_perf: dist.all_reduce across (fake) nodes, the shmring
backend (shmring inside each node, gloo between) against a gloo group of the
same ranks, size by size, interleaved in one run.

    PYTHONPATH=build/python tools/fake-nodes --nodes 2x2 --launcher torchrun -- \\
        bench/torch_multinode_perf.py [-b 8] [-e 64M] [--dtypes float32,bfloat16]

Every rank joins the default group (backend "shmring") and a gloo group of
the same ranks (dist.new_group(backend="gloo")). For each dtype and size
(SUM, in place) it alternates rounds of back-to-back dist.all_reduce calls
on the two groups (--rounds of each, after a barrier each); a round's time is
the largest over ranks of the mean per call, a size's time the median round.
Rank 0 prints one row per size: bytes, shmring us, gloo us (medians), gloo /
shmring, and the worst ratio of a round pair (gloo's round over the shmring
round just before it): what a user meets on a bad moment.
torch 1.13's gloo cannot reduce bfloat16: its bfloat16 column is a float32
allreduce of the widened tensor, rounded back (what a gloo user does).
SHMRING_TORCH_SHARD_BYTES moves the backend's crossover from the leaders'
path to the sharded one (python/torch/multi_node.hpp).
"""

import argparse
import datetime
import os
import statistics
import sys
import time


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1].upper() in units:
        return int(float(s[:-1]) * units[s[-1].upper()])
    return int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-b", "--begin", default="8", help="smallest size in bytes (8)")
    ap.add_argument("-e", "--end", default="64M", help="largest size in bytes (64M)")
    ap.add_argument("-f", "--factor", type=int, default=4, help="size step factor (4)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="float32,bfloat16")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per group and size (5)")
    ap.add_argument("--paths", action="store_true",
                    help="also time two more shmring groups, one always on the sharded "
                         "path, one always on the leaders' path (to place the crossover)")
    ap.add_argument("--budget", type=float, default=0.15,
                    help="seconds a round aims at (0.15); iterations follow")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    try:
        import shmring.torch  # noqa: F401
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.normpath(os.path.join(here, "..", "build", "python")))
        import shmring.torch  # noqa: F401

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("shmring", timeout=datetime.timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    GLOO_WIDENS = {torch.bfloat16}
    groups = [(None, "shmring"), (gloo, "gloo")]
    if args.paths:
        # The threshold is read when a group is made.
        for threshold, key in ((0, "sharded"), (1 << 62, "leaders")):
            os.environ["SHMRING_TORCH_SHARD_BYTES"] = str(threshold)
            groups.append((dist.new_group(), key))
        del os.environ["SHMRING_TORCH_SHARD_BYTES"]

    def max_over_ranks(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        return float(t.item())

    wide_cache = {}

    def all_reduce(buf, group):
        if group is gloo and buf.dtype in GLOO_WIDENS:
            # torch 1.13's gloo has no 16-bit brain float: what a gloo user
            # does instead (widen, allreduce, round back) is the baseline,
            # into a float32 buffer kept from call to call (as the backend
            # does: a fresh one costs a page fault per page every call).
            wide = wide_cache.get(buf.numel())
            if wide is None:
                wide_cache.clear()
                wide = wide_cache[buf.numel()] = torch.empty(buf.numel())
            wide.copy_(buf)
            dist.all_reduce(wide, group=gloo)
            buf.copy_(wide)
        else:
            dist.all_reduce(buf, group=group)

    def timed(buf, group, iters):
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(iters):
            all_reduce(buf, group)
        return max_over_ranks((time.perf_counter() - t0) / iters)

    lo, hi = parse_bytes(args.begin), parse_bytes(args.end)
    if rank == 0:
        print(f"# {n} ranks, hosts of the shmring group's nodes differ; SUM in place; "
              f"median of {args.rounds} interleaved rounds; us per call", flush=True)
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        esize = torch.empty(0, dtype=dtype).element_size()
        if rank == 0:
            print(f"\n## {name}\n{'bytes':>10} {'shmring_us':>11} {'gloo_us':>11} "
                  f"{'gloo/shmring':>12} {'worst_pair':>10}"
                  + (f" {'sharded_us':>11} {'leaders_us':>11}" if args.paths else ""),
                  flush=True)
        size = lo
        while size <= hi:
            count = max(1, size // esize)
            buf = torch.ones(count, dtype=dtype)
            results = {}
            for group, key in groups:
                all_reduce(buf, group)  # warm-up
                results[key] = [timed(buf, group, 1)]
            iters = max(1, min(500, int(args.budget / max(results["shmring"][0], 1e-6))))
            for _ in range(args.rounds):
                for group, key in groups:
                    results[key].append(timed(buf, group, iters))
            buf.fill_(1)
            dist.all_reduce(buf)
            ok = bool((buf == n).all())
            if rank == 0:
                # results[k][0] is the warm-up's single timed call.
                rounds = {k: v[1:] for k, v in results.items()}
                s = statistics.median(rounds["shmring"]) * 1e6
                g = statistics.median(rounds["gloo"]) * 1e6
                worst = min(gr / sr for sr, gr in zip(rounds["shmring"], rounds["gloo"]))
                extra = "".join(f" {statistics.median(rounds[k]) * 1e6:>11.1f}"
                                for k in ("sharded", "leaders") if k in rounds)
                print(f"{count * esize:>10} {s:>11.1f} {g:>11.1f} {g / s:>12.2f} {worst:>10.2f}"
                      f"{extra}{'' if ok else '  WRONG RESULT'}", flush=True)
            size = hi if size < hi < size * args.factor else size * args.factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
