// The shmring side of the *_perf benchmarks: a backend over
// shmring::Communicator for the driver (perf_common.hpp) and the main()
// every <collective>_perf.cpp calls. `-a ring|direct|two_shot` asks the
// library for one algorithm through SHMRING_ALGO (the variable the core reads
// to force a path), set before the communicator reads its configuration;
// `-a auto` leaves it alone.

#include "shmring_perf.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <shmring/shmring.hpp>
#include <span>
#include <string>

namespace shmring::bench {

namespace {

class ShmringBackend final : public PerfBackend {
 public:
  ShmringBackend() = default;
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const char* name() const override { return "shmring"; }
  bool supports(DataType t, ReduceOp op) const override {
    return op != ReduceOp::avg || is_floating(t);
  }
  void allreduce(const void* send, void* recv, std::size_t count, DataType t,
                 ReduceOp op) override {
    comm_.allreduce(send, recv, count, t, op);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType t,
                      ReduceOp op) override {
    comm_.reduce_scatter(send, recv, recv_count, t, op);
  }
  void allgather(const void* send, void* recv, std::size_t send_count, DataType t) override {
    comm_.allgather(send, recv, send_count, t);
  }
  void broadcast(void* buffer, std::size_t count, DataType t, int root) override {
    comm_.broadcast(buffer, count, t, root);
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
              int root) override {
    comm_.reduce(send, recv, count, t, op, root);
  }
  void alltoall(const void* send, void* recv, std::size_t count, DataType t) override {
    comm_.alltoall(send, recv, count, t);
  }
  void alltoallv(const void* send, std::span<const std::size_t> send_counts,
                 std::span<const std::size_t> send_displs, void* recv,
                 std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                 DataType t) override {
    comm_.alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  }
  void gather(const void* send, void* recv, std::size_t count, DataType t, int root) override {
    comm_.gather(send, recv, count, t, root);
  }
  void scatter(const void* send, void* recv, std::size_t count, DataType t, int root) override {
    comm_.scatter(send, recv, count, t, root);
  }
  void allgatherv(const void* send, std::size_t send_count, void* recv,
                  std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
                  DataType t) override {
    comm_.allgatherv(send, send_count, recv, recv_counts, displs, t);
  }
  void barrier() override { comm_.barrier(); }
  double max_over_ranks(double v) override {
    comm_.allreduce(std::span<double>(&v, 1), ReduceOp::max);
    return v;
  }
  double sum_over_ranks(double v) override {
    comm_.allreduce(std::span<double>(&v, 1), ReduceOp::sum);
    return v;
  }

 private:
  Communicator comm_;
};

}  // namespace

// main() of <collective>_perf: parse the options, force the algorithm, run.
int shmring_perf_main(int argc, char** argv, Collective coll) {
  const std::string prog = fmt::format("{}_perf", info(coll).name);
  CLI::App app{fmt::format("{}: shmring {} bandwidth (run under shmrun)", prog, info(coll).name)};
  PerfOptions o;
  add_perf_options(app, o, coll);
  CLI11_PARSE(app, argc, argv);
  try {
    validate(o);
    if (o.algorithm != "auto") {
      if (o.algorithm != "ring" && o.algorithm != "direct" && o.algorithm != "two_shot")
        throw CLI::ValidationError(
            fmt::format("-a '{}': expected auto, ring, direct or two_shot", o.algorithm));
      setenv("SHMRING_ALGO", o.algorithm.c_str(), 1);
    }
    ShmringBackend b;
    return run_perf(b, o, coll);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", prog, e.what());
    return 1;
  }
}

}  // namespace shmring::bench
