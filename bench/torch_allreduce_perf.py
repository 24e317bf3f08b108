#!/usr/bin/python3
"""torch_allreduce_perf: dist.all_reduce over the shmring backend against gloo,
size by size, in one run; and the backend's overhead over the raw binding.

    /usr/bin/python3 bench/torch_allreduce_perf.py -n 4                # launches 4 ranks
    build/tools/shmrun -n 4 -- /usr/bin/python3 bench/torch_allreduce_perf.py
    torchrun --nproc_per_node 4 --redirects 2 --tee 2 bench/torch_allreduce_perf.py

(PYTHONPATH=build/python from the build tree.) Every rank joins three
groups: the default process group on backend "shmring", a gloo group of the
same ranks (dist.new_group(backend="gloo")), and a raw shmring.Communicator.
For each size (float32, SUM, in place) it times `iters` back-to-back
dist.all_reduce calls on each group, after a barrier; the time of a size is
the largest over ranks of the mean per call. It checks each result. Rank 0
prints one row per size: shmring, gloo and the ratio, then the raw binding's
comm.allreduce against dist.all_reduce(backend shmring) at the smallest size.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1].upper() in units:
        return int(float(s[:-1]) * units[s[-1].upper()])
    return int(s)


def sizes(lo, hi, factor):
    out, s = [], float(lo)
    while s <= hi * 1.0000001:
        b = max(4, int(s) // 4 * 4)
        if not out or out[-1] != b:
            out.append(b)
        s *= factor
    return out


def import_shmring_torch():
    try:
        import shmring.torch  # noqa: F401
    except ImportError:
        built = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python")
        sys.path.insert(0, os.path.normpath(built))
        import shmring.torch  # noqa: F401
    import shmring
    return shmring


def worker(args):
    import torch
    import torch.distributed as dist

    shmring = import_shmring_torch()
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("shmring", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    pg = dist.distributed_c10d._get_default_group()
    raw = shmring.Communicator(rank=rank, size=n, job_id=pg.job_id + "-raw")

    def max_over_ranks(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def time_calls(call, buf, iters, warmup):
        for _ in range(warmup):
            call(buf)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            call(buf)
        return max_over_ranks((time.perf_counter() - t0) / iters)

    shm_call = lambda b: dist.all_reduce(b)  # noqa: E731
    gloo_call = lambda b: dist.all_reduce(b, group=gloo)  # noqa: E731
    raw_call = lambda b: raw.allreduce(b)  # noqa: E731

    # Timed on zeros (a sum of zeros stays zero, never inf or denormal);
    # checked with one more call on distinct values.
    def check(call, buf):
        buf.fill_(rank + 1)
        call(buf)
        want = n * (n + 1) / 2
        if not bool((buf == want).all()):
            raise SystemExit(f"torch_allreduce_perf: rank {rank}: wrong result at "
                             f"{buf.numel() * 4} B: {buf[0].item()} != {want}")
        buf.zero_()

    if rank == 0:
        print(f"# torch {torch.__version__}, shmring {shmring.__version__}, {n} ranks, "
              f"float32 sum in place; time = max over ranks of the mean per call")
        print(f"{'size':>10} {'count':>10} {'iters':>6} {'shmring us':>11} {'gloo us':>11} "
              f"{'gloo/shm':>9} {'shm algbw GB/s':>15} {'shm busbw GB/s':>15}", flush=True)
    rows = []
    for nbytes in sizes(args.minbytes, args.maxbytes, args.stepfactor):
        count = nbytes // 4
        iters = max(3, min(args.iters, int(args.budget // nbytes)))
        warmup = min(args.warmup, max(1, iters // 4))
        times = {}
        for name, call in (("shmring", shm_call), ("gloo", gloo_call)):
            buf = torch.zeros(count, dtype=torch.float32)
            check(call, buf)
            times[name] = time_calls(call, buf, iters, warmup)
            check(call, buf)
        t_s, t_g = times["shmring"], times["gloo"]
        algbw = nbytes / t_s / 1e9
        busbw = algbw * 2 * (n - 1) / n
        rows.append((nbytes, t_s, t_g))
        if rank == 0:
            print(f"{nbytes:>10} {count:>10} {iters:>6} {t_s * 1e6:>11.2f} {t_g * 1e6:>11.2f} "
                  f"{t_g / t_s:>9.1f} {algbw:>15.3f} {busbw:>15.3f}", flush=True)

    # Overhead of the backend (c10d call, Work, future, hand-off to the
    # progress thread) over the binding's blocking call, at the smallest size.
    nbytes = sizes(args.minbytes, args.maxbytes, args.stepfactor)[0]
    buf = torch.zeros(nbytes // 4, dtype=torch.float32)
    check(raw_call, buf)
    reps = []
    for _ in range(args.overhead_reps):
        t_raw = time_calls(raw_call, buf, args.overhead_iters, 100)
        t_dist = time_calls(shm_call, buf, args.overhead_iters, 100)
        reps.append((t_raw, t_dist))
    t_raw = statistics.median(r[0] for r in reps)
    t_dist = statistics.median(r[1] for r in reps)
    if rank == 0:
        print(f"# overhead at {nbytes} B (median of {args.overhead_reps} runs of "
              f"{args.overhead_iters} calls): raw comm.allreduce {t_raw * 1e6:.2f} us, "
              f"dist.all_reduce(shmring) {t_dist * 1e6:.2f} us, "
              f"backend overhead {(t_dist - t_raw) * 1e6:.2f} us per call", flush=True)
    raw.close()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=2,
                    help="ranks to launch when not started by a launcher (RANK unset)")
    ap.add_argument("-b", "--minbytes", type=parse_bytes, default=8)
    ap.add_argument("-e", "--maxbytes", type=parse_bytes, default=64 << 20)
    ap.add_argument("-f", "--stepfactor", type=float, default=2.0)
    ap.add_argument("--iters", type=int, default=200, help="calls timed per size (at most)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--budget", type=parse_bytes, default=1 << 30,
                    help="bytes per size and group: fewer iterations for large sizes")
    ap.add_argument("--overhead-iters", type=int, default=2000)
    ap.add_argument("--overhead-reps", type=int, default=5)
    args = ap.parse_args()
    if "RANK" in os.environ:
        return worker(args)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.nranks))
    procs = [subprocess.Popen([sys.executable] + sys.argv,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(args.nranks)]
    codes = [p.wait() for p in procs]
    sys.exit(next((c for c in codes if c != 0), 0))


if __name__ == "__main__":
    main()
