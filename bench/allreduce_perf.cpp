// allreduce_perf: the nccl-tests allreduce table for shmring, plus the
// "floor" (every rank copying its buffer once, concurrently).
//
//   build/tools/shmrun -n 2 -- build/bench/allreduce_perf -b 8 -e 128M -f 4
//
// `-a ring|direct` asks the library for one algorithm through SHMRING_ALGO
// (the variable the core reads to force a path); `-a auto` leaves it alone.

#include <cstdlib>
#include <shmring/shmring.hpp>

#include "perf_common.hpp"

namespace {

class ShmringBackend {
 public:
  ShmringBackend() = default;
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  const char* name() const { return "shmring"; }
  bool supports(shmring::DataType t, shmring::ReduceOp op) const {
    return op != shmring::ReduceOp::avg || shmring::is_floating(t);
  }
  void allreduce(const void* send, void* recv, std::size_t count, shmring::DataType t,
                 shmring::ReduceOp op) {
    comm_.allreduce(send, recv, count, t, op);
  }
  // A one-element allreduce is a barrier: nobody leaves before everybody came.
  void barrier() {
    float x = 0;
    comm_.allreduce(std::span<float>(&x, 1), shmring::ReduceOp::sum);
  }
  double max_over_ranks(double v) {
    comm_.allreduce(std::span<double>(&v, 1), shmring::ReduceOp::max);
    return v;
  }
  double sum_over_ranks(double v) {
    comm_.allreduce(std::span<double>(&v, 1), shmring::ReduceOp::sum);
    return v;
  }

 private:
  shmring::Communicator comm_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"allreduce_perf: shmring allreduce bandwidth (run under shmrun)"};
  shmring::bench::PerfOptions o;
  shmring::bench::add_perf_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    shmring::bench::validate(o);
    if (o.algorithm != "auto") {
      if (o.algorithm != "ring" && o.algorithm != "direct")
        throw CLI::ValidationError(
            fmt::format("-a '{}': expected auto, ring or direct", o.algorithm));
      setenv("SHMRING_ALGO", o.algorithm.c_str(), 1);
    }
    ShmringBackend b;
    return shmring::bench::run_allreduce_perf(b, o);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "allreduce_perf: {}\n", e.what());
    return 1;
  }
}
