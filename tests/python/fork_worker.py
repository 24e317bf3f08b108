"""One rank of a 2-rank training loop whose DataLoader forks workers:
`fork_worker.py RANK SIZE JOB_ID REPORT_FILE`.

Started by test_fork.py. Trains a small model on a DataLoader with
num_workers=2 (forked, persistent), averaging gradients with shmring; each
worker first checks that the communicator it inherited refuses to run a
collective. After 10 steps the rank writes "ready" to REPORT_FILE; the test
then SIGKILLs rank 1, and the survivor writes the error it got and when
(time.monotonic(), comparable across processes).
"""

import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import shmring

rank, size, job_id, report = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
comm = shmring.Communicator(rank=rank, world_size=size, job_id=job_id, timeout=20)


def note(line):
    with open(report, "a") as f:
        f.write(line + "\n")


class Points(Dataset):
    """y = 3x + 1 with distinct x per rank and index."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.tensor([float(i + 100 * rank)]) / 100.0
        return x, 3 * x + 1


def worker_init(worker_id):
    # A forked worker holds a copy of the communicator: it must refuse.
    try:
        comm.barrier()
    except shmring.InvalidArgumentError as e:
        if "a forked child must create its own" not in str(e):
            raise
    else:
        raise AssertionError("a forked worker ran a collective on its parent's communicator")


loader = DataLoader(Points(), batch_size=8, shuffle=True, num_workers=2, persistent_workers=True,
                    worker_init_fn=worker_init)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
try:
    while True:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            for p in model.parameters():
                g = p.grad.numpy()
                comm.allreduce(g, op=shmring.ReduceOp.AVG)
            opt.step()
            step += 1
            if step == 10:
                note(f"ready {os.getpid()} " + " ".join(str(w.pid) for w in loader._iterator._workers))
except shmring.Error as e:
    t = time.monotonic()
    note(f"error {type(e).__name__} {t!r} {e}")
del loader  # ends the workers
