#!/usr/bin/python3
"""Data-parallel training of a Fashion-MNIST classifier with torch on CPU.

Every rank holds the whole model and a 1/N share of each global batch; after
backward the gradients are averaged across ranks with one allreduce per
bucket, so all ranks take the same optimizer step and keep identical
parameters. The gradients live in flat bucket buffers (each parameter's
.grad is a view into one), so the allreduce works on them in place with no
copy, as torch's DistributedDataParallel does with gradient_as_bucket_view.

--backend shmring uses shmring.Communicator().allreduce; --backend gloo runs
the very same loop with torch.distributed's gloo all_reduce, for comparison.
--backend both trains with shmring and, every step, also reduces a copy of
the same gradients with gloo: both are timed on the same bytes in the same
run (alternating which goes first, so neither always meets cold caches),
gloo's result is checked against shmring's, and the RESULT line gives the
per-step ratio.

    build/tools/shmrun -n 4 -- /usr/bin/python3 examples/train_torch.py --backend shmring
    build/tools/shmrun -n 4 -- /usr/bin/python3 examples/train_torch.py --backend gloo
    build/tools/shmrun -n 4 -- /usr/bin/python3 examples/train_torch.py --backend both

shmrun sets RANK / WORLD_SIZE (and SHMRING_*); with gloo, MASTER_ADDR and
MASTER_PORT default to 127.0.0.1 and a port derived from the job id.

--ddp trains the same model with torch's own, unmodified
DistributedDataParallel over torch.distributed, with --backend shmring (the
backend registered by `import shmring.torch`) or gloo, under torchrun or
shmrun (both set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT):

    build/tools/shmrun -n 4 -- /usr/bin/python3 examples/train_torch.py --ddp --model cnn
    torchrun --nproc_per_node 4 --redirects 2 --tee 2 examples/train_torch.py --ddp --backend gloo

(Debian 12's torchrun needs --redirects 2 --tee 2: with its default it stops
at start with "AttributeError: 'NoneType' object has no attribute 'get'".)
"""

import argparse
import gzip
import os
import pathlib
import statistics
import sys
import time
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
# Mean and standard deviation of the Fashion-MNIST training pixels in [0, 1].
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


def import_shmring():
    """Imports shmring, falling back to the module built in <repo>/build/python."""
    try:
        import shmring
    except ImportError:
        built = pathlib.Path(__file__).resolve().parent.parent / "build" / "python"
        sys.path.insert(0, str(built))
        import shmring
    return shmring


def load_idx(path, header_bytes, shape):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    return np.frombuffer(bytearray(raw), dtype=np.uint8, offset=header_bytes).reshape(shape)


def load_fashion_mnist(data_dir):
    """(train_images, train_labels, test_images, test_labels) as uint8 / int64 arrays."""
    d = pathlib.Path(data_dir)
    names = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    missing = [n for n in names if not (d / n).is_file()]
    if missing:
        raise SystemExit(f"train_torch: {d} lacks {', '.join(missing)} (the Fashion-MNIST idx "
                         f"files); pass --data DIR")
    # idx: images have a 16-byte header (magic, count, rows, cols), labels 8.
    train_x = load_idx(d / names[0], 16, (-1, 28, 28))
    train_y = load_idx(d / names[1], 8, (-1,)).astype(np.int64)
    test_x = load_idx(d / names[2], 16, (-1, 28, 28))
    test_y = load_idx(d / names[3], 8, (-1,)).astype(np.int64)
    return train_x, train_y, test_x, test_y


def to_input(images):
    x = torch.from_numpy(images).float().div_(255.0)
    return x.sub_(PIXEL_MEAN).div_(PIXEL_STD).unsqueeze_(1)  # N x 1 x 28 x 28


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                             nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    raise ValueError(f"unknown model {name!r}")


class Backend:
    """allreduce(tensor) in place with SUM, for either library."""

    def __init__(self, name, rank, world_size):
        self.name = name
        if name == "shmring":
            shmring = import_shmring()
            self.comm = shmring.Communicator()
            self.sum = shmring.ReduceOp.SUM
            if (self.comm.rank, self.comm.size) != (rank, world_size):
                raise SystemExit(f"train_torch: shmring says rank {self.comm.rank} of "
                                 f"{self.comm.size}, RANK/WORLD_SIZE say {rank} of {world_size}")
        else:
            import torch.distributed as dist
            job = os.environ.get("SHMRING_JOB_ID", "train_torch")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(20000 + zlib.crc32(job.encode()) % 20000))
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            dist.init_process_group("gloo", init_method="env://", rank=rank,
                                    world_size=world_size)
            self.dist = dist

    def allreduce(self, tensor):
        if self.name == "shmring":
            self.comm.allreduce(tensor, self.sum)
        else:
            self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM)

    def broadcast(self, tensor, root=0):
        if self.name == "shmring":
            self.comm.broadcast(tensor, root)
        else:
            self.dist.broadcast(tensor, src=root)

    def close(self):
        if self.name == "shmring":
            self.comm.close()
        else:
            self.dist.destroy_process_group()


class GradientBuckets:
    """Flat gradient buffers, one per bucket of about bucket_bytes.

    Each parameter's .grad becomes a view into its bucket, so backward
    accumulates straight into the buffers the allreduce reduces in place.
    Parameters are bucketed in reverse order (the order backward produces
    their gradients), as DDP does.
    """

    def __init__(self, params, bucket_bytes):
        params = [p for p in params if p.requires_grad][::-1]
        groups, current, size = [], [], 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if current and bucket_bytes > 0 and size + nbytes > bucket_bytes:
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            groups.append(current)
        self.buffers = []
        for group in groups:
            flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype)
            offset = 0
            for p in group:
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            self.buffers.append(flat)
        self.token = torch.zeros(1)

    def average(self, backend, world_size, sync):
        """Averages the gradients across ranks.

        Returns (seconds waiting for the slowest rank, seconds in allreduce,
        CPU seconds this process used in allreduce, all its threads). On
        shared, oversubscribed cores the wall time also holds the time the
        ranks spent waiting for a core; the CPU time does not.
        With `sync`, a one-element allreduce first lines the ranks up, so the
        second figure is the cost of moving and reducing the gradients alone;
        without it, that figure also holds the wait for the slowest rank's
        backward, which on shared cores is far larger than either library's
        own time.
        """
        waited = 0.0
        if sync:
            t0 = time.perf_counter()
            backend.allreduce(self.token)
            waited = time.perf_counter() - t0
        spent = cpu = 0.0
        for flat in self.buffers:
            t0, c0 = time.perf_counter(), time.process_time()
            backend.allreduce(flat)
            spent += time.perf_counter() - t0
            cpu += time.process_time() - c0
            flat.div_(world_size)
        return waited, spent, cpu

    def average_both(self, shm, gloo, world_size, step):
        """Averages with shmring, and times gloo on a copy of the same bytes.

        Each bucket is reduced by both libraries, each after a token allreduce
        of its own has lined the ranks up; the order alternates with the step.
        gloo's sum must equal shmring's to float32 rounding (the two add the
        ranks' values in different orders). Returns (shmring s, gloo s).
        """
        t_shm = t_gloo = 0.0
        for flat in self.buffers:
            copy = flat.clone()
            order = [("shm", flat), ("gloo", copy)]
            for which, buf in (order if step % 2 == 0 else order[::-1]):
                lib = shm if which == "shm" else gloo
                lib.allreduce(self.token)  # as in a run with that library alone
                t0 = time.perf_counter()
                lib.allreduce(buf)
                dt = time.perf_counter() - t0
                if which == "shm":
                    t_shm += dt
                else:
                    t_gloo += dt
            # Scale from the finite values: a diverged run's NaN or Inf must
            # neither break the tolerance nor hide a difference elsewhere.
            finite = flat[torch.isfinite(flat)]
            atol = 1e-6 * float(finite.abs().max()) if finite.numel() else 0.0
            if not torch.allclose(copy, flat, rtol=1e-5, atol=atol, equal_nan=True):
                bad = (copy - flat).abs().argmax().item()
                raise SystemExit(f"train_torch: step {step}: gloo and shmring sums differ at "
                                 f"element {bad}: {copy[bad].item()!r} vs {flat[bad].item()!r}")
            flat.div_(world_size)
        return t_shm, t_gloo


def broadcast_from_rank0(model, backend):
    """Makes every rank start from rank 0's parameters, whatever its seed did."""
    with torch.no_grad():
        for p in model.parameters():
            backend.broadcast(p.detach())  # Shares p's storage: written in place.


def evaluate(model, backend, images, labels, rank, world_size, batch=1000):
    """Test loss and accuracy over the whole set, each rank scoring a 1/N share."""
    model.eval()
    share = slice(rank, None, world_size)
    x_all, y_all = images[share], labels[share]
    stats = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    with torch.no_grad():
        for i in range(0, len(y_all), batch):
            x, y = to_input(x_all[i:i + batch]), torch.from_numpy(y_all[i:i + batch])
            out = model(x)
            stats[0] += F.cross_entropy(out, y, reduction="sum").item()
            stats[1] += (out.argmax(1) == y).sum().item()
            stats[2] += len(y)
    backend.allreduce(stats)
    model.train()
    return stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()


def local_batch_size(batch_size, world_size):
    """Each rank's share of --batch-size; exits naming the nearest valid sizes
    when the world size does not divide it."""
    if batch_size % world_size:
        below = batch_size // world_size * world_size
        nearest = (f"{below} or " if below else "") + str(below + world_size)
        raise SystemExit(f"train_torch: --batch-size {batch_size} is not a multiple of the "
                         f"world size {world_size} (the nearest that are: {nearest})")
    return batch_size // world_size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--backend", choices=["shmring", "gloo", "both"], default="shmring",
                    help="both: train with shmring, also time gloo on the same gradients")
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp",
                    help="mlp: 784-256-128-10; cnn: two 5x5 conv layers and two linear ones")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the 60000 training images")
    ap.add_argument("--batch-size", type=int, default=256, help="global batch, all ranks")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    ap.add_argument("--bucket-mb", type=float, default=0.0,
                    help="gradient bucket size in MiB; 0 = one flat buffer")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5,
                    help="first steps left out of the timing statistics")
    ap.add_argument("--no-sync", action="store_true",
                    help="time the gradient allreduce without first lining the ranks up (the "
                         "time then includes waiting for the slowest rank)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=DEFAULT_DATA, help="folder with the Fashion-MNIST .gz files")
    ap.add_argument("--dump-params", metavar="DIR",
                    help="write the final parameters to DIR/params_rank<R>.npy")
    ap.add_argument("--ddp", action="store_true",
                    help="train with torch's DistributedDataParallel over torch.distributed "
                         "(--backend shmring or gloo)")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0,
                    help="--ddp: DDP's bucket_cap_mb (its default is 25)")
    ap.add_argument("--hook", choices=["none", "allreduce", "fp16", "powersgd"], default="none",
                    help="--ddp: DDP communication hook")
    args = ap.parse_args()
    if args.ddp:
        return main_ddp(args)

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.epochs < 1:
        raise SystemExit(f"train_torch: --epochs {args.epochs}: expected at least 1")
    local_batch = local_batch_size(args.batch_size, world_size)
    # The ranks share the cores: one intra-op thread each, no oversubscription.
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    train_x, train_y, test_x, test_y = load_fashion_mnist(args.data)
    backend = Backend("shmring" if args.backend == "both" else args.backend, rank, world_size)
    gloo = Backend("gloo", rank, world_size) if args.backend == "both" else None
    model = make_model(args.model)
    broadcast_from_rank0(model, backend)
    buckets = GradientBuckets(model.parameters(), int(args.bucket_mb * 2**20))
    # foreach=False: the in-place per-tensor update leaves .grad views intact.
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, foreach=False)
    n_params = sum(p.numel() for p in model.parameters())
    log = print if rank == 0 else (lambda *a, **k: None)
    log(f"train_torch: backend={args.backend} model={args.model} params={n_params} "
        f"ranks={world_size} global_batch={args.batch_size} buckets={len(buckets.buffers)} "
        f"({', '.join(f'{b.numel() * b.element_size() / 2**20:.2f}' for b in buckets.buffers)} MiB)",
        flush=True)

    steps_per_epoch = len(train_y) // args.batch_size
    if steps_per_epoch == 0:
        raise SystemExit(f"train_torch: --batch-size {args.batch_size} is larger than the "
                         f"{len(train_y)} training images: no step would run")
    ar_times, wait_times, cpu_times, step_times, gloo_times = [], [], [], [], []
    step = 0
    done = False
    for epoch in range(args.epochs):
        # The same permutation on every rank; each takes its own slice of a batch.
        perm = np.random.default_rng(args.seed + epoch).permutation(len(train_y))
        for s in range(steps_per_epoch):
            t_step = time.perf_counter()
            lo = s * args.batch_size + rank * local_batch
            idx = perm[lo:lo + local_batch]
            x, y = to_input(train_x[idx]), torch.from_numpy(train_y[idx])
            opt.zero_grad(set_to_none=False)
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            if gloo is not None:
                ar, ar_gloo = buckets.average_both(backend, gloo, world_size, step)
                wait = cpu = 0.0
                gloo_times.append(ar_gloo)
            else:
                wait, ar, cpu = buckets.average(backend, world_size, sync=not args.no_sync)
            opt.step()
            step_times.append(time.perf_counter() - t_step)
            ar_times.append(ar)
            wait_times.append(wait)
            cpu_times.append(cpu)
            step += 1
            if rank == 0 and (step % args.log_every == 0 or step == 1):
                acc = (out.argmax(1) == y).float().mean().item()
                head = (f"epoch {epoch + 1}/{args.epochs} step {step:5d}  loss {loss.item():.4f}  "
                        f"batch acc {acc:.3f}  ")
                if gloo is not None:
                    log(head + f"allreduce: shmring {ar * 1e3:7.3f} ms, gloo "
                        f"{gloo_times[-1] * 1e3:7.3f} ms  step {step_times[-1] * 1e3:8.2f} ms",
                        flush=True)
                else:
                    # cpu: CPU time this process spent in the allreduce; wait:
                    # time lining the ranks up before it (the slowest rank).
                    log(head + f"allreduce {ar * 1e3:8.3f} ms (cpu {cpu * 1e3:7.3f})  "
                        f"wait {wait * 1e3:7.3f} ms  step {step_times[-1] * 1e3:8.2f} ms",
                        flush=True)
            if args.max_steps and step >= args.max_steps:
                done = True
                break
        test_loss, test_acc = evaluate(model, backend, test_x, test_y, rank, world_size)
        log(f"epoch {epoch + 1}/{args.epochs} done: test loss {test_loss:.4f}  "
            f"test accuracy {test_acc:.4f}",
            flush=True)
        if done:
            break

    if args.dump_params:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        os.makedirs(args.dump_params, exist_ok=True)
        np.save(os.path.join(args.dump_params, f"params_rank{rank}.npy"), flat.numpy())

    def ms(times):
        return [t * 1e3 for t in (times[args.warmup:] or times)]

    ar_ms, wait_ms, step_ms = ms(ar_times), ms(wait_times), ms(step_times)
    cpu_ms = ms(cpu_times)
    if gloo is not None:
        gloo_ms = ms(gloo_times)
        mean_s, mean_g = statistics.mean(ar_ms), statistics.mean(gloo_ms)
        med_s, med_g = statistics.median(ar_ms), statistics.median(gloo_ms)
        log(f"allreduce per step over {len(ar_ms)} steps (the first {step - len(ar_ms)} left out: "
            f"--warmup), {world_size} ranks, "
            f"{sum(b.numel() for b in buckets.buffers) * 4 / 2**20:.2f} MiB of float32 gradients:")
        log(f"  {'':8} {'mean ms':>9} {'median ms':>10}")
        log(f"  {'shmring':8} {mean_s:9.3f} {med_s:10.3f}")
        log(f"  {'gloo':8} {mean_g:9.3f} {med_g:10.3f}")
        log(f"  {'gloo/shm':8} {mean_g / mean_s:9.1f} {med_g / med_s:10.1f}")
        log(f"RESULT backend=both model={args.model} ranks={world_size} steps={step} "
            f"shmring_mean_ms={mean_s:.3f} shmring_median_ms={med_s:.3f} "
            f"gloo_mean_ms={mean_g:.3f} gloo_median_ms={med_g:.3f} "
            f"ratio_mean={mean_g / mean_s:.1f} ratio_median={med_g / med_s:.1f} "
            f"test_acc={test_acc:.4f} test_loss={test_loss:.4f}", flush=True)
        gloo.close()
        backend.close()
        return
    log(f"RESULT backend={args.backend} model={args.model} ranks={world_size} steps={step} "
        f"allreduce_mean_ms={statistics.mean(ar_ms):.3f} "
        f"allreduce_median_ms={statistics.median(ar_ms):.3f} "
        f"allreduce_cpu_mean_ms={statistics.mean(cpu_ms):.3f} "
        f"wait_mean_ms={statistics.mean(wait_ms):.3f} step_mean_ms={statistics.mean(step_ms):.2f} "
        f"test_acc={test_acc:.4f} "
        f"test_loss={test_loss:.4f}", flush=True)
    backend.close()


def main_ddp(args):
    """Trains with DistributedDataParallel: gradients are averaged by DDP's
    bucketed, asynchronous allreduces during backward."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.backend == "both":
        raise SystemExit("train_torch: --ddp takes --backend shmring or gloo")
    if args.backend == "shmring":
        import_shmring()
        import shmring.torch  # noqa: F401  registers the backend "shmring"
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        raise SystemExit("train_torch: --ddp needs MASTER_ADDR and MASTER_PORT (run it under "
                         "torchrun or shmrun)")
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_batch = local_batch_size(args.batch_size, world_size)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    train_x, train_y, test_x, test_y = load_fashion_mnist(args.data)
    dist.init_process_group(args.backend, init_method="env://", rank=rank, world_size=world_size)

    # DDP broadcasts rank 0's parameters and buffers at construction.
    model = DDP(make_model(args.model), bucket_cap_mb=args.bucket_cap_mb)
    if args.hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        if args.hook == "allreduce":
            model.register_comm_hook(None, default_hooks.allreduce_hook)
        elif args.hook == "fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        else:
            state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                           start_powerSGD_iter=2, random_seed=args.seed)
            model.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    n_params = sum(p.numel() for p in model.parameters())
    log = print if rank == 0 else (lambda *a, **k: None)
    log(f"train_torch: DDP backend={args.backend} model={args.model} params={n_params} "
        f"ranks={world_size} global_batch={args.batch_size} bucket_cap_mb={args.bucket_cap_mb} "
        f"hook={args.hook}", flush=True)

    steps_per_epoch = len(train_y) // args.batch_size
    if steps_per_epoch == 0:
        raise SystemExit(f"train_torch: --batch-size {args.batch_size} is larger than the "
                         f"{len(train_y)} training images: no step would run")

    def evaluate_ddp():
        model.eval()
        share = slice(rank, None, world_size)
        stats = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
        with torch.no_grad():
            for i in range(0, len(test_y[share]), 1000):
                x = to_input(test_x[share][i:i + 1000])
                y = torch.from_numpy(test_y[share][i:i + 1000])
                out = model.module(x)
                stats[0] += F.cross_entropy(out, y, reduction="sum").item()
                stats[1] += (out.argmax(1) == y).sum().item()
                stats[2] += len(y)
        dist.all_reduce(stats)
        model.train()
        return stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()

    step_times = []
    step = 0
    done = False
    test_loss = test_acc = float("nan")
    for epoch in range(args.epochs):
        perm = np.random.default_rng(args.seed + epoch).permutation(len(train_y))
        for s in range(steps_per_epoch):
            t_step = time.perf_counter()
            lo = s * args.batch_size + rank * local_batch
            idx = perm[lo:lo + local_batch]
            x, y = to_input(train_x[idx]), torch.from_numpy(train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # DDP's bucket allreduces run while backward goes on
            opt.step()
            step_times.append(time.perf_counter() - t_step)
            step += 1
            if rank == 0 and (step % args.log_every == 0 or step == 1):
                log(f"epoch {epoch + 1}/{args.epochs} step {step:5d}  loss {loss.item():.4f}  "
                    f"step {step_times[-1] * 1e3:8.2f} ms", flush=True)
            if args.max_steps and step >= args.max_steps:
                done = True
                break
        test_loss, test_acc = evaluate_ddp()
        log(f"epoch {epoch + 1}/{args.epochs} done: test loss {test_loss:.4f}  "
            f"test accuracy {test_acc:.4f}", flush=True)
        if done:
            break

    if args.dump_params:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        os.makedirs(args.dump_params, exist_ok=True)
        np.save(os.path.join(args.dump_params, f"params_rank{rank}.npy"), flat.numpy())
    step_ms = [t * 1e3 for t in (step_times[args.warmup:] or step_times)]
    log(f"RESULT ddp backend={args.backend} model={args.model} ranks={world_size} steps={step} "
        f"bucket_cap_mb={args.bucket_cap_mb} hook={args.hook} "
        f"step_mean_ms={statistics.mean(step_ms):.2f} "
        f"step_median_ms={statistics.median(step_ms):.2f} "
        f"test_acc={test_acc:.4f} test_loss={test_loss:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
