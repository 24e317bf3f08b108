"""A torchrun job whose rank 2 stalls before its 1001st all_reduce
(tests/torch/test_diagnosis.py).

    stall_worker.py OUTDIR

Every rank does 1000 all_reduces of 10000 float32, then the 1001st; rank 2
first writes OUTDIR/stalling (with the job id), sleeps STALL_SECONDS (the
test runs `shmrun --status` meanwhile) and only then calls it. Each rank
writes its error (or "no error") to OUTDIR/rank<R>.txt.
"""

import datetime
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

import shmring.torch  # noqa: F401  (registers the backend)

out = pathlib.Path(sys.argv[1])
dist.init_process_group("shmring", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
job = dist.distributed_c10d._get_default_group().job_id
t = torch.ones(10000)
for _ in range(1000):
    dist.all_reduce(t)
    t.fill_(1.0)
if rank == 2:
    (out / "stalling").write_text(job)
    time.sleep(float(os.environ.get("STALL_SECONDS", "12")))
try:
    dist.all_reduce(t)
    (out / f"rank{rank}.txt").write_text("no error")
except RuntimeError as e:
    (out / f"rank{rank}.txt").write_text(str(e))
# destroy_process_group would wait on the broken group's peers: leave.
os._exit(0)
