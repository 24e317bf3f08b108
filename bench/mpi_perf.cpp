// The Open MPI side of the *_perf benchmarks: a backend over MPI_COMM_WORLD
// for the driver (perf_common.hpp) and the main() every
// mpi_<collective>_perf.cpp calls, so each
// table is the shmring tool's, same options, same check, same columns.
// Header-only against shmring/types.hpp: the MPI tools do not link shmring.
//
// In place follows the driver's buffers (perf_common.hpp invoke_in_place):
// where send (or, for scatter, recv) lies at the root's or this rank's block
// of the other buffer, the call passes MPI_IN_PLACE, as MPI requires.

#include "mpi_perf.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace shmring::bench {

namespace {

class MpiBackend final : public PerfBackend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  // MPI has no 16-bit floating types and no average.
  bool supports(DataType t, ReduceOp op) const override {
    return t != DataType::float16 && t != DataType::bfloat16 && op != ReduceOp::avg;
  }
  void allreduce(const void* send, void* recv, std::size_t count, DataType t,
                 ReduceOp op) override {
    check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, to_int(count, "count"),
                        mpi_type(t), mpi_op(op), MPI_COMM_WORLD),
          "MPI_Allreduce");
  }
  void allgather(const void* send, void* recv, std::size_t count, DataType t) override {
    const int c = to_int(count, "count");
    const bool in_place = send == block(recv, rank_, count, t);
    check(MPI_Allgather(in_place ? MPI_IN_PLACE : send, c, mpi_type(t), recv, c, mpi_type(t),
                        MPI_COMM_WORLD),
          "MPI_Allgather");
  }
  void alltoall(const void* send, void* recv, std::size_t count, DataType t) override {
    const int c = to_int(count, "count");
    check(MPI_Alltoall(send, c, mpi_type(t), recv, c, mpi_type(t), MPI_COMM_WORLD), "MPI_Alltoall");
  }
  void alltoallv(const void* send, std::span<const std::size_t> send_counts,
                 std::span<const std::size_t> send_displs, void* recv,
                 std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                 DataType t) override {
    // Converted into vectors kept between calls: no allocation while timed.
    to_ints(send_counts, send_counts_);
    to_ints(send_displs, send_displs_);
    to_ints(recv_counts, recv_counts_);
    to_ints(recv_displs, recv_displs_);
    check(MPI_Alltoallv(send, send_counts_.data(), send_displs_.data(), mpi_type(t), recv,
                        recv_counts_.data(), recv_displs_.data(), mpi_type(t), MPI_COMM_WORLD),
          "MPI_Alltoallv");
  }
  void gather(const void* send, void* recv, std::size_t count, DataType t, int root) override {
    const int c = to_int(count, "count");
    const bool in_place = rank_ == root && send == block(recv, root, count, t);
    check(MPI_Gather(in_place ? MPI_IN_PLACE : send, c, mpi_type(t), recv, c, mpi_type(t), root,
                     MPI_COMM_WORLD),
          "MPI_Gather");
  }
  void scatter(const void* send, void* recv, std::size_t count, DataType t, int root) override {
    const int c = to_int(count, "count");
    const bool in_place = rank_ == root && recv == block(send, root, count, t);
    check(MPI_Scatter(send, c, mpi_type(t), in_place ? MPI_IN_PLACE : recv, c, mpi_type(t), root,
                      MPI_COMM_WORLD),
          "MPI_Scatter");
  }
  void allgatherv(const void* send, std::size_t send_count, void* recv,
                  std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
                  DataType t) override {
    to_ints(recv_counts, recv_counts_);
    to_ints(displs, recv_displs_);
    const bool in_place = send == block(recv, 1, displs[static_cast<std::size_t>(rank_)], t);
    check(MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, to_int(send_count, "send count"),
                         mpi_type(t), recv, recv_counts_.data(), recv_displs_.data(), mpi_type(t),
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  double max_over_ranks(double v) override {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  }
  double sum_over_ranks(double v) override {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return v;
  }

 private:
  static void check(int rc, const char* call) {
    if (rc != MPI_SUCCESS) throw std::runtime_error(fmt::format("{} returned {}", call, rc));
  }
  // MPI counts and displacements are ints.
  static int to_int(std::size_t v, const char* what) {
    if (v > static_cast<std::size_t>(INT_MAX))
      throw std::runtime_error(fmt::format("{} {} exceeds MPI's int", what, v));
    return static_cast<int>(v);
  }
  static void to_ints(std::span<const std::size_t> in, std::vector<int>& out) {
    out.resize(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = to_int(in[i], "count or displacement");
  }
  // Block `index` of `count` elements of `base`.
  static const void* block(const void* base, int index, std::size_t count, DataType t) {
    int bytes = 0;
    MPI_Type_size(mpi_type(t), &bytes);
    return static_cast<const std::byte*>(base) +
           static_cast<std::size_t>(index) * count * static_cast<std::size_t>(bytes);
  }
  static MPI_Datatype mpi_type(DataType t) {
    switch (t) {
      case DataType::int8:
        return MPI_INT8_T;
      case DataType::uint8:
        return MPI_UINT8_T;
      case DataType::int32:
        return MPI_INT32_T;
      case DataType::int64:
        return MPI_INT64_T;
      case DataType::float32:
        return MPI_FLOAT;
      case DataType::float64:
        return MPI_DOUBLE;
      default:
        throw std::runtime_error("MPI has no 16-bit floating type");
    }
  }
  static MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
      case ReduceOp::sum:
        return MPI_SUM;
      case ReduceOp::prod:
        return MPI_PROD;
      case ReduceOp::min:
        return MPI_MIN;
      case ReduceOp::max:
        return MPI_MAX;
      default:
        throw std::runtime_error("MPI has no average operator");
    }
  }
  int rank_ = 0, size_ = 1;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
};

}  // namespace

// main() of mpi_<collective>_perf: MPI_Init, the options of the shmring
// tool of the same collective (-a is accepted and ignored), run, MPI_Finalize.
int mpi_perf_main(int argc, char** argv, Collective coll) {
  MPI_Init(&argc, &argv);
  const std::string prog = fmt::format("mpi_{}_perf", info(coll).name);
  CLI::App app{fmt::format("{}: Open MPI {} bandwidth (run under mpirun)", prog, info(coll).name)};
  PerfOptions o;
  add_perf_options(app, o, coll);
  int rc = 0;
  try {
    app.parse(argc, argv);
    validate(o);
    MpiBackend b;
    rc = run_perf(b, o, coll);
  } catch (const CLI::Error& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    rc = rank == 0 ? app.exit(e) : (e.get_exit_code() ? 1 : 0);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", prog, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace shmring::bench
