// The C API: every call forwards to the C++ Communicator and turns an
// exception into a result code plus a stored message.

#include "shmring/shmring.h"

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "core/ops.hpp"
#include "shmring/shmring.hpp"

struct shmring_comm {
  shmring::Communicator comm;
  std::string last_error;
  // Requests hold a weak reference: a request waited for after its
  // communicator was destroyed reports through the thread's last error only.
  std::shared_ptr<int> alive = std::make_shared<int>(0);
};

struct shmring_request {
  shmring::Request request;
  shmring_comm_t comm;
  std::weak_ptr<int> comm_alive;
  bool reported = false;  // shmring_test returned its result
};

namespace {

thread_local std::string t_last_error;

template <class F>
shmring_result_t guarded(shmring_comm_t c, F&& f) {
  try {
    f();
    return SHMRING_SUCCESS;
  } catch (const shmring::Error& e) {
    (c ? c->last_error : t_last_error) = e.what();
    t_last_error = e.what();
    return static_cast<shmring_result_t>(e.code());
  } catch (const std::bad_alloc&) {
    (c ? c->last_error : t_last_error) = "out of memory";
    return SHMRING_ERR_SYSTEM;
  } catch (const std::exception& e) {
    (c ? c->last_error : t_last_error) = e.what();
    return SHMRING_ERR_INTERNAL;
  }
}

shmring_result_t null_comm(const char* fn) {
  t_last_error = std::string(fn) + ": comm is NULL";
  return SHMRING_ERR_INVALID_ARGUMENT;
}

// A NULL output pointer: the message goes to the communicator too.
shmring_result_t null_output(shmring_comm_t c, const char* fn, const char* what) {
  t_last_error = std::string(fn) + ": " + what + " is NULL: expected a pointer to write to";
  if (c) c->last_error = t_last_error;
  return SHMRING_ERR_INVALID_ARGUMENT;
}

#define SHMRING_REQUIRE_COMM(c) \
  if ((c) == nullptr) return null_comm(__func__)

// The int a C caller passed as an enum: reading it as the C++ enum type
// would be undefined for values outside the enumerators' range (UBSan
// reports the load), its bytes are not.
template <class E>
int raw_enum(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "the C enums are passed as int");
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// The C enums are ints, shmring::DataType and ReduceOp 8-bit: a plain cast
// would wrap 256 to float32 (and 257 to float64, past the caller's buffer).
// Every value past the last enumerator is refused before the cast
// (SHMRING_REQUIRE_ENUM), naming the value passed and the C type, so that
// 99 and 256 read alike. A collective's refusal goes through reject_call,
// so that its peers fail at once; a point-to-point call's stays on this
// rank.
shmring_result_t bad_enum(shmring_comm_t comm, const char* fn, const char* what, long long value,
                          int last) {
  std::string_view name(fn);
  if (name.substr(0, 8) == "shmring_") name.remove_prefix(8);
  const std::string why = fmt::format(
      "{} {} is not a {} (0..{})", what, value,
      std::string_view(what) == "datatype" ? "shmring_datatype_t" : "shmring_reduce_op_t", last);
  if (name == "send" || name == "recv" || name == "isend" || name == "irecv") {
    t_last_error = fmt::format("rank {}: {}: {}", comm->comm.rank(), name, why);
    comm->last_error = t_last_error;
    return SHMRING_ERR_INVALID_ARGUMENT;
  }
  return guarded(comm, [&] { comm->comm.reject_call(std::string(name), why); });
}

#define SHMRING_REQUIRE_ENUM(c, value, what, last, req)        \
  if (raw_enum(value) < 0 || raw_enum(value) > (last)) {       \
    shmring_request_t* r_ = (req);                             \
    if (r_ != nullptr) *r_ = nullptr;                          \
    return bad_enum(c, __func__, what, raw_enum(value), last); \
  }
#define SHMRING_REQUIRE_DTYPE(c, d, req) \
  SHMRING_REQUIRE_ENUM(c, d, "datatype", static_cast<int>(SHMRING_INT64), req)
#define SHMRING_REQUIRE_OP(c, o, req) \
  SHMRING_REQUIRE_ENUM(c, o, "reduce op", static_cast<int>(SHMRING_AVG), req)

// An enumerator here (SHMRING_REQUIRE_*).
shmring::DataType dt(shmring_datatype_t d) {
  return static_cast<shmring::DataType>(raw_enum(d));
}
shmring::ReduceOp op(shmring_reduce_op_t o) {
  return static_cast<shmring::ReduceOp>(raw_enum(o));
}

// Runs an i-call: *req gets the request, or NULL when the call fails.
// Point-to-point calls use it as it is (they are not in the collective order).
template <class F>
shmring_result_t start_p2p(shmring_comm_t comm, shmring_request_t* req, const char* fn, F&& f) {
  if (req == nullptr) return null_output(comm, fn, "req");
  *req = nullptr;
  return guarded(comm, [&] {
    auto* r = new shmring_request{f(), comm, comm->alive};
    *req = r;
  });
}

// A collective's i-call: as start_p2p, but a NULL req is refused through
// reject_call, so that the peers' matching call fails at once instead of
// waiting until SHMRING_TIMEOUT for a call this rank never makes.
template <class F>
shmring_result_t start(shmring_comm_t comm, shmring_request_t* req, const char* fn, F&& f) {
  if (req == nullptr)
    return guarded(
        comm, [&] { comm->comm.reject_call(fn, "req is NULL: expected a pointer to write to"); });
  return start_p2p(comm, req, fn, std::forward<F>(f));
}

// The result of a completed (or failing) request, recorded as last error.
template <class F>
shmring_result_t finish(shmring_request_t r, F&& f) {
  shmring_comm_t comm = r->comm_alive.expired() ? nullptr : r->comm;
  return guarded(comm, std::forward<F>(f));
}

}  // namespace

extern "C" {

shmring_result_t shmring_comm_init_from_env(shmring_comm_t* comm) {
  if (comm == nullptr) return null_output(nullptr, __func__, "comm");
  *comm = nullptr;
  return guarded(nullptr, [&] { *comm = new shmring_comm{shmring::Communicator(), {}}; });
}

shmring_result_t shmring_comm_init(shmring_comm_t* comm, int rank, int size, const char* job_id) {
  if (comm == nullptr) return null_comm(__func__);
  *comm = nullptr;
  if (job_id == nullptr) {
    t_last_error = "shmring_comm_init: job_id is NULL";
    return SHMRING_ERR_INVALID_ARGUMENT;
  }
  // -1 is Options' "not given": here it would read as "rank missing" (or
  // send both to the environment), so the explicit form checks its own.
  if (size < 1 || rank < 0 || rank >= size) {
    t_last_error = fmt::format(
        "shmring_comm_init: rank={}, size={}: expected size >= 1 and rank in [0, size) "
        "(shmring_comm_init_from_env reads them from the launcher)",
        rank, size);
    return SHMRING_ERR_INVALID_ARGUMENT;
  }
  return guarded(nullptr, [&] {
    shmring::Options o;
    o.rank = rank;
    o.world_size = size;
    o.job_id = job_id;
    *comm = new shmring_comm{shmring::Communicator(o), {}};
  });
}

shmring_result_t shmring_comm_destroy(shmring_comm_t comm) {
  delete comm;
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_comm_rank(shmring_comm_t comm, int* rank) {
  SHMRING_REQUIRE_COMM(comm);
  if (rank == nullptr) return null_output(comm, __func__, "rank");
  *rank = comm->comm.rank();
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_comm_size(shmring_comm_t comm, int* size) {
  SHMRING_REQUIRE_COMM(comm);
  if (size == nullptr) return null_output(comm, __func__, "size");
  *size = comm->comm.size();
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_comm_waits_may_spin(shmring_comm_t comm, int* may_spin) {
  SHMRING_REQUIRE_COMM(comm);
  if (may_spin == nullptr) return null_output(comm, __func__, "may_spin");
  *may_spin = comm->comm.waits_may_spin() ? 1 : 0;
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_comm_stats(shmring_comm_t comm, shmring_collective_stats_t* out, int max,
                                    int* n) {
  SHMRING_REQUIRE_COMM(comm);
  if (n == nullptr) return null_output(comm, __func__, "n");
  if (out == nullptr && max > 0) return null_output(comm, __func__, "out");
  const auto st = comm->comm.stats();
  *n = static_cast<int>(st.size());
  for (int i = 0; i < max && i < *n; ++i) {
    const auto& s = st[static_cast<std::size_t>(i)];
    out[i].collective = "unknown";
    for (std::uint32_t k = 1; k <= 12; ++k)  // a static name (core/ops.hpp CollectiveKind)
      if (s.collective == shmring::to_string(static_cast<shmring::CollectiveKind>(k)))
        out[i].collective = shmring::to_string(static_cast<shmring::CollectiveKind>(k));
    out[i].calls = s.calls;
    out[i].bytes = s.bytes;
    out[i].time_ns = s.time_ns;
    out[i].wait_ns = s.wait_ns;
  }
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_allreduce(const void* send, void* recv, size_t count,
                                   shmring_datatype_t dtype, shmring_reduce_op_t o,
                                   shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  SHMRING_REQUIRE_OP(comm, o, nullptr);
  return guarded(comm, [&] { comm->comm.allreduce(send, recv, count, dt(dtype), op(o)); });
}

shmring_result_t shmring_reduce_scatter(const void* send, void* recv, size_t recv_count,
                                        shmring_datatype_t dtype, shmring_reduce_op_t o,
                                        shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  SHMRING_REQUIRE_OP(comm, o, nullptr);
  return guarded(comm,
                 [&] { comm->comm.reduce_scatter(send, recv, recv_count, dt(dtype), op(o)); });
}

shmring_result_t shmring_allgather(const void* send, void* recv, size_t send_count,
                                   shmring_datatype_t dtype, shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] { comm->comm.allgather(send, recv, send_count, dt(dtype)); });
}

shmring_result_t shmring_broadcast(void* buffer, size_t count, shmring_datatype_t dtype, int root,
                                   shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] { comm->comm.broadcast(buffer, count, dt(dtype), root); });
}

shmring_result_t shmring_reduce(const void* send, void* recv, size_t count,
                                shmring_datatype_t dtype, shmring_reduce_op_t o, int root,
                                shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  SHMRING_REQUIRE_OP(comm, o, nullptr);
  return guarded(comm, [&] { comm->comm.reduce(send, recv, count, dt(dtype), op(o), root); });
}

shmring_result_t shmring_barrier(shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  return guarded(comm, [&] { comm->comm.barrier(); });
}

shmring_result_t shmring_comm_finalize(shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  return guarded(comm, [&] { comm->comm.finalize(); });
}

shmring_result_t shmring_comm_split(shmring_comm_t comm, int color, int key,
                                    shmring_comm_t* newcomm) {
  SHMRING_REQUIRE_COMM(comm);
  // split is collective: refused as a collective's NULL req is (start()).
  if (newcomm == nullptr)
    return guarded(comm, [&] {
      comm->comm.reject_call("split", "newcomm is NULL: expected a pointer to write to");
    });
  *newcomm = nullptr;
  return guarded(comm, [&] { *newcomm = new shmring_comm{comm->comm.split(color, key), {}}; });
}

shmring_result_t shmring_comm_abort(shmring_comm_t comm, const char* reason) {
  SHMRING_REQUIRE_COMM(comm);
  return guarded(comm, [&] { comm->comm.abort(reason ? reason : "shmring_comm_abort"); });
}

shmring_result_t shmring_reject(shmring_comm_t comm, const char* collective, const char* reason) {
  SHMRING_REQUIRE_COMM(comm);
  return guarded(comm, [&] {
    comm->comm.reject_call(collective ? collective : "collective",
                           reason ? reason : "refused by the caller");
  });
}

// ---- Non-blocking collectives. ----

shmring_result_t shmring_iallreduce(const void* send, void* recv, size_t count,
                                    shmring_datatype_t dtype, shmring_reduce_op_t o,
                                    shmring_comm_t comm, shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  SHMRING_REQUIRE_OP(comm, o, req);
  return start(comm, req, __func__,
               [&] { return comm->comm.iallreduce(send, recv, count, dt(dtype), op(o)); });
}

shmring_result_t shmring_ireduce_scatter(const void* send, void* recv, size_t recv_count,
                                         shmring_datatype_t dtype, shmring_reduce_op_t o,
                                         shmring_comm_t comm, shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  SHMRING_REQUIRE_OP(comm, o, req);
  return start(comm, req, __func__, [&] {
    return comm->comm.ireduce_scatter(send, recv, recv_count, dt(dtype), op(o));
  });
}

shmring_result_t shmring_iallgather(const void* send, void* recv, size_t send_count,
                                    shmring_datatype_t dtype, shmring_comm_t comm,
                                    shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start(comm, req, __func__,
               [&] { return comm->comm.iallgather(send, recv, send_count, dt(dtype)); });
}

shmring_result_t shmring_ibroadcast(void* buffer, size_t count, shmring_datatype_t dtype, int root,
                                    shmring_comm_t comm, shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start(comm, req, __func__,
               [&] { return comm->comm.ibroadcast(buffer, count, dt(dtype), root); });
}

shmring_result_t shmring_ireduce(const void* send, void* recv, size_t count,
                                 shmring_datatype_t dtype, shmring_reduce_op_t o, int root,
                                 shmring_comm_t comm, shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  SHMRING_REQUIRE_OP(comm, o, req);
  return start(comm, req, __func__,
               [&] { return comm->comm.ireduce(send, recv, count, dt(dtype), op(o), root); });
}

shmring_result_t shmring_ibarrier(shmring_comm_t comm, shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  return start(comm, req, __func__, [&] { return comm->comm.ibarrier(); });
}

// ---- The staged collectives (blocking and non-blocking). ----

}  // extern "C"

namespace {
// A C array of size() entries as a span. NULL is refused here, where it is
// still known to be NULL (the front sees only a span, and an empty one means
// "wrong length"), through reject_call, so that the peers' matching call
// fails at once as it does for the front's own argument errors.
std::span<const std::size_t> entries(shmring_comm_t comm, const char* collective, const char* name,
                                     const size_t* a) {
  const auto n = static_cast<std::size_t>(comm->comm.size());
  if (a == nullptr)
    comm->comm.reject_call(collective, std::string(name) + " is NULL; expected an array of " +
                                           std::to_string(n) + " entries");
  return {a, n};
}
}  // namespace

extern "C" {

shmring_result_t shmring_alltoall(const void* send, void* recv, size_t count,
                                  shmring_datatype_t dtype, shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] { comm->comm.alltoall(send, recv, count, dt(dtype)); });
}

shmring_result_t shmring_alltoallv(const void* send, const size_t* send_counts,
                                   const size_t* send_displs, void* recv, const size_t* recv_counts,
                                   const size_t* recv_displs, shmring_datatype_t dtype,
                                   shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] {
    const char* what = "alltoallv";
    auto sc = entries(comm, what, "send_counts", send_counts);
    auto sd = entries(comm, what, "send_displs", send_displs);
    auto rc = entries(comm, what, "recv_counts", recv_counts);
    auto rd = entries(comm, what, "recv_displs", recv_displs);
    comm->comm.alltoallv(send, sc, sd, recv, rc, rd, dt(dtype));
  });
}

shmring_result_t shmring_gather(const void* send, void* recv, size_t count,
                                shmring_datatype_t dtype, int root, shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] { comm->comm.gather(send, recv, count, dt(dtype), root); });
}

shmring_result_t shmring_scatter(const void* send, void* recv, size_t count,
                                 shmring_datatype_t dtype, int root, shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] { comm->comm.scatter(send, recv, count, dt(dtype), root); });
}

shmring_result_t shmring_allgatherv(const void* send, size_t send_count, void* recv,
                                    const size_t* recv_counts, const size_t* displs,
                                    shmring_datatype_t dtype, shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] {
    auto rc = entries(comm, "allgatherv", "recv_counts", recv_counts);
    auto d = entries(comm, "allgatherv", "displs", displs);
    comm->comm.allgatherv(send, send_count, recv, rc, d, dt(dtype));
  });
}

shmring_result_t shmring_reduce_scatter_v(const void* send, void* recv, const size_t* recv_counts,
                                          shmring_datatype_t dtype, shmring_reduce_op_t o,
                                          shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  SHMRING_REQUIRE_OP(comm, o, nullptr);
  return guarded(comm, [&] {
    comm->comm.reduce_scatter_v(send, recv,
                                entries(comm, "reduce_scatter_v", "recv_counts", recv_counts),
                                dt(dtype), op(o));
  });
}

shmring_result_t shmring_ialltoall(const void* send, void* recv, size_t count,
                                   shmring_datatype_t dtype, shmring_comm_t comm,
                                   shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start(comm, req, __func__,
               [&] { return comm->comm.ialltoall(send, recv, count, dt(dtype)); });
}

shmring_result_t shmring_ialltoallv(const void* send, const size_t* send_counts,
                                    const size_t* send_displs, void* recv,
                                    const size_t* recv_counts, const size_t* recv_displs,
                                    shmring_datatype_t dtype, shmring_comm_t comm,
                                    shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start(comm, req, __func__, [&] {
    const char* what = "alltoallv";
    auto sc = entries(comm, what, "send_counts", send_counts);
    auto sd = entries(comm, what, "send_displs", send_displs);
    auto rc = entries(comm, what, "recv_counts", recv_counts);
    auto rd = entries(comm, what, "recv_displs", recv_displs);
    return comm->comm.ialltoallv(send, sc, sd, recv, rc, rd, dt(dtype));
  });
}

shmring_result_t shmring_igather(const void* send, void* recv, size_t count,
                                 shmring_datatype_t dtype, int root, shmring_comm_t comm,
                                 shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start(comm, req, __func__,
               [&] { return comm->comm.igather(send, recv, count, dt(dtype), root); });
}

shmring_result_t shmring_iscatter(const void* send, void* recv, size_t count,
                                  shmring_datatype_t dtype, int root, shmring_comm_t comm,
                                  shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start(comm, req, __func__,
               [&] { return comm->comm.iscatter(send, recv, count, dt(dtype), root); });
}

shmring_result_t shmring_iallgatherv(const void* send, size_t send_count, void* recv,
                                     const size_t* recv_counts, const size_t* displs,
                                     shmring_datatype_t dtype, shmring_comm_t comm,
                                     shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start(comm, req, __func__, [&] {
    auto rc = entries(comm, "allgatherv", "recv_counts", recv_counts);
    auto d = entries(comm, "allgatherv", "displs", displs);
    return comm->comm.iallgatherv(send, send_count, recv, rc, d, dt(dtype));
  });
}

shmring_result_t shmring_ireduce_scatter_v(const void* send, void* recv, const size_t* recv_counts,
                                           shmring_datatype_t dtype, shmring_reduce_op_t o,
                                           shmring_comm_t comm, shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  SHMRING_REQUIRE_OP(comm, o, req);
  return start(comm, req, __func__, [&] {
    return comm->comm.ireduce_scatter_v(
        send, recv, entries(comm, "reduce_scatter_v", "recv_counts", recv_counts), dt(dtype),
        op(o));
  });
}

shmring_result_t shmring_wait(shmring_request_t* req) {
  if (req == nullptr) return null_output(nullptr, __func__, "req");
  shmring_request_t r = *req;
  if (r == nullptr) return SHMRING_SUCCESS;
  shmring_result_t result = finish(r, [&] { r->request.wait(); });
  delete r;
  *req = nullptr;
  return result;
}

shmring_result_t shmring_test(shmring_request_t* req, int* done) {
  if (req == nullptr) return null_output(nullptr, __func__, "req");
  if (done == nullptr) return null_output(nullptr, __func__, "done");
  *done = 0;
  shmring_request_t r = *req;
  if (r == nullptr) {
    *done = 1;
    return SHMRING_SUCCESS;
  }
  // A failed request is done too: test() rethrows only once it completed.
  // (InvalidArgument comes only from a forked child, where it never will.)
  *done = 1;
  shmring_result_t result = finish(r, [&] { *done = r->request.test() ? 1 : 0; });
  if (result == SHMRING_ERR_INVALID_ARGUMENT) *done = 0;
  if (*done) r->reported = true;
  return result;
}

shmring_result_t shmring_request_free(shmring_request_t req) {
  if (req == nullptr) return SHMRING_SUCCESS;
  // A pending request is waited for first; its result is returned unless
  // shmring_test returned it already, so that no error is dropped.
  shmring_result_t result =
      req->reported ? SHMRING_SUCCESS : finish(req, [&] { req->request.wait(); });
  delete req;
  return result;
}

// ---- Point-to-point (p2p.cpp). ----

shmring_result_t shmring_send(const void* buffer, size_t count, shmring_datatype_t dtype, int peer,
                              int tag, shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] { comm->comm.send(buffer, count, dt(dtype), peer, tag); });
}

shmring_result_t shmring_recv(void* buffer, size_t count, shmring_datatype_t dtype, int peer,
                              int tag, shmring_comm_t comm) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, nullptr);
  return guarded(comm, [&] { comm->comm.recv(buffer, count, dt(dtype), peer, tag); });
}

shmring_result_t shmring_isend(const void* buffer, size_t count, shmring_datatype_t dtype, int peer,
                               int tag, shmring_comm_t comm, shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start_p2p(comm, req, __func__,
                   [&] { return comm->comm.isend(buffer, count, dt(dtype), peer, tag); });
}

shmring_result_t shmring_irecv(void* buffer, size_t count, shmring_datatype_t dtype, int peer,
                               int tag, shmring_comm_t comm, shmring_request_t* req) {
  SHMRING_REQUIRE_COMM(comm);
  SHMRING_REQUIRE_DTYPE(comm, dtype, req);
  return start_p2p(comm, req, __func__,
                   [&] { return comm->comm.irecv(buffer, count, dt(dtype), peer, tag); });
}

const char* shmring_get_error_string(shmring_result_t result) {
  switch (result) {
    case SHMRING_SUCCESS:
      return "success";
    case SHMRING_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case SHMRING_ERR_MISMATCH:
      return "collective mismatch between ranks";
    case SHMRING_ERR_TIMEOUT:
      return "timeout";
    case SHMRING_ERR_PEER_FAILURE:
      return "peer failure (a rank died or left)";
    case SHMRING_ERR_ABORTED:
      return "aborted";
    case SHMRING_ERR_SYSTEM:
      return "system error";
    case SHMRING_ERR_OUT_OF_SHARED_MEMORY:
      return "out of shared memory";
    case SHMRING_ERR_INTERNAL:
      return "internal error";
  }
  return "unknown result code";
}

const char* shmring_get_last_error(shmring_comm_t comm) {
  return comm ? comm->last_error.c_str() : t_last_error.c_str();
}

}  // extern "C"
