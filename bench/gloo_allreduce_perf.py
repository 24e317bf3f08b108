#!/usr/bin/python3
"""gloo_allreduce_perf: the allreduce_perf CSV for torch.distributed's gloo backend.

    /usr/bin/python3 bench/gloo_allreduce_perf.py -n 2 -b 8 -e 16M -f 2

Launches N local ranks (subprocesses of itself) that rendezvous over TCP on
127.0.0.1, time in-place float32 sum allreduce per size (time = max over
ranks), check one result, and print rank 0's rows in allreduce_perf's --csv
columns (the out-of-place and floor columns are 0: not measured here).
"""
import argparse
import os
import socket
import subprocess
import sys
import time

CSV_HEADER = ("backend,nranks,size,count,type,redop,iters,oop_time_us,oop_algbw,oop_busbw,"
              "oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong,floor_us,floor_ratio")


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


def worker(args):
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=n)

    def max_over_ranks(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    wrong_total = 0
    if rank == 0:
        print(CSV_HEADER, flush=True)
    for nbytes in sizes(args.minbytes, args.maxbytes, args.stepfactor):
        count = nbytes // 4
        iters = max(3, min(args.iters, int(args.budget // nbytes)))
        warmup = min(args.warmup, max(1, iters // 4))
        buf = torch.ones(count, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(buf)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        us = max_over_ranks((time.perf_counter() - t0) / iters * 1e6)
        # Check: distinct small integers per (rank, index), exact in float32.
        idx = torch.arange(count, dtype=torch.int64)
        x = (((idx * 13 + rank * 7) % 17) - 8).to(torch.float32)
        dist.all_reduce(x)
        want = sum((((idx * 13 + r * 7) % 17) - 8) for r in range(n)).to(torch.float32)
        wrong = torch.tensor([int((x != want).sum())], dtype=torch.int64)
        dist.all_reduce(wrong)
        wrong_total += int(wrong.item())
        algbw = nbytes / us / 1e3
        busbw = algbw * 2 * (n - 1) / n
        if rank == 0:
            print(f"gloo,{n},{nbytes},{count},float,sum,{iters},0,0,0,0,{us:.3f},{algbw:.4f},"
                  f"{busbw:.4f},{int(wrong.item())},0,0", flush=True)
    dist.destroy_process_group()
    return 0 if wrong_total == 0 else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("-b", "--minbytes", type=parse_bytes, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_bytes, default=16 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("--budget", type=float, default=float(1 << 30))
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.nranks < 1:
        p.error(f"--nranks {args.nranks}: expected >= 1")
    if args.stepfactor <= 1:
        p.error(f"--stepfactor {args.stepfactor}: expected > 1")
    if args.worker:
        return worker(args)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.nranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.nranks), LOCAL_RANK=str(r),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--port", str(port),
               "-n", str(args.nranks), "-b", str(args.minbytes), "-e", str(args.maxbytes),
               "-f", str(args.stepfactor), "--iters", str(args.iters), "-w", str(args.warmup),
               "--budget", str(args.budget)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=None if r == 0 else subprocess.DEVNULL))
    rc = 0
    for pr in procs:
        rc = rc or pr.wait()
    return rc


if __name__ == "__main__":
    sys.exit(main())
