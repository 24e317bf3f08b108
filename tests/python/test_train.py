"""A 2-rank data-parallel training run of a few steps under shmrun ends with
bitwise identical parameters on both ranks."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

pytest.importorskip("torch")
DATA = pathlib.Path(os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))


@pytest.mark.skipif(not (DATA / "train-images-idx3-ubyte.gz").is_file(),
                    reason=f"Fashion-MNIST not found in {DATA}")
@pytest.mark.skipif(not os.environ.get("SHMRUN"), reason="SHMRUN (the built launcher) not set")
@pytest.mark.parametrize("bucket_mb", [0, 0.25], ids=["flat", "buckets"])
def test_two_rank_training_keeps_parameters_identical(tmp_path, bucket_mb):
    cmd = [os.environ["SHMRUN"], "-n", "2", "--", sys.executable,
           str(REPO / "examples" / "train_torch.py"), "--backend", "shmring", "--max-steps", "6",
           "--batch-size", "64", "--bucket-mb", str(bucket_mb), "--log-every", "2",
           "--data", str(DATA), "--dump-params", str(tmp_path)]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout
    assert "RESULT backend=shmring" in run.stdout, run.stdout
    p0 = np.load(tmp_path / "params_rank0.npy")
    p1 = np.load(tmp_path / "params_rank1.npy")
    assert p0.size > 100_000 and np.isfinite(p0).all()
    assert p0.tobytes() == p1.tobytes(), \
        f"ranks diverged in {np.count_nonzero(p0 != p1)} of {p0.size} parameters"


@pytest.mark.skipif(not (DATA / "train-images-idx3-ubyte.gz").is_file(),
                    reason=f"Fashion-MNIST not found in {DATA}")
@pytest.mark.skipif(not os.environ.get("SHMRUN"), reason="SHMRUN (the built launcher) not set")
def test_both_backends_agree_on_every_step(tmp_path):
    """--backend both reduces each step's gradients with shmring and gloo and
    exits non-zero if the sums differ; the parameters stay identical."""
    pytest.importorskip("torch.distributed")
    cmd = [os.environ["SHMRUN"], "-n", "2", "--", sys.executable,
           str(REPO / "examples" / "train_torch.py"), "--backend", "both", "--max-steps", "6",
           "--warmup", "2", "--batch-size", "64", "--log-every", "2", "--data", str(DATA),
           "--dump-params", str(tmp_path)]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout
    result = next(l for l in run.stdout.splitlines() if l.startswith("RESULT backend=both"))
    fields = dict(kv.split("=") for kv in result.split()[1:])
    assert fields["steps"] == "6"
    assert float(fields["shmring_mean_ms"]) > 0 and float(fields["gloo_mean_ms"]) > 0
    p0 = np.load(tmp_path / "params_rank0.npy")
    p1 = np.load(tmp_path / "params_rank1.npy")
    assert p0.tobytes() == p1.tobytes()
