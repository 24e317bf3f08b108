// The collectives over per-rank blocks: alltoall, alltoallv, gather,
// scatter, allgatherv, reduce_scatter_v. Counts and displacements come as
// Python sequences of ints (elements, not bytes); displacements default to
// the blocks packed in rank order. The bindings check every block against
// the buffer it lives in (the core sees only pointers).

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "bindings.hpp"

namespace shmring::python {

namespace {

std::vector<std::size_t> counts_from(const py::handle& seq, const char* what, const char* name,
                                     int size) {
  if (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq))
    throw InvalidArgumentError(
        fmt::format("{}: {} must be a sequence of {} ints, got {}", what, name, size,
                    py::str(py::type::handle_of(seq).attr("__name__")).cast<std::string>()));
  auto s = py::reinterpret_borrow<py::sequence>(seq);
  if (s.size() != static_cast<std::size_t>(size))
    throw InvalidArgumentError(
        fmt::format("{}: {} has {} entries, expected size = {}", what, name, s.size(), size));
  std::vector<std::size_t> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    py::object x = s[i];
    // Any integer with __index__ (Python int, numpy integer scalars, e.g.
    // np.bincount's output); not bool, not float.
    if (py::isinstance<py::bool_>(x) || !PyIndex_Check(x.ptr()))
      throw InvalidArgumentError(fmt::format("{}: {}[{}] must be an integer, got {} {}", what, name,
                                             i, type_name(x), py::repr(x).cast<std::string>()));
    const auto index = py::reinterpret_steal<py::int_>(PyNumber_Index(x.ptr()));
    // Past long long (2^63 and up) no buffer could hold the block: the same
    // refusal in shmring's words, not pybind11's cast error.
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow > 0)
      throw InvalidArgumentError(fmt::format("{}: {}[{}]={} is too large (at most {})", what, name,
                                             i, py::repr(index).cast<std::string>(),
                                             std::numeric_limits<long long>::max()));
    if (overflow < 0 || v < 0)
      throw InvalidArgumentError(fmt::format("{}: {}[{}]={} must be >= 0", what, name, i,
                                             py::repr(index).cast<std::string>()));
    out.push_back(static_cast<std::size_t>(v));
  }
  return out;
}

std::vector<std::size_t> displs_from(const py::object& seq, const std::vector<std::size_t>& counts,
                                     const char* what, const char* name, int size) {
  if (!seq.is_none()) return counts_from(seq, what, name, size);
  std::vector<std::size_t> d(counts.size(), 0);
  for (std::size_t j = 1; j < counts.size(); ++j) d[j] = d[j - 1] + counts[j - 1];
  return d;
}

// Every block (displs[j], counts[j]) must lie inside `buffer`.
void check_blocks_inside(const char* what, const char* name, const BufferView& buffer,
                         const std::vector<std::size_t>& counts,
                         const std::vector<std::size_t>& displs) {
  for (std::size_t j = 0; j < counts.size(); ++j)
    if (counts[j] > 0 && (displs[j] > buffer.count() || counts[j] > buffer.count() - displs[j]))
      throw InvalidArgumentError(
          fmt::format("{}: block {} of {} (elements [{}, {})) lies outside its {} elements", what,
                      j, name, displs[j], displs[j] + counts[j], buffer.count()));
}

}  // namespace

py::object alltoall(PyCommunicator& self, py::object send_obj, py::object out_obj, bool async_op) {
  const auto size = static_cast<std::size_t>(self.get().size());
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "alltoall: send", /*writable=*/false);
  out.acquire(out_obj, "alltoall: out", /*writable=*/true);
  check_same_type("alltoall", send, "send", out, "out");
  if (send.count() != out.count() || send.count() % size != 0)
    throw InvalidArgumentError(
        fmt::format("alltoall: send and out hold {} and {} elements; expected the same number, a "
                    "multiple of size = {}",
                    send.count(), out.count(), size));
  const std::size_t k = send.count() / size;
  return dispatch(
      self, "alltoall", async_op, held, out_obj,
      [&](Communicator& c) { c.alltoall(send.data(), out.data(), k, send.dtype()); },
      [&](Communicator& c) { return c.ialltoall(send.data(), out.data(), k, send.dtype()); });
}

py::object alltoallv(PyCommunicator& self, py::object send_obj, py::object send_counts_obj,
                     py::object out_obj, py::object recv_counts_obj, py::object send_displs_obj,
                     py::object recv_displs_obj, bool async_op) {
  const char* what = "alltoallv";
  const int size = self.get().size();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "alltoallv: send", /*writable=*/false);
  out.acquire(out_obj, "alltoallv: out", /*writable=*/true);
  check_same_type(what, send, "send", out, "out");
  auto sc = counts_from(send_counts_obj, what, "send_counts", size);
  auto rc = counts_from(recv_counts_obj, what, "recv_counts", size);
  auto sd = displs_from(send_displs_obj, sc, what, "send_displs", size);
  auto rd = displs_from(recv_displs_obj, rc, what, "recv_displs", size);
  check_blocks_inside(what, "send", send, sc, sd);
  check_blocks_inside(what, "out", out, rc, rd);
  return dispatch(
      self, what, async_op, held, out_obj,
      [&](Communicator& c) { c.alltoallv(send.data(), sc, sd, out.data(), rc, rd, send.dtype()); },
      [&](Communicator& c) {
        return c.ialltoallv(send.data(), sc, sd, out.data(), rc, rd, send.dtype());
      });
}

py::object gather(PyCommunicator& self, py::object send_obj, py::object out_obj, int root,
                  bool async_op) {
  const int size = self.get().size();
  const bool at_root = self.get().rank() == root;
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "gather: send", /*writable=*/false);
  void* recv = nullptr;
  if (at_root) {
    if (out_obj.is_none())
      throw InvalidArgumentError("gather: the root needs `out` (size x len(send) elements)");
    out.acquire(out_obj, "gather: out", /*writable=*/true);
    check_same_type("gather", send, "send", out, "out");
    if (out.count() != send.count() * static_cast<std::size_t>(size))
      throw InvalidArgumentError(fmt::format(
          "gather: out holds {} elements, expected size x send = {} x {} = {}", out.count(), size,
          send.count(), send.count() * static_cast<std::size_t>(size)));
    recv = out.data();
  }
  return dispatch(
      self, "gather", async_op, held, at_root ? out_obj : py::none(),
      [&](Communicator& c) { c.gather(send.data(), recv, send.count(), send.dtype(), root); },
      [&](Communicator& c) {
        return c.igather(send.data(), recv, send.count(), send.dtype(), root);
      });
}

py::object scatter(PyCommunicator& self, py::object send_obj, py::object out_obj, int root,
                   bool async_op) {
  const int size = self.get().size();
  const bool at_root = self.get().rank() == root;
  Held held;
  BufferView &send = held.add(), &out = held.add();
  out.acquire(out_obj, "scatter: out", /*writable=*/true);
  const void* send_data = nullptr;
  if (at_root) {
    if (send_obj.is_none())
      throw InvalidArgumentError("scatter: the root needs `send` (size x len(out) elements)");
    send.acquire(send_obj, "scatter: send", /*writable=*/false);
    check_same_type("scatter", send, "send", out, "out");
    if (send.count() != out.count() * static_cast<std::size_t>(size))
      throw InvalidArgumentError(fmt::format(
          "scatter: send holds {} elements, expected size x out = {} x {} = {}", send.count(), size,
          out.count(), out.count() * static_cast<std::size_t>(size)));
    send_data = send.data();
  }
  return dispatch(
      self, "scatter", async_op, held, out_obj,
      [&](Communicator& c) { c.scatter(send_data, out.data(), out.count(), out.dtype(), root); },
      [&](Communicator& c) {
        return c.iscatter(send_data, out.data(), out.count(), out.dtype(), root);
      });
}

py::object allgatherv(PyCommunicator& self, py::object send_obj, py::object out_obj,
                      py::object recv_counts_obj, py::object displs_obj, bool async_op) {
  const char* what = "allgatherv";
  const int size = self.get().size();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "allgatherv: send", /*writable=*/false);
  out.acquire(out_obj, "allgatherv: out", /*writable=*/true);
  check_same_type(what, send, "send", out, "out");
  auto rc = counts_from(recv_counts_obj, what, "recv_counts", size);
  auto d = displs_from(displs_obj, rc, what, "displs", size);
  check_blocks_inside(what, "out", out, rc, d);
  return dispatch(
      self, what, async_op, held, out_obj,
      [&](Communicator& c) {
        c.allgatherv(send.data(), send.count(), out.data(), rc, d, send.dtype());
      },
      [&](Communicator& c) {
        return c.iallgatherv(send.data(), send.count(), out.data(), rc, d, send.dtype());
      });
}

py::object reduce_scatter_v(PyCommunicator& self, py::object send_obj, py::object out_obj,
                            py::object recv_counts_obj, ReduceOp op, bool async_op) {
  const char* what = "reduce_scatter_v";
  const int size = self.get().size();
  const int rank = self.get().rank();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "reduce_scatter_v: send", /*writable=*/false);
  out.acquire(out_obj, "reduce_scatter_v: out", /*writable=*/true);
  check_same_type(what, send, "send", out, "out");
  auto rc = counts_from(recv_counts_obj, what, "recv_counts", size);
  std::size_t total = 0;
  for (auto x : rc) total += x;
  if (send.count() != total)
    throw InvalidArgumentError(
        fmt::format("reduce_scatter_v: send holds {} elements, expected sum(recv_counts) = {}",
                    send.count(), total));
  if (out.count() != rc[rank])
    throw InvalidArgumentError(
        fmt::format("reduce_scatter_v: out holds {} elements, expected recv_counts[{}] = {}",
                    out.count(), rank, rc[rank]));
  return dispatch(
      self, what, async_op, held, out_obj,
      [&](Communicator& c) { c.reduce_scatter_v(send.data(), out.data(), rc, send.dtype(), op); },
      [&](Communicator& c) {
        return c.ireduce_scatter_v(send.data(), out.data(), rc, send.dtype(), op);
      });
}

}  // namespace shmring::python
