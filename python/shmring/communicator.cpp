// shmring.Communicator: its methods, their documentation and their Python
// entry points (ranked, ranked_p2p), which turn the bindings' own argument
// errors into errors the peers see at once.

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "bindings.hpp"
#include "signal_reason.hpp"

namespace shmring::python {

// False while a collective's Python entry point (ranked()) runs the bindings'
// own checks; dispatch() sets it when the call goes on to the core (which
// tells the peers of its own refusals). An error raised before is refused
// through Communicator::reject_call, so the peers fail fast too.
thread_local bool t_core_reached = false;

namespace {

// A Python argument of a collective, converted inside ranked() rather than
// by pybind11 before the call, so that a wrong type (op="sum", root=None)
// is refused in call order too. TypeError naming the value.
template <class T>
const char* expected_type() {
  if constexpr (std::is_same_v<T, ReduceOp>) return "a shmring.ReduceOp";
  if constexpr (std::is_same_v<T, bool>) return "a bool";
  return "an int";
}

template <class T>
T from_py(py::object obj, const char* what) {
  if constexpr (std::is_same_v<T, py::object>) {
    return obj;
  } else {
    try {
      if constexpr (!std::is_arithmetic_v<T>)
        // pybind11 casts None to a class type by throwing reference_cast_error,
        // which its dispatcher takes for "try the next overload" (misbound).
        if (obj.is_none()) throw py::cast_error();
      // A bool is an int to Python but never a rank, tag or color (root=True
      // would be root 1), as count lists refuse it.
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        if (py::isinstance<py::bool_>(obj)) throw py::cast_error();
      return obj.cast<T>();
    } catch (const py::cast_error&) {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        if (PyIndex_Check(obj.ptr()) && !py::isinstance<py::bool_>(obj))  // too big for T
          throw InvalidArgumentError(
              fmt::format("{}: an argument is {} {}, out of range (expected {}..{})", what,
                          type_name(obj), py::repr(obj).cast<std::string>(),
                          std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
      throw py::type_error(fmt::format("{}: an argument is {} {}, expected {}", what,
                                       type_name(obj), py::repr(obj).cast<std::string>(),
                                       expected_type<T>()));
    }
  }
}

template <class T>
using PyArg = py::object;

// Tells the peers of a call the bindings refused (Communicator::reject_call,
// which throws), under the one-thread guard: while another thread runs a
// collective on this communicator nothing may be published into its order,
// and the caller hears that instead (Busy throws InvalidArgumentError).
[[noreturn]] void reject_in_order(PyCommunicator& self, const char* what, const std::string& why) {
  PyCommunicator::Busy busy(self, what);
  self.get().reject_call(what, why);
}

// A collective's Python entry point. The bindings' own argument errors
// (buffer conversions, shapes) happen before the core sees the call: they
// are told to the peers in call order (Communicator::reject_call), so the
// peers' matching call fails at once with MismatchError naming this rank
// instead of waiting until SHMRING_TIMEOUT; here they raise
// InvalidArgumentError starting with the rank, like the core's. A Python
// error raised by the buffer's own export (BufferError...) or by an
// argument's conversion (TypeError: every argument arrives as an object and
// is converted here) is told to the peers the same way and raised as it was.
// Collectives only: a point-to-point call (send/recv) is not in the
// collective order, and publishing its refusal would shift this rank's.
template <class... A>
auto ranked(const char* what, py::object (*f)(PyCommunicator&, A...)) {
  return [what, f](PyCommunicator& self, PyArg<A>... args) -> py::object {
    t_core_reached = false;
    try {
      return f(self, from_py<A>(std::move(args), what)...);
    } catch (const InvalidArgumentError& e) {
      std::string m = e.what();
      if (!t_core_reached && !self.closed()) {
        const std::string prefix = std::string(what) + ": ";
        if (m.rfind(prefix, 0) == 0) m.erase(0, prefix.size());
        reject_in_order(self, what, m);
      }
      // Closed, the refusal is raised as the core's would be: rank first.
      if (m.rfind("rank ", 0) == 0) throw;
      throw InvalidArgumentError(fmt::format("rank {}: {}", self.rank(), m));
    } catch (const py::type_error& e) {
      // An argument of the wrong type (from_py): told to the peers without
      // repeating the collective's name, raised with the rank first.
      if (t_core_reached || self.closed()) throw;
      std::string m = e.what();
      const std::string prefix = std::string(what) + ": ";
      if (m.rfind(prefix, 0) == 0) m.erase(0, prefix.size());
      try {
        reject_in_order(self, what, m);
      } catch (const Error&) {
        // Published (or the communicator is broken and the peers know).
      }
      throw py::type_error(fmt::format("rank {}: {}: {}", self.rank(), what, m));
    } catch (...) {
      if (t_core_reached || self.closed()) throw;
      std::string why = "refused by the Python bindings";
      try {
        throw;
      } catch (py::error_already_set& e) {
        why = e.what();
      } catch (const std::exception& e) {
        if (*e.what() != '\0') why = e.what();
      } catch (...) {
      }
      try {
        reject_in_order(self, what, why);
      } catch (const Error&) {
        // Published (or the communicator is broken and the peers know):
        // the caller gets the original error, which says most.
      }
      try {
        throw;
      } catch (const py::reference_cast_error& e) {
        // Published once: pybind11 must not go on to the next overload.
        throw py::type_error(why);
      }
    }
  };
}

// A point-to-point call's Python entry point: errors start with the rank
// like the core's, and nothing is published (send/recv are not in the
// collective order, so a refusal there concerns this rank and its peer only).
template <class... A>
auto ranked_p2p(py::object (*f)(PyCommunicator&, A...)) {
  return [f](PyCommunicator& self, A... args) -> py::object {
    try {
      return f(self, std::move(args)...);
    } catch (const InvalidArgumentError& e) {
      std::string m = e.what();
      if (m.rfind("rank ", 0) == 0 || self.closed()) throw;
      throw InvalidArgumentError(fmt::format("rank {}: {}", self.get().rank(), m));
    }
  };
}

// Each collective's last overload: pybind11 reaches it only when it could not
// bind the call's arguments to the first one (an unknown keyword, one too
// many or missing). Such a call is refused in call order like the bindings'
// own checks (ranked()), so the peers' matching call fails at once instead
// of waiting until SHMRING_TIMEOUT; here it raises TypeError naming what it
// got and the signature.
struct Signature {
  const char* name;
  const char* params;
};

constexpr Signature kSignatures[] = {
    {"allreduce", "buffer, op=ReduceOp.SUM, *, out=None, async_op=False"},
    {"reduce_scatter", "send, out, op=ReduceOp.SUM, *, async_op=False"},
    {"allgather", "send, out, *, async_op=False"},
    {"broadcast", "buffer, root=0, *, async_op=False"},
    {"reduce", "buffer, op=ReduceOp.SUM, root=0, *, out=None, async_op=False"},
    {"alltoall", "send, out, *, async_op=False"},
    {"alltoallv",
     "send, send_counts, out, recv_counts, send_displs=None, recv_displs=None, *, async_op=False"},
    {"gather", "send, out=None, root=0, *, async_op=False"},
    {"scatter", "send, out, root=0, *, async_op=False"},
    {"allgatherv", "send, out, recv_counts, displs=None, *, async_op=False"},
    {"reduce_scatter_v", "send, out, recv_counts, op=ReduceOp.SUM, *, async_op=False"},
    {"barrier", "*, async_op=False"},
    {"finalize", "*, async_op=False"},
    {"split", "color, key=0"},
};

auto misbound(Signature sig) {
  return [sig](PyCommunicator& self, const py::args& args, const py::kwargs& kwargs) {
    std::string got;
    for (py::handle a : args) got += fmt::format("{}{}", got.empty() ? "" : ", ", type_name(a));
    for (auto [key, value] : kwargs)
      got += fmt::format("{}{}={}", got.empty() ? "" : ", ", py::str(key).cast<std::string>(),
                         type_name(value));
    const std::string why = fmt::format("{}() takes ({}), not ({})", sig.name, sig.params, got);
    if (!self.closed()) {
      try {
        reject_in_order(self, sig.name, why);
      } catch (const Error&) {
        // Published (or the communicator is broken and the peers know).
      }
    }
    throw py::type_error(fmt::format("rank {}: {}", self.rank(), why));
  };
}

// Runs one collective with the GIL released, holding the one-thread guard.
template <class F>
void run_collective(PyCommunicator& self, const char* what, F&& f) {
  Communicator& comm = self.get();
  PyCommunicator::Busy busy(self, what);
  run_interruptible([&] { f(comm); });
}

// split as a collective entry point (ranked()): a color or key of the wrong
// type or out of int's range is refused in call order, as a root is.
py::object split(PyCommunicator& self, int color, int key) {
  t_core_reached = true;  // the core checks the color and tells the peers
  std::unique_ptr<PyCommunicator> result;
  run_collective(self, "split", [&](Communicator& c) {
    result = std::make_unique<PyCommunicator>(c.split(color, key));
  });
  return py::cast(std::move(result));
}

py::dict config_dict(const Config& c) {
  py::dict d;
  d["rank"] = c.rank;
  d["world_size"] = c.world_size;
  d["local_rank"] = c.local_rank;
  d["local_world_size"] = c.local_world_size;
  d["job_id"] = c.job_id;
  d["slots"] = c.slots;
  d["slot_bytes"] = c.slot_bytes;
  d["slice_bytes"] = c.slice_bytes;
  d["threads"] = c.threads;
  d["timeout_s"] = c.timeout_s;
  d["spin_us"] = c.spin_us;
  d["yield_us"] = c.yield_us;
  d["direct_bytes"] = c.direct_bytes;
  d["algorithm"] = c.algorithm;
  d["nt_stores"] = c.nt_stores == NtStores::automatic ? "auto"
                   : c.nt_stores == NtStores::always  ? "1"
                                                      : "0";
  d["job_cpus"] = c.job_cpus;
  d["oversubscribed"] = c.oversubscribed;
  d["asymmetric_fence"] = c.asymmetric_fence;
  d["segment_name"] = c.segment_name;
  d["segment_bytes"] = c.segment_bytes;
  d["progress_cpu"] = c.progress_cpu;
  return d;
}

// `message` with the core's Options field names (Options::timeout_s=...)
// replaced by the Communicator keywords that set them (timeout=...).
std::string keyword_names(std::string message) {
  static const std::pair<std::string_view, std::string_view> kNames[] = {
      {"Options::timeout_s=", "timeout="},
      {"Options::slot_bytes=", "slot_bytes="},
      {"Options::slots=", "slots="},
      {"Options::threads=", "threads="},
      {"Options::job_id", "job_id"},
      // Options' -1 is "not given", which Python spells None (-1 is refused).
      {"or -1 for world_size", "or None (the default) for world_size"},
      {"or -1 for rank", "or None (the default) for rank"}};
  for (const auto& [field, keyword] : kNames)
    for (auto at = message.find(field); at != std::string::npos; at = message.find(field, at))
      message.replace(at, field.size(), keyword);
  return message;
}

}  // namespace

std::string python_signals_raised() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return {};
  return signal_reason();
}

void bind_communicator(py::module_& m) {
  py::class_<PyCommunicator>(m, "Communicator", R"doc(
A group of world-size processes on this host running collectives over one
shared-memory segment.

Communicator() takes rank, world size and job id from the environment
(shmrun's SHMRING_*, torchrun's RANK/WORLD_SIZE, Open MPI, MPICH, Slurm).
Keyword arguments override single settings: rank=, world_size= (alias size=),
job_id=, local_rank=, local_world_size= (alias local_size=), slots=,
slot_bytes=, threads=, timeout= (seconds). Construction blocks until every rank has
attached (or the timeout passes).

Collective-call rules: every rank calls the same collectives in the same
order with the same count, datatype and operator; a disagreement raises
MismatchError on every rank. After any error the communicator is broken and
every later call raises AbortedError. One thread at a time per Communicator.
A collective refused by one rank's argument checks (a buffer of the wrong
dtype, size or layout) raises InvalidArgumentError there and, at once,
MismatchError naming that rank and its reason on the others, never a wait
until the timeout; refused alike on every rank, the communicator stays usable.
)doc")
      .def(py::init([](std::optional<int> rank, std::optional<int> size,
                       std::optional<std::string> job_id, std::optional<int> local_rank,
                       std::optional<int> local_size, std::optional<long long> slots,
                       std::optional<long long> slot_bytes, std::optional<int> threads,
                       std::optional<double> timeout, std::optional<int> world_size,
                       std::optional<int> local_world_size) {
             // world_size= is C++'s name (Options::world_size, WORLD_SIZE);
             // size= stays as its alias, like local_size= for local_world_size=.
             auto one_of = [](const char* a, std::optional<int> x, const char* b,
                              std::optional<int> y) {
               if (x && y && *x != *y)
                 throw InvalidArgumentError(
                     fmt::format("{}={} and {}={}: the same setting twice, with different values; "
                                 "give one",
                                 a, *x, b, *y));
               return x ? x : y;
             };
             size = one_of("world_size", world_size, "size", size);
             local_size = one_of("local_world_size", local_world_size, "local_size", local_size);
             // -1 (and 0 for slots, slot_bytes) is what Options reads as "not
             // given": a caller who wrote it gets an error naming it, not the
             // environment's value or a message about another argument.
             // `given_bad`: the keyword was given and its value is one of those.
             auto refuse = [](const char* name, auto value, bool given_bad, const char* expected) {
               if (given_bad)
                 throw InvalidArgumentError(
                     fmt::format("{}={}: expected {}", name, *value, expected));
             };
             refuse("rank", rank, rank == -1, "an integer in [0, world_size)");
             refuse("world_size", size, size == -1, "an integer >= 1");
             refuse("local_rank", local_rank, local_rank == -1,
                    "an integer in [0, local_world_size)");
             refuse("local_world_size", local_size, local_size == -1,
                    "an integer in [1, world_size]");
             // "" is Options' "not given" too: written, it is a bad job id.
             if (job_id && job_id->empty())
               throw InvalidArgumentError(
                   "job id '' (job_id): expected 1 to 64 characters from [A-Za-z0-9._-], or "
                   "None (the default) for SHMRING_JOB_ID");
             refuse("slots", slots, slots && *slots <= 0, "an integer >= 2");
             refuse("slot_bytes", slot_bytes, slot_bytes && *slot_bytes <= 0,
                    "a multiple of 4096 in [4096, 2^30]");
             Options o;
             o.rank = rank.value_or(-1);
             o.world_size = size.value_or(-1);
             o.job_id = job_id.value_or("");
             o.local_rank = local_rank.value_or(-1);
             o.local_world_size = local_size.value_or(-1);
             o.slots = static_cast<std::size_t>(slots.value_or(0));
             o.slot_bytes = static_cast<std::size_t>(slot_bytes.value_or(0));
             o.threads = threads.value_or(0);
             o.timeout_s = timeout.value_or(0);
             // Attaching waits for every rank: let other threads run meanwhile
             // (only around the C++ constructor; pybind11 registers the new
             // instance with the GIL held).
             std::unique_ptr<PyCommunicator> comm;
             try {
               py::gil_scoped_release release;
               comm = std::make_unique<PyCommunicator>(o);
             } catch (const InvalidArgumentError& e) {
               // The core names the C++ fields (Options::timeout_s=-1):
               // name the keywords this caller wrote instead.
               throw InvalidArgumentError(keyword_names(e.what()));
             }
             return comm;
           }),
           py::kw_only(), py::arg("rank") = py::none(), py::arg("size") = py::none(),
           py::arg("job_id") = py::none(), py::arg("local_rank") = py::none(),
           py::arg("local_size") = py::none(), py::arg("slots") = py::none(),
           py::arg("slot_bytes") = py::none(), py::arg("threads") = py::none(),
           py::arg("timeout") = py::none(), py::arg("world_size") = py::none(),
           py::arg("local_world_size") = py::none())
      .def_property_readonly(
          "rank", [](PyCommunicator& c) { return c.get().rank(); },
          "This process's rank, 0..size-1.")
      .def_property_readonly(
          "size", [](PyCommunicator& c) { return c.get().size(); }, "Number of ranks.")
      .def(
          "stats",
          [](PyCommunicator& c) {
            py::dict out;
            for (const auto& s : c.get().stats()) {
              py::dict d;
              d["calls"] = s.calls;
              d["bytes"] = s.bytes;
              d["time_ns"] = s.time_ns;
              d["wait_ns"] = s.wait_ns;
              out[py::str(s.collective)] = d;
            }
            return out;
          },
          "This rank's counters per collective kind called so far: {kind: {calls, bytes, "
          "time_ns, wait_ns}} (Communicator::stats() in shmring/communicator.hpp).")
      .def_property_readonly(
          "world_size", [](PyCommunicator& c) { return c.get().size(); },
          "Number of ranks (the same as size).")
      .def_property_readonly(
          "local_world_size", [](PyCommunicator& c) { return c.get().local_size(); },
          "Ranks of this job on this host (the same as local_size).")
      .def_property_readonly(
          "local_rank", [](PyCommunicator& c) { return c.get().local_rank(); },
          "This process's rank among the job's ranks on this host.")
      .def_property_readonly(
          "local_size", [](PyCommunicator& c) { return c.get().local_size(); },
          "Ranks of this job on this host.")
      .def_property_readonly(
          "config", [](PyCommunicator& c) { return config_dict(c.get().config()); },
          "Settings in force (explicit, environment, defaults) as a dict.")
      .def_property_readonly(
          "waits_may_spin", [](PyCommunicator& c) { return c.get().waits_may_spin(); },
          "Whether this rank's waits may spin now: False where the job crowds the machine "
          "(config['oversubscribed'], or another oversubscribed communicator of this process).")
      .def_property_readonly(
          "collective_count", [](PyCommunicator& c) { return c.get().collective_count(); },
          "Collectives this rank has completed (the sequence number of its next one): "
          "non-blocking ones still queued or running are not counted; a call it refused with "
          "InvalidArgumentError is, a call that failed otherwise is not.")
      .def_property_readonly("closed", &PyCommunicator::closed)
      .def("allreduce", ranked("allreduce", &allreduce), py::arg("buffer"),
           py::arg("op") = ReduceOp::sum, py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, R"doc(
Allreduce: every rank ends with op over all ranks of `buffer`, element-wise.

buffer: a C-contiguous numpy array, torch CPU tensor (through __dlpack__) or
other buffer of float32, float64, float16, bfloat16, int8, uint8, int32 or
int64. Without `out` it is reduced in place and must be writable; with `out`
(same datatype and element count, writable) the result goes there and
`buffer` is only read. No copy is ever made: a non-contiguous or read-only
buffer raises InvalidArgumentError (a ValueError). Returns the buffer that
holds the result. Releases the GIL while it runs.
Raises InvalidArgumentError, MismatchError, TimeoutError, PeerFailureError,
AbortedError.

async_op=True (every collective has it): starts the collective on the
communicator's progress thread and returns a shmring.Request at once;
argument errors still raise here, the others from Request.wait(). Until the
request is complete, do not read or write the buffers (they are kept alive
by the request).
)doc")
      .def("reduce_scatter", ranked("reduce_scatter", &reduce_scatter), py::arg("send"),
           py::arg("out"), py::arg("op") = ReduceOp::sum, py::kw_only(),
           py::arg("async_op") = false, R"doc(
Reduce-scatter: rank r's `out` (k elements) receives op over ranks of
send[r*k:(r+1)*k]; `send` holds size*k elements. In place when `out` is that
slice of `send` (e.g. out = send[rank*k:(rank+1)*k]). Returns `out`.
)doc")
      .def("allgather", ranked("allgather", &allgather), py::arg("send"), py::arg("out"),
           py::kw_only(), py::arg("async_op") = false, R"doc(
Allgather: `out` (size*k elements) receives every rank's `send` (k elements)
in rank order. In place when `send` is out[rank*k:(rank+1)*k]. Returns `out`.
)doc")
      .def("broadcast", ranked("broadcast", &broadcast), py::arg("buffer"), py::arg("root") = 0,
           py::kw_only(), py::arg("async_op") = false, R"doc(
Broadcast: every rank's `buffer` receives root's, in place (the root's may be
read-only). Returns `buffer`.
)doc")
      .def("reduce", ranked("reduce", &reduce), py::arg("buffer"), py::arg("op") = ReduceOp::sum,
           py::arg("root") = 0, py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, R"doc(
Reduce: the root receives op over ranks of `buffer`, in place (or into `out`,
used at the root only); the other ranks' buffers are only read. Returns the
buffer that holds the result at the root.
)doc")
      .def("alltoall", ranked("alltoall", &alltoall), py::arg("send"), py::arg("out"),
           py::kw_only(), py::arg("async_op") = false, R"doc(
Alltoall: block j of this rank's `send` goes to block rank of rank j's `out`.
`send` and `out` hold size*k elements each (same datatype) and must not
overlap (no in-place form). Returns `out`.
)doc")
      .def("alltoallv", ranked("alltoallv", &alltoallv), py::arg("send"), py::arg("send_counts"),
           py::arg("out"), py::arg("recv_counts"), py::arg("send_displs") = py::none(),
           py::arg("recv_displs") = py::none(), py::kw_only(), py::arg("async_op") = false,
           R"doc(
Alltoallv (MPI_Alltoallv): send_counts[j] elements of `send` starting at
send_displs[j] go to rank j, which receives them in its `out` at
recv_displs[rank]. Counts and displacements are sequences of `size` ints, in
elements; displacements default to the blocks packed in rank order. Rank i's
recv_counts[j] must equal rank j's send_counts[i] (else MismatchError on
every rank). Receive blocks must not overlap each other nor `send`; a block
outside its buffer raises InvalidArgumentError. Returns `out`.
)doc")
      .def("gather", ranked("gather", &gather), py::arg("send"), py::arg("out") = py::none(),
           py::arg("root") = 0, py::kw_only(), py::arg("async_op") = false, R"doc(
Gather: the root's `out` (size*k elements) receives every rank's `send`
(k elements) in rank order; `out` is needed at the root only (ignored
elsewhere). In place at the root when `send` is out[root*k:(root+1)*k].
Returns `out` at the root, None elsewhere.
)doc")
      .def("scatter", ranked("scatter", &scatter), py::arg("send"), py::arg("out"),
           py::arg("root") = 0, py::kw_only(), py::arg("async_op") = false, R"doc(
Scatter: block r of the root's `send` (size*k elements; ignored, may be None,
elsewhere) goes to rank r's `out` (k elements). In place at the root when
`out` is send[root*k:(root+1)*k]. Returns `out`.
)doc")
      .def("allgatherv", ranked("allgatherv", &allgatherv), py::arg("send"), py::arg("out"),
           py::arg("recv_counts"), py::arg("displs") = py::none(), py::kw_only(),
           py::arg("async_op") = false, R"doc(
Allgatherv (MPI_Allgatherv): rank r's `send` (recv_counts[r] elements) lands
in every rank's `out` at displs[r]. recv_counts (the same on every rank, else
MismatchError everywhere) and displs are sequences of `size` ints, in
elements; displs default to the blocks packed in rank order. In place when
`send` is out[displs[rank]:displs[rank]+recv_counts[rank]]. Returns `out`.
)doc")
      .def("reduce_scatter_v", ranked("reduce_scatter_v", &reduce_scatter_v), py::arg("send"),
           py::arg("out"), py::arg("recv_counts"), py::arg("op") = ReduceOp::sum, py::kw_only(),
           py::arg("async_op") = false, R"doc(
Reduce-scatter with uneven blocks: `send` holds sum(recv_counts) elements,
block r after the blocks before it; rank r's `out` (recv_counts[r] elements)
receives op over ranks of block r, reduced in rank order (float16 and
bfloat16 round once). recv_counts: a sequence of `size` ints, the same on
every rank (else MismatchError everywhere). In place when `out` is the
rank's block of `send`. Returns `out`.
)doc")
      .def("send", ranked_p2p(&send), py::arg("buffer"), py::arg("peer"), py::arg("tag") = 0,
           py::kw_only(), py::arg("async_op") = false, R"doc(
Sends `buffer` (read only, zero copy) to rank `peer` (!= rank) with `tag`
(>= 0). Only the two ranks take part; messages of one (sender, receiver,
tag) arrive in order. Messages up to 16 KiB are buffered while the
sender's outbox in the segment has room: send returns at once; larger ones
return when the receiver has taken them.
Raises InvalidArgumentError (bad peer or tag), MismatchError (the matching
recv has another element count or datatype: raised on both ranks; for a
buffered message, by the next send to that peer), PeerFailureError,
TimeoutError. async_op=True returns a shmring.Request (isend); unlike
collectives, these progress on their own, in any order on the two ranks.
)doc")
      .def("recv", ranked_p2p(&recv), py::arg("buffer"), py::arg("peer"), py::arg("tag") = 0,
           py::kw_only(), py::arg("async_op") = false, R"doc(
Receives into `buffer` (writable, zero copy; its element count and datatype
must equal the sender's) the next message from rank `peer` with `tag`.
Returns `buffer`. Errors as send(); async_op=True returns a shmring.Request
(irecv) whose .result is `buffer`.
)doc")
      .def(
          "barrier",
          [](PyCommunicator& self, bool async_op) {
            Held held;
            return dispatch(
                self, "barrier", async_op, held, py::none(), [](Communicator& c) { c.barrier(); },
                [](Communicator& c) { return c.ibarrier(); });
          },
          py::kw_only(), py::arg("async_op") = false,
          "Returns once every rank has entered the barrier. Releases the GIL. With "
          "async_op=True returns a shmring.Request at once.")
      .def(
          "finalize",
          [](PyCommunicator& self, bool async_op) {
            Held held;
            return dispatch(
                self, "finalize", async_op, held, py::none(), [](Communicator& c) { c.finalize(); },
                [](Communicator& c) { return c.ifinalize(); });
          },
          py::kw_only(), py::arg("async_op") = false, R"doc(
The barrier of a rank about to close this communicator (as NCCL's
ncclCommFinalize): returns once every rank has finished its calls before it,
pending async ones included, and entered it; then call close(). A peer that
meets it in another collective gets MismatchError saying that this rank is
leaving. Make no collective call after it. Releases the GIL. With
async_op=True returns a shmring.Request at once.
)doc")
      .def("split", ranked("split", &split), py::arg("color"), py::arg("key") = 0, R"doc(
MPI_Comm_split: a new Communicator of the ranks that pass the same color
(>= 0), ranked by (key, rank here), with its own segment. Collective over this
communicator.
)doc")
      .def(
          "abort", [](PyCommunicator& c, const std::string& reason) { c.get().abort(reason); },
          py::arg("reason"),
          "Marks the job aborted: every rank's pending and later collectives raise AbortedError "
          "carrying `reason`. Safe from any thread.")
      .def("close", &PyCommunicator::close,
           "Detaches from the segment now (also done when the object is collected). Later calls "
           "raise InvalidArgumentError.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyCommunicator& c, py::handle, py::handle, py::handle) {
             c.close();
             return false;
           })
      .def("__repr__", [](PyCommunicator& c) {
        if (c.closed()) return std::string("<shmring.Communicator (closed)>");
        const Config& cfg = c.get().config();
        return fmt::format("<shmring.Communicator rank={} size={} job_id='{}'>", cfg.rank,
                           cfg.world_size, cfg.job_id);
      });
  auto cls = py::reinterpret_borrow<py::class_<PyCommunicator>>(m.attr("Communicator"));
  for (const Signature& sig : kSignatures)
    cls.def(sig.name, misbound(sig),
            "Other arguments: refused on every rank (TypeError here, MismatchError naming this "
            "rank on the others).");
}

}  // namespace shmring::python
