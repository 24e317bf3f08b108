"""Single-process checks of the bindings: types, buffers, errors, lifetime.

A one-rank communicator makes allreduce the identity, which is enough to
check how buffers are taken; values across ranks are test_multi_rank.py's.
"""

import array

import numpy as np
import pytest

import shmring

try:
    import torch
except ImportError:  # python3-torch is optional: the numpy half still runs.
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


@pytest.fixture
def comm(job_id):
    with shmring.Communicator(rank=0, size=1, job_id=job_id) as c:
        yield c


def test_stats_count_calls_and_bytes(comm):
    """stats() counts each kind's calls and bytes (world size 1)."""
    assert comm.stats() == {}
    x = np.arange(10, dtype=np.float32)
    for _ in range(3):
        comm.allreduce(x)
    st = comm.stats()
    assert list(st) == ["allreduce"]
    assert st["allreduce"]["calls"] == 3
    assert st["allreduce"]["bytes"] == 3 * 40
    assert 0 <= st["allreduce"]["wait_ns"] <= st["allreduce"]["time_ns"]


NUMPY_TYPES = {
    np.float32: shmring.DataType.FLOAT32,
    np.float64: shmring.DataType.FLOAT64,
    np.float16: shmring.DataType.FLOAT16,
    np.int8: shmring.DataType.INT8,
    np.uint8: shmring.DataType.UINT8,
    np.int32: shmring.DataType.INT32,
    np.int64: shmring.DataType.INT64,
}
TORCH_TYPES = {} if torch is None else {
    torch.float32: shmring.DataType.FLOAT32,
    torch.float64: shmring.DataType.FLOAT64,
    torch.float16: shmring.DataType.FLOAT16,
    torch.bfloat16: shmring.DataType.BFLOAT16,
    torch.int8: shmring.DataType.INT8,
    torch.uint8: shmring.DataType.UINT8,
    torch.int32: shmring.DataType.INT32,
    torch.int64: shmring.DataType.INT64,
}


def test_module_surface():
    """The module exposes the communicator, enums, errors and a version."""
    assert shmring.__version__.count(".") == 2
    assert [m.name for m in shmring.ReduceOp.__members__.values()] == \
        ["SUM", "PROD", "MIN", "MAX", "AVG"]
    assert len(shmring.DataType.__members__) == 8
    assert shmring.datatype_size(shmring.DataType.BFLOAT16) == 2


@pytest.mark.parametrize("dtype", list(NUMPY_TYPES), ids=lambda t: np.dtype(t).name)
def test_numpy_datatypes(comm, dtype):
    """Every supported numpy dtype maps to its DataType and reduces in place."""
    assert shmring.datatype_of(np.zeros(3, dtype)) == NUMPY_TYPES[dtype]
    a = np.arange(17, dtype=dtype)
    address = a.ctypes.data
    assert comm.allreduce(a, shmring.ReduceOp.MAX) is a
    assert a.ctypes.data == address
    assert np.array_equal(a, np.arange(17, dtype=dtype))


@needs_torch
@pytest.mark.parametrize("dtype", list(TORCH_TYPES), ids=str)
def test_torch_datatypes(comm, dtype):
    """Every supported torch dtype (bfloat16 and float16 included) maps through DLPack."""
    t = torch.arange(17).to(dtype)
    assert shmring.datatype_of(t) == TORCH_TYPES[dtype]
    ptr = t.data_ptr()
    assert comm.allreduce(t) is t
    assert t.data_ptr() == ptr
    assert torch.equal(t, torch.arange(17).to(dtype))


@needs_torch
def test_torch_after_allreduce_is_usable(comm):
    """The DLPack export is released: the tensor stays usable and resizable."""
    t = torch.ones(10)
    for _ in range(3):
        comm.allreduce(t)
    t.resize_(20)  # Would fail while an export still held the storage's view.
    assert t.shape == (20,)


def test_non_contiguous_is_value_error(comm):
    """A strided buffer is refused with ValueError, never copied."""
    a = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match="not C-contiguous"):
        comm.allreduce(a[:, 1])
    if torch is None:
        return
    with pytest.raises(shmring.InvalidArgumentError, match="not contiguous"):
        comm.allreduce(torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match="not contiguous"):
        comm.allreduce(torch.zeros(10)[::2])
    # Size-1 dimensions may carry any stride and are still contiguous.
    comm.allreduce(torch.zeros(4, 4)[1:2].t())  # Shape (4, 1), strides (1, 4).


def test_read_only_is_value_error(comm):
    """A read-only buffer is refused for an in-place collective."""
    a = np.ones(8, np.float32)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="the ndarray is read-only"):
        comm.allreduce(a)
    with pytest.raises(ValueError, match="the bytes object is read-only"):
        comm.allreduce(b"abcd")
    # As the input of an out-of-place allreduce it is fine.
    out = np.zeros(8, np.float32)
    comm.allreduce(a, out=out)
    assert np.array_equal(out, a)


@pytest.mark.parametrize("bad", [
    np.zeros(3, np.int16), np.zeros(3, np.uint32), np.zeros(3, bool), np.zeros(3, np.complex64),
    np.zeros(3, ">f4"),
], ids=["int16", "uint32", "bool", "complex64", "big-endian"])
def test_unsupported_numpy_dtype(comm, bad):
    # Named as numpy names it (int16, >f4), then what is expected.
    with pytest.raises(ValueError, match=rf"has dtype {bad.dtype} \(element format .*expected "
                                         r"float32"):
        comm.allreduce(bad)


def test_unsupported_buffers_are_named_in_shmrings_words(comm):
    # numpy cannot export datetime64 through the buffer protocol: its reason
    # comes inside shmring's error (a rank, what is expected), not bare.
    with pytest.raises(shmring.InvalidArgumentError,
                       match=r"rank 0: .*ndarray with dtype datetime64\[s\] cannot be read .*"
                             r"cannot include dtype 'M'.*expected float32"):
        comm.allreduce(np.zeros(3, "datetime64[s]"))
    # An object without a dtype is described by its format alone.
    with pytest.raises(shmring.InvalidArgumentError,
                       match=r"the array has elements of format 'h' \(2 bytes\); expected"):
        comm.allreduce(array.array("h", [1, 2]))
    comm.allreduce(np.ones(2, np.float32))  # still usable


@needs_torch
def test_unsupported_objects(comm):
    with pytest.raises(ValueError, match="neither the buffer protocol nor __dlpack__"):
        comm.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="DLPack"):
        comm.allreduce(torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="require gradient"):
        comm.allreduce(torch.zeros(3, requires_grad=True))
    # The tensor's own dtype name, not only DLPack's code.
    with pytest.raises(ValueError, match=r"has dtype torch\.int16 \(DLPack code 0, bits 16"):
        comm.allreduce(torch.zeros(3, dtype=torch.int16))
    # A negative view stores -x: reducing its memory would give max(-x).
    neg = torch._neg_view(torch.arange(4.0))
    with pytest.raises(ValueError, match=r"negative view .*resolve_neg\(\)"):
        comm.allreduce(neg, shmring.ReduceOp.MAX)
    fixed = neg.resolve_neg()
    comm.allreduce(fixed, shmring.ReduceOp.MAX)
    assert fixed.tolist() == [-0.0, -1.0, -2.0, -3.0]


def test_out_must_match(comm):
    with pytest.raises(ValueError, match="must match"):
        comm.allreduce(np.zeros(4, np.float32), out=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="must match"):
        comm.allreduce(np.zeros(4, np.float32), out=np.zeros(4, np.float64))


def test_error_mapping_from_core(comm):
    """Errors raised by the C++ core arrive as the matching Python class."""
    with pytest.raises(shmring.InvalidArgumentError, match="avg") as info:
        comm.allreduce(np.zeros(4, np.int32), shmring.ReduceOp.AVG)
    assert info.value.code == shmring.ErrorCode.INVALID_ARGUMENT
    assert isinstance(info.value, ValueError) and isinstance(info.value, shmring.Error)


def test_exception_hierarchy():
    E = shmring
    assert issubclass(E.Error, RuntimeError)
    for cls in [E.InvalidArgumentError, E.MismatchError, E.TimeoutError, E.PeerFailureError,
                E.AbortedError, E.SystemError, E.OutOfSharedMemoryError, E.InternalError]:
        assert issubclass(cls, E.Error), cls
    assert issubclass(E.InvalidArgumentError, ValueError)
    assert issubclass(E.TimeoutError, TimeoutError)
    assert issubclass(E.SystemError, OSError)
    assert issubclass(E.PeerFailureError, ConnectionError)
    assert issubclass(E.OutOfSharedMemoryError, MemoryError)


@pytest.mark.parametrize("kwargs, message", [
    (dict(rank=3, size=2), "rank"),
    (dict(rank=0, size=0), "size"),
    (dict(rank=0, size=1, job_id="bad id!"), r"job id 'bad id!' \(job_id\)"),
    (dict(rank=0, size=1, job_id=""), r"job id '' \(job_id\): expected 1 to 64 characters"),
    (dict(rank=0, size=1, slots=1), r"\bslots=1: expected"),
    (dict(rank=0, size=1, slot_bytes=1000), r"\bslot_bytes=1000: expected a multiple of 4096"),
    # Values that used to fall back to a default silently, or name -1 for
    # an argument never given. The messages name the keywords, not the C++
    # fields behind them (Options::timeout_s).
    (dict(rank=0, size=1, timeout=-1), r"\btimeout=-1: expected seconds"),
    (dict(rank=0, size=1, timeout=float("nan")), r"\btimeout=nan: expected seconds"),
    (dict(rank=0, size=1, threads=-2), r"\bthreads=-2: expected"),
    (dict(rank=0), r"rank=0 given but no world_size"),
    (dict(size=2), r"world_size=2 given but no rank"),
    # -1 is Options' "not given": written by the caller, it is named, not
    # read as a missing rank (or the environment's slots).
    (dict(rank=-1, size=1), r"\brank=-1: expected"),
    (dict(rank=-5, size=2), r"\brank=-5: expected an integer in \[0, 2\)"),
    (dict(rank=0, size=-1), r"\bworld_size=-1: expected"),
    (dict(rank=0, size=1, slots=-1), r"\bslots=-1: expected"),
    (dict(rank=0, size=1, slots=0), r"\bslots=0: expected"),
    (dict(rank=0, size=1, slot_bytes=0), r"\bslot_bytes=0: expected"),
    # Explicit local values are checked as the launchers' variables are.
    (dict(rank=0, size=1, local_rank=5), r"\blocal_rank=5: expected an integer in \[0, 1\)"),
    (dict(rank=0, size=1, local_rank=-1), r"\blocal_rank=-1: expected"),
    (dict(rank=0, size=1, local_world_size=3), r"\blocal_world_size=3: expected"),
    (dict(rank=1, size=2, local_world_size=1), r"local_world_size=1 given but no local_rank"),
])
def test_bad_constructor_arguments(job_id, kwargs, message):
    kwargs.setdefault("job_id", job_id)
    with pytest.raises(shmring.InvalidArgumentError, match=message) as info:
        shmring.Communicator(**kwargs)
    assert info.value.code == shmring.ErrorCode.INVALID_ARGUMENT
    assert "Options::" not in str(info.value)
    # Python refuses -1 (above): no message may offer it.
    assert "or -1" not in str(info.value)


def test_properties_and_close(job_id):
    c = shmring.Communicator(rank=0, size=1, job_id=job_id, timeout=5)
    assert (c.rank, c.size, c.local_rank, c.local_size) == (0, 1, 0, 1)
    assert c.config["job_id"] == job_id and c.config["timeout_s"] == 5
    # A ring step moves a whole slot, or at most 64 KiB where oversubscribed.
    slot = c.config["slot_bytes"]
    assert c.config["slice_bytes"] == (min(slot, 65536) if c.config["oversubscribed"] else slot)
    assert job_id in repr(c)
    before = c.collective_count
    c.allreduce(np.zeros(2, np.float32))
    assert c.collective_count == before + 1
    c.close()
    assert c.closed and "closed" in repr(c)
    with pytest.raises(ValueError, match="closed"):
        c.allreduce(np.zeros(2, np.float32))
    c.close()  # Idempotent.


def test_abort_breaks_the_communicator(comm):
    comm.abort("stop requested by the test")
    with pytest.raises(shmring.AbortedError, match="stop requested by the test"):
        comm.allreduce(np.zeros(2, np.float32))


def test_environment_constructor(monkeypatch, job_id):
    """Communicator() reads shmrun's variables."""
    monkeypatch.setenv("SHMRING_RANK", "0")
    monkeypatch.setenv("SHMRING_WORLD_SIZE", "1")
    monkeypatch.setenv("SHMRING_JOB_ID", job_id)
    with shmring.Communicator() as c:
        assert (c.rank, c.size, c.config["job_id"]) == (0, 1, job_id)


def test_world_size_is_the_keyword_and_size_its_alias(job_id):
    # world_size= is the C++ name (Options::world_size, WORLD_SIZE); size=
    # stays; giving both with different values is an error.
    with shmring.Communicator(rank=0, world_size=1, job_id=job_id, local_world_size=1) as c:
        assert (c.world_size, c.size, c.local_world_size, c.local_size) == (1, 1, 1, 1)
    with shmring.Communicator(rank=0, world_size=1, size=1, job_id=job_id) as c:
        assert c.world_size == 1
    with pytest.raises(shmring.InvalidArgumentError, match="world_size=2 and size=1"):
        shmring.Communicator(rank=0, world_size=2, size=1, job_id=job_id)


def test_waits_may_spin_follows_the_job(job_id, monkeypatch):
    # Crowding is the job's: a communicator made first stops spinning while
    # this process holds an oversubscribed one, and spins again after.
    monkeypatch.delenv("SHMRING_SPIN_US", raising=False)
    monkeypatch.delenv("SHMRING_OVERSUBSCRIBED", raising=False)
    early = shmring.Communicator(rank=0, size=1, job_id=job_id + "-early", timeout=5)
    if early.config["oversubscribed"] or not early.waits_may_spin:
        early.close()
        pytest.skip("this process's job already crowds its CPUs")
    monkeypatch.setenv("SHMRING_OVERSUBSCRIBED", "1")
    crowded = shmring.Communicator(rank=0, size=1, job_id=job_id + "-crowded", timeout=5)
    assert crowded.config["oversubscribed"] and not crowded.waits_may_spin
    assert not early.waits_may_spin and not early.config["oversubscribed"]
    crowded.close()
    assert early.waits_may_spin
    early.close()
