"""shmring as a torch.distributed backend.

    import shmring.torch                      # registers the backend "shmring"
    import torch.distributed as dist
    dist.init_process_group("shmring")        # env:// (torchrun, or shmrun)
    model = torch.nn.parallel.DistributedDataParallel(model)

Importing this module registers ``"shmring"`` with
``torch.distributed.Backend.register_backend``; ``import shmring`` does the
same when torch is already imported. Each process group (the default one and
every ``dist.new_group(ranks)``) is a shmring communicator of its own, whose
job id is a random nonce agreed through the group's c10d store, so two jobs
on one host never meet whatever their MASTER_PORT. Every rank of a group must
be on one host.

Supported: all_reduce (SUM, PRODUCT, MIN, MAX, AVG), all_reduce_coalesced,
broadcast, all_gather, _all_gather_base / all_gather_into_tensor,
reduce_scatter, _reduce_scatter_base / reduce_scatter_tensor, reduce,
barrier, all_to_all_single (even, or with split sizes), all_to_all, gather,
scatter, and all_gather / reduce_scatter with uneven sizes, on CPU tensors of
float32, float64, float16, bfloat16, int8, uint8, int32 and int64 (the
collectives that only move data move any dtype). Non-contiguous tensors are
staged through a contiguous copy. Anything else (send/recv,
BAND/BOR/BXOR/PREMUL_SUM, CUDA tensors, several tensors per list) raises
RuntimeError naming it.

Work objects complete their futures on a thread of the process group's own,
never on shmring's progress thread, so DDP communication hooks (PowerSGD)
may issue collectives from future callbacks. A failed collective (peer
death, timeout, mismatch) raises RuntimeError with shmring's message on every
rank, and the group refuses every later operation.
"""

import inspect

import torch.distributed as _dist

if not _dist.is_available():
    raise ImportError("shmring.torch: this torch was built without torch.distributed")

from ._shmring import __version__  # noqa: E402,F401
from ._torch import ProcessGroupShmring  # noqa: E402

BACKEND_NAME = "shmring"


def create_process_group(store, rank, size, timeout):
    """The creator torch.distributed calls for every process group of
    backend "shmring": `store` is the group's own prefix store, `rank` and
    `size` its rank and size, `timeout` a datetime.timedelta."""
    return ProcessGroupShmring(store, rank, size, timeout)


def _register():
    if BACKEND_NAME.upper() in getattr(_dist.Backend, "_plugins", {}):
        return  # already registered (this module imported under another name)
    kwargs = {}
    # torch >= 2: a backend names the device types it serves.
    if "devices" in inspect.signature(_dist.Backend.register_backend).parameters:
        kwargs["devices"] = ["cpu"]
    _dist.Backend.register_backend(BACKEND_NAME, create_process_group, **kwargs)


_register()
