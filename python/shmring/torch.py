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
on one host never meet whatever their MASTER_PORT.

A group may span several hosts (docs/guide/torch-multi-node.md): its ranks
group by host identity (hostname and boot id, published through the store),
each host's ranks form a shmring communicator, and torch's gloo runs between
the hosts (allreduce hierarchically: reduce in the host, allreduce among the
hosts' first ranks, broadcast in the host; float16 and bfloat16 reduce in
float32 and round once). A group on one host creates no gloo at all.

Supported: all_reduce (SUM, PRODUCT, MIN, MAX, AVG), all_reduce_coalesced,
broadcast, all_gather, _all_gather_base / all_gather_into_tensor,
reduce_scatter, _reduce_scatter_base / reduce_scatter_tensor, reduce,
barrier, all_to_all_single (even, or with split sizes), all_to_all, gather,
scatter, and all_gather / reduce_scatter with uneven sizes, on CPU tensors of
float32, float64, float16, bfloat16, int8, uint8, int32 and int64 (the
collectives that only move data move any dtype), and point-to-point send,
recv, isend, irecv and batch_isend_irecv (any dtype; a recv must name its
source). Non-contiguous tensors are staged through a contiguous copy, and a
Work and its future complete once the result is in the caller's tensors.
Anything else (recv from any source, BAND/BOR/BXOR/PREMUL_SUM, CUDA tensors,
several tensors per list) raises RuntimeError naming it.

A group ends when torch says so, not when Python lets go of it: this module
wraps ``torch.distributed.destroy_process_group`` so that a destroyed shmring
group completes its pending collectives, waits (at most 10 s) for the group's
other ranks to destroy it too, and releases its communicator, shared-memory
segment and threads at once, whatever still refers to it (a DDP model, a
saved handle); operations on it afterwards raise RuntimeError. Groups made
later (init_process_group again, new_group) never meet it. A
``destroy_process_group`` imported from torch before this module is torch's
own (torch 1.13's calls no hook of the group): the group then goes when
Python drops its last reference (at once, if nothing else holds it), without
waiting for its peers.

Work objects complete their futures on a thread of the process group's own
(or on the thread in ``Work.wait()``), never on shmring's progress thread, so DDP communication hooks (PowerSGD)
may issue collectives from future callbacks. A failed collective (peer
death, timeout, mismatch) raises RuntimeError with shmring's message on every
rank, and the group refuses every later operation.
"""

import functools
import inspect

import torch as _torch
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


def _shmring_group(pg):
    """The ProcessGroupShmring behind `pg` (torch >= 2 puts a ProcessGroup
    in front of a Backend), or None."""
    if isinstance(pg, ProcessGroupShmring):
        return pg
    get_backend = getattr(pg, "_get_backend", None)
    if get_backend is None:
        return None
    try:
        backend = get_backend(_torch.device("cpu"))
    except RuntimeError:
        return None
    return backend if isinstance(backend, ProcessGroupShmring) else None


def _live_groups():
    """Every group torch holds, in creation order (the same on every rank)."""
    c10d = _dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    return list(world.pg_map if world is not None else c10d._pg_map)


def _wrap_destroy(destroy):
    if getattr(destroy, "_shmring_wrapped", False):
        return destroy

    @functools.wraps(destroy)
    def destroy_process_group(group=None):
        c10d = _dist.distributed_c10d
        everything = group is None or group == c10d.GroupMember.WORLD
        doomed = _live_groups() if everything else [group]
        groups = [g for g in map(_shmring_group, doomed) if g is not None]
        destroy(group)
        # After torch's own teardown (which drops its stores), in creation
        # order: shutdown() waits for the group's peers, so no rank starts
        # its next rendezvous while rank 0 still serves the old store.
        for g in groups:
            g.shutdown()

    destroy_process_group._shmring_wrapped = True
    return destroy_process_group


def _register():
    if BACKEND_NAME.upper() in getattr(_dist.Backend, "_plugins", {}):
        return  # already registered (this module imported under another name)
    kwargs = {}
    # torch >= 2: a backend names the device types it serves.
    if "devices" in inspect.signature(_dist.Backend.register_backend).parameters:
        kwargs["devices"] = ["cpu"]
    _dist.Backend.register_backend(BACKEND_NAME, create_process_group, **kwargs)
    wrapped = _wrap_destroy(_dist.distributed_c10d.destroy_process_group)
    _dist.distributed_c10d.destroy_process_group = wrapped
    _dist.destroy_process_group = wrapped


_register()
