// mpi_allreduce_perf: the allreduce_perf table for MPI_Allreduce, to compare
// shmring with Open MPI on the same machine.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/mpi_allreduce_perf -b 8 -e 128M

#include <mpi.h>

#include "perf_common.hpp"

namespace {

using shmring::DataType;
using shmring::ReduceOp;

class MpiBackend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const char* name() const { return "mpi"; }
  // MPI has no 16-bit floating types and no average.
  bool supports(DataType t, ReduceOp op) const {
    return t != DataType::float16 && t != DataType::bfloat16 && op != ReduceOp::avg;
  }
  void allreduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    if (count > static_cast<std::size_t>(INT32_MAX))
      throw std::runtime_error(fmt::format("count {} exceeds MPI's int", count));
    int rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                           mpi_type(t), mpi_op(op), MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) throw std::runtime_error(fmt::format("MPI_Allreduce returned {}", rc));
  }
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  double max_over_ranks(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  }
  double sum_over_ranks(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return v;
  }

 private:
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
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"mpi_allreduce_perf: MPI_Allreduce bandwidth (run under mpirun)"};
  shmring::bench::PerfOptions o;
  shmring::bench::add_perf_options(app, o);
  int rc = 0;
  try {
    app.parse(argc, argv);
    shmring::bench::validate(o);
    MpiBackend b;
    rc = shmring::bench::run_allreduce_perf(b, o);
  } catch (const CLI::Error& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    rc = rank == 0 ? app.exit(e) : (e.get_exit_code() ? 1 : 0);
  } catch (const std::exception& e) {
    fmt::print(stderr, "mpi_allreduce_perf: {}\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
