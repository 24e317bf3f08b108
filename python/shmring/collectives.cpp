// The collectives over one buffer per rank (or one per side of the same
// count): allreduce, reduce_scatter, allgather, broadcast, reduce. Each
// acquires its buffers, checks their types and counts against each other,
// then runs (or starts, with async_op) the core's call through dispatch().

#include <optional>

#include "bindings.hpp"

namespace shmring::python {

py::object allreduce(PyCommunicator& self, py::object buffer, ReduceOp op, py::object out,
                     bool async_op) {
  Held held;
  BufferView& send = held.add();
  BufferView& recv_storage = held.add();
  const BufferView* recv = &send;
  if (out.is_none()) {
    send.acquire(buffer, "allreduce: buffer", /*writable=*/true);
  } else {
    send.acquire(buffer, "allreduce: buffer", /*writable=*/false);
    recv_storage.acquire(out, "allreduce: out", /*writable=*/true);
    recv = &recv_storage;
    if (recv->dtype() != send.dtype() || recv->count() != send.count())
      throw InvalidArgumentError(fmt::format(
          "allreduce: buffer holds {} {} elements but out holds {} {} elements; they must match",
          send.count(), to_string(send.dtype()), recv->count(), to_string(recv->dtype())));
  }
  return dispatch(
      self, "allreduce", async_op, held, out.is_none() ? buffer : out,
      [&](Communicator& c) {
        c.allreduce(send.data(), recv->data(), send.count(), send.dtype(), op);
      },
      [&](Communicator& c) {
        return c.iallreduce(send.data(), recv->data(), send.count(), send.dtype(), op);
      });
}

void check_same_type(const char* what, const BufferView& a, const char* a_name, const BufferView& b,
                     const char* b_name) {
  if (a.dtype() != b.dtype())
    throw InvalidArgumentError(fmt::format("{}: {} is {} but {} is {}; they must match", what,
                                           a_name, to_string(a.dtype()), b_name,
                                           to_string(b.dtype())));
}

py::object reduce_scatter(PyCommunicator& self, py::object send_obj, py::object out_obj,
                          ReduceOp op, bool async_op) {
  const int size = self.get().size();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "reduce_scatter: send", /*writable=*/false);
  out.acquire(out_obj, "reduce_scatter: out", /*writable=*/true);
  check_same_type("reduce_scatter", send, "send", out, "out");
  if (send.count() != out.count() * static_cast<std::size_t>(size))
    throw InvalidArgumentError(
        fmt::format("reduce_scatter: send holds {} elements, expected size() x out = {} x {} = {}",
                    send.count(), size, out.count(), out.count() * static_cast<std::size_t>(size)));
  return dispatch(
      self, "reduce_scatter", async_op, held, out_obj,
      [&](Communicator& c) {
        c.reduce_scatter(send.data(), out.data(), out.count(), out.dtype(), op);
      },
      [&](Communicator& c) {
        return c.ireduce_scatter(send.data(), out.data(), out.count(), out.dtype(), op);
      });
}

py::object allgather(PyCommunicator& self, py::object send_obj, py::object out_obj, bool async_op) {
  const int size = self.get().size();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "allgather: send", /*writable=*/false);
  out.acquire(out_obj, "allgather: out", /*writable=*/true);
  check_same_type("allgather", send, "send", out, "out");
  if (out.count() != send.count() * static_cast<std::size_t>(size))
    throw InvalidArgumentError(fmt::format(
        "allgather: out holds {} elements, expected size() x send = {} x {} = {}", out.count(),
        size, send.count(), send.count() * static_cast<std::size_t>(size)));
  return dispatch(
      self, "allgather", async_op, held, out_obj,
      [&](Communicator& c) { c.allgather(send.data(), out.data(), send.count(), send.dtype()); },
      [&](Communicator& c) {
        return c.iallgather(send.data(), out.data(), send.count(), send.dtype());
      });
}

py::object broadcast(PyCommunicator& self, py::object buffer, int root, bool async_op) {
  // The root only reads its buffer; the others write into theirs.
  Held held;
  BufferView& view = held.add();
  view.acquire(buffer, "broadcast: buffer", /*writable=*/self.get().rank() != root);
  return dispatch(
      self, "broadcast", async_op, held, buffer,
      [&](Communicator& c) { c.broadcast(view.data(), view.count(), view.dtype(), root); },
      [&](Communicator& c) { return c.ibroadcast(view.data(), view.count(), view.dtype(), root); });
}

py::object reduce(PyCommunicator& self, py::object buffer, ReduceOp op, int root, py::object out,
                  bool async_op) {
  const bool at_root = self.get().rank() == root;
  Held held;
  BufferView &send = held.add(), &out_storage = held.add();
  const BufferView* recv = &send;
  send.acquire(buffer, "reduce: buffer", /*writable=*/at_root && out.is_none());
  if (!out.is_none()) {
    out_storage.acquire(out, "reduce: out", /*writable=*/true);
    check_same_type("reduce", send, "buffer", out_storage, "out");
    if (out_storage.count() != send.count())
      throw InvalidArgumentError(
          fmt::format("reduce: buffer holds {} elements but out holds {}; they must match",
                      send.count(), out_storage.count()));
    recv = &out_storage;
  }
  void* recv_data = at_root ? recv->data() : nullptr;
  return dispatch(
      self, "reduce", async_op, held, out.is_none() ? buffer : out,
      [&](Communicator& c) {
        c.reduce(send.data(), recv_data, send.count(), send.dtype(), op, root);
      },
      [&](Communicator& c) {
        return c.ireduce(send.data(), recv_data, send.count(), send.dtype(), op, root);
      });
}

}  // namespace shmring::python
