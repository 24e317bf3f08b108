// Point-to-point: `buffer` is sent as it is (read only) or received into
// (written), zero copy. Not in the collective order, so their refusals are
// not published to the peers (communicator.cpp, ranked_p2p).

#include "bindings.hpp"

namespace shmring::python {

py::object send(PyCommunicator& self, py::object buffer, int peer, int tag, bool async_op) {
  Held held;
  BufferView& view = held.add();
  view.acquire(buffer, "send: buffer", /*writable=*/false);
  return dispatch(
      self, "send", async_op, held, py::none(),
      [&](Communicator& c) { c.send(view.data(), view.count(), view.dtype(), peer, tag); },
      [&](Communicator& c) { return c.isend(view.data(), view.count(), view.dtype(), peer, tag); });
}

py::object recv(PyCommunicator& self, py::object buffer, int peer, int tag, bool async_op) {
  Held held;
  BufferView& view = held.add();
  view.acquire(buffer, "recv: buffer", /*writable=*/true);
  return dispatch(
      self, "recv", async_op, held, buffer,
      [&](Communicator& c) { c.recv(view.data(), view.count(), view.dtype(), peer, tag); },
      [&](Communicator& c) { return c.irecv(view.data(), view.count(), view.dtype(), peer, tag); });
}

}  // namespace shmring::python
