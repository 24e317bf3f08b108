"""torch.profiler events of the shmring backend (tests/torch/test_diagnosis.py).

    profiler_worker.py SCENARIO RANK SIZE INIT OUTDIR [BACKEND]

Runs all_reduce on a (4, 8) float32 tensor, broadcast on a (3,) bfloat16
tensor and all_gather of (2, 5) tensors under torch.profiler with shapes
recorded, and prints each "<backend>:" event with its input shapes and
datatypes as one JSON line "EVENT {...}".
"""

import datetime
import json
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import shmring.torch  # noqa: F401

_scenario, rank, size, init, _outdir = sys.argv[1:6]
backend = sys.argv[6] if len(sys.argv) > 6 else "shmring"
rank, size = int(rank), int(size)
dist.init_process_group(backend, init_method=init, rank=rank, world_size=size,
                        timeout=datetime.timedelta(seconds=60))
job = getattr(dist.distributed_c10d._get_default_group(), "job_id", None)
if job:
    print("JOB_ID", job, flush=True)
a = torch.ones(4, 8)
b = torch.zeros(3, dtype=torch.bfloat16)
g = [torch.empty(2, 5) for _ in range(size)]
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    dist.all_reduce(a)
    dist.broadcast(b, src=0)
    dist.all_gather(g, torch.full((2, 5), float(rank)))
assert a[0, 0].item() == size
for e in prof.events():
    if e.name.startswith(backend + ":"):
        print("EVENT", json.dumps({"name": e.name, "shapes": e.input_shapes}), flush=True)
dist.destroy_process_group()
print("profiler ok", flush=True)
