#!/usr/bin/python3
"""Multi-process checks of examples/train_mlp, run through shmrun.

usage: mlp_driver.py CHECK SHMRUN TRAIN_MLP [DATA_DIR]

CHECK is one of:
  hash          N=3 for a few steps: every rank prints the same parameter hash.
  loss_curve    N=1 and N=4, same global batch and seed: the first 50 step
                losses agree to a relative 1e-4 (proves the gradient averaging).
  accum         N=2 with --accum 2 (micro-batches of 64 over the ranks) against
                N=1 with a plain batch twice that (128): same 50 step losses.
  missing_data  a data directory without the files: every rank names the
                missing file, exit status non-zero.
  truncated     a truncated .gz: every rank reports it, exit status non-zero.
  bad_magic     an image file with a wrong IDX magic: same.
  bad_batch     a global batch not divisible by N x accum: every rank says so.
  accuracy      N=2, 3 epochs on the full data: test accuracy >= 85% (the
                quick start runs 8 epochs on 4 ranks and reaches about 88%).
"""
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile

CHECK, SHMRUN, TRAIN = sys.argv[1], sys.argv[2], sys.argv[3]
DATA = sys.argv[4] if len(sys.argv) > 4 else "/usr/share/datasets/fashion-mnist"
FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
# Few steps on a slice of the data: each run takes seconds even with more
# ranks than cores.
SMALL = ["--epochs", "1", "--limit", "8192", "--test-limit", "1000"]

env = dict(os.environ)
env.setdefault("SHMRING_TIMEOUT", "60")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(n, args):
    cmd = [SHMRUN, "-n", str(n), "--", TRAIN] + args
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    sys.stdout.write(p.stdout[-3000:])
    sys.stdout.write(p.stderr[-3000:])
    return p


def run_ok(n, args):
    p = run(n, args)
    if p.returncode != 0:
        fail(f"exit status {p.returncode} for N={n} {args}")
    return p


def step_losses(out):
    losses = {}
    for m in re.finditer(r"^step (\d+) loss (\S+)$", out, re.M):
        losses[int(m.group(1))] = float(m.group(2))
    return losses


def compare_curves(ref, other, steps=50, rtol=1e-4):
    if len(ref) < steps or len(other) < steps:
        fail(f"expected {steps} step losses, got {len(ref)} and {len(other)}")
    worst = 0.0
    for s in range(1, steps + 1):
        a, b = ref[s], other[s]
        rel = abs(a - b) / max(abs(a), 1e-12)
        worst = max(worst, rel)
        if not rel < rtol:
            fail(f"step {s}: loss {a!r} vs {b!r}, relative difference {rel:.3g} >= {rtol}")
    # The curve must actually move, or equality would prove nothing.
    if not ref[steps] < 0.6 * ref[1]:
        fail(f"loss did not fall: step 1 {ref[1]}, step {steps} {ref[steps]}")
    print(f"OK: {steps} steps, worst relative difference {worst:.3g}")


def expect_error_on_every_rank(p, n, pattern):
    if p.returncode == 0:
        fail("expected a non-zero exit status")
    for r in range(n):
        lines = [l for l in p.stderr.splitlines()
                 if l.startswith(f"train_mlp: rank {r}: error:")]
        if not any(re.search(pattern, l) for l in lines):
            fail(f"rank {r} printed no error matching {pattern!r}")
    if "Segmentation" in p.stderr or "signal" in p.stderr:
        fail("a rank crashed instead of reporting the error")
    print(f"OK: exit status {p.returncode}, every rank reported /{pattern}/")


def data_copy(tmp):
    d = os.path.join(tmp, "data")
    os.mkdir(d)
    for f in FILES:
        os.symlink(os.path.join(DATA, f), os.path.join(d, f))
    return d


if CHECK == "hash":
    n = 3
    p = run_ok(n, SMALL + ["--batch", "96", "--max-steps", "20"])
    hashes = re.findall(r"^rank (\d+) param_hash ([0-9a-f]{16})$", p.stdout, re.M)
    ranks = sorted(int(r) for r, _ in hashes)
    if ranks != list(range(n)):
        fail(f"expected one hash line per rank 0..{n - 1}, got ranks {ranks}")
    if len({h for _, h in hashes}) != 1:
        fail(f"parameter hashes differ: {hashes}")
    print(f"OK: {n} ranks, hash {hashes[0][1]}")

elif CHECK == "loss_curve":
    args = SMALL + ["--batch", "128", "--max-steps", "50", "--seed", "7", "--print-step-loss"]
    compare_curves(step_losses(run_ok(1, args).stdout), step_losses(run_ok(4, args).stdout))

elif CHECK == "accum":
    common = SMALL + ["--max-steps", "50", "--seed", "11", "--print-step-loss"]
    ref = step_losses(run_ok(1, common + ["--batch", "128"]).stdout)
    acc = step_losses(run_ok(2, common + ["--batch", "128", "--accum", "2"]).stdout)
    compare_curves(ref, acc)

elif CHECK == "missing_data":
    with tempfile.TemporaryDirectory() as tmp:
        d = data_copy(tmp)
        os.remove(os.path.join(d, "train-labels-idx1-ubyte.gz"))
        p = run(3, SMALL + ["--batch", "96", "--data", d])
        expect_error_on_every_rank(p, 3, r"train-labels-idx1-ubyte\.gz: no such file")
        p = run(2, SMALL + ["--batch", "96", "--data", os.path.join(tmp, "nowhere")])
        expect_error_on_every_rank(p, 2, r"data directory .*nowhere does not exist")

elif CHECK == "truncated":
    with tempfile.TemporaryDirectory() as tmp:
        d = data_copy(tmp)
        name = os.path.join(d, "train-images-idx3-ubyte.gz")
        with open(os.path.join(DATA, FILES[0]), "rb") as f:
            blob = f.read()
        os.remove(name)
        with open(name, "wb") as f:
            f.write(blob[: len(blob) // 2])  # a download cut off half way
        p = run(3, SMALL + ["--batch", "96", "--data", d])
        expect_error_on_every_rank(p, 3, r"train-images-idx3-ubyte\.gz: (file ends early|corrupt)")

elif CHECK == "bad_magic":
    with tempfile.TemporaryDirectory() as tmp:
        d = data_copy(tmp)
        name = os.path.join(d, "t10k-images-idx3-ubyte.gz")
        os.remove(name)
        # A label file's header (IDX1) where an image file (IDX3) belongs.
        with gzip.open(name, "wb") as f:
            f.write(bytes([0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 4]))
        p = run(2, SMALL + ["--batch", "96", "--data", d])
        expect_error_on_every_rank(
            p, 2, r"t10k-images-idx3-ubyte\.gz: bad IDX magic 0x00000801, expected 0x00000803")

elif CHECK == "bad_batch":
    p = run(3, SMALL + ["--batch", "100", "--accum", "2"])
    expect_error_on_every_rank(p, 3, r"--batch 100 must be divisible by world size 3 x --accum 2 "
                                     r"= 6 \(the nearest that are: 96 or 102\)")
    p = run(3, SMALL + ["--batch", "4", "--accum", "2"])
    expect_error_on_every_rank(p, 3, r"--batch 4 must be divisible by world size 3 x --accum 2 "
                                     r"= 6 \(the nearest that are: 6\)")

elif CHECK == "accuracy":
    p = run_ok(2, ["--epochs", "3", "--batch", "256", "--lr", "0.1", "--seed", "1"])
    m = re.search(r"^final test accuracy: ([0-9.]+)%", p.stdout, re.M)
    if not m:
        fail("no 'final test accuracy' line")
    if not float(m.group(1)) >= 85.0:
        fail(f"test accuracy {m.group(1)}% < 85%")
    print(f"OK: test accuracy {m.group(1)}%")

else:
    fail(f"unknown check {CHECK!r}")
