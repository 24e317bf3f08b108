// mpi_hier_perf: the nccl-tests table for shmring's MPI layer (hierarchical
// collectives: shmring inside each node, MPI between nodes), run under
// mpirun, or on fake nodes on one machine:
//
//   tools/fake-nodes --nodes 2x2 -- build/bench/mpi_hier_perf -b 1M -e 64M
//   mpirun -np 16 --map-by ppr:8:node build/bench/mpi_hier_perf -C allreduce
//
// -a auto|leaders|shards|flat forces the allreduce algorithm (through
// SHMRING_MPI_ALGO; flat = plain MPI_Allreduce over every rank, the
// baseline). -C picks the collective. --stages adds, per size, the time of
// each stage of the shards allreduce measured alone (intra-node
// reduce-scatter, the cross-node MPI_Allreduce of one shard, intra-node
// allgather) and their sum, the cost model's prediction.

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <shmring/mpi.hpp>
#include <string>
#include <vector>

#include "perf_common.hpp"

namespace {

using shmring::DataType;
using shmring::ReduceOp;
using namespace shmring::bench;

class HierBackend final : public PerfBackend {
 public:
  HierBackend() : comm_(MPI_COMM_WORLD) {
    name_ = comm_.algorithm() == shmring::mpi::Algorithm::flat ? "mpi-flat" : "shmring-mpi";
  }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const char* name() const override { return name_.c_str(); }
  bool supports(DataType t, ReduceOp op) const override {
    return op != ReduceOp::avg || shmring::is_floating(t);
  }
  void allreduce(const void* s, void* r, std::size_t n, DataType t, ReduceOp op) override {
    comm_.allreduce(s, r, n, t, op);
  }
  void reduce_scatter(const void* s, void* r, std::size_t n, DataType t, ReduceOp op) override {
    comm_.reduce_scatter(s, r, n, t, op);
  }
  void allgather(const void* s, void* r, std::size_t n, DataType t) override {
    comm_.allgather(s, r, n, t);
  }
  void broadcast(void* b, std::size_t n, DataType t, int root) override {
    comm_.broadcast(b, n, t, root);
  }
  void reduce(const void* s, void* r, std::size_t n, DataType t, ReduceOp op, int root) override {
    comm_.reduce(s, r, n, t, op, root);
  }
  void barrier() override { comm_.barrier(); }
  double max_over_ranks(double v) override {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  }
  double sum_over_ranks(double v) override {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return v;
  }
  shmring::mpi::Communicator& comm() { return comm_; }

 private:
  shmring::mpi::Communicator comm_;
  std::string name_;
};

// The shards allreduce's stages, each timed alone on float32 sum: the
// measured parts of the cost model t = t_rs(S) + t_mpi(S/L) + t_ag(S)
// (the MPI part in calls of the layer's call_bytes, as the layer makes them).
void print_stages(HierBackend& b, const PerfOptions& o) {
  auto& comm = b.comm();
  const int L = comm.local_size();
  MPI_Comm cross;  // the bench's own copy of the layer's cross communicator
  MPI_Comm_split(MPI_COMM_WORLD, comm.local_rank(), comm.node(), &cross);
  auto& node = comm.node_communicator();
  auto time = [&](int iters, auto&& body) {
    body();
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) body();
    return b.max_over_ranks((MPI_Wtime() - t0) / iters * 1e6);
  };
  // The two shards scripts side by side: one piece (the stages one after
  // another) and pieces of the configured size (overlapped).
  shmring::mpi::Options blocking_options, pipelined_options;
  blocking_options.algorithm = pipelined_options.algorithm = "shards";
  blocking_options.piece_bytes = SIZE_MAX;
  // The default pieces unless SHMRING_MPI_PIECE_BYTES says otherwise: the
  // layer's automatic choice would turn the pipeline off where CPUs are few,
  // and this table shows what it would give there.
  if (std::getenv("SHMRING_MPI_PIECE_BYTES") == nullptr) pipelined_options.piece_bytes = 256 * 1024;
  shmring::mpi::Communicator blocking(MPI_COMM_WORLD, blocking_options);
  shmring::mpi::Communicator pipelined(MPI_COMM_WORLD, pipelined_options);
  if (b.rank() == 0)
    fmt::print(
        "#\n# Stages of the shards allreduce (float32 sum, in place, each alone; us, max over "
        "ranks); blocking = the\n# shards allreduce in one piece (predicted: sum), pipelined = in "
        "pieces of {} bytes\n# {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
        pipelined.piece_bytes(), "size", "rs_node", "mpi_shard", "ag_node", "sum", "blocking",
        "pipelined");
  for (double s = static_cast<double>(std::max<std::size_t>(o.min_bytes, 4 * L));
       s <= static_cast<double>(o.max_bytes) * 1.0000001; s *= o.factor) {
    const std::size_t count = static_cast<std::size_t>(s) / 4 / L * L, chunk = count / L;
    std::vector<float> buf(count, 1.0f);
    float* shard = buf.data() + chunk * comm.local_rank();
    const int iters = std::clamp(static_cast<int>(o.budget_bytes / (count * 4.0)), 3,
                                 std::max(3, o.iters > 0 ? o.iters : 20));
    const double rs = time(iters, [&] {
      node.reduce_scatter(buf.data(), shard, chunk, DataType::float32, ReduceOp::sum);
    });
    // In calls of the layer's size, as its MPI stage makes them.
    const std::size_t per_call =
        comm.call_bytes() ? std::max<std::size_t>(1, comm.call_bytes() / 4) : chunk;
    const double mpi = time(iters, [&] {
      for (std::size_t off = 0; off < chunk; off += per_call)
        MPI_Allreduce(MPI_IN_PLACE, shard + off, static_cast<int>(std::min(per_call, chunk - off)),
                      MPI_FLOAT, MPI_SUM, cross);
    });
    const double ag =
        time(iters, [&] { node.allgather(shard, buf.data(), chunk, DataType::float32); });
    const double one_piece = time(iters, [&] {
      blocking.allreduce(buf.data(), buf.data(), count, DataType::float32, ReduceOp::sum);
    });
    const double pieces = time(iters, [&] {
      pipelined.allreduce(buf.data(), buf.data(), count, DataType::float32, ReduceOp::sum);
    });
    if (b.rank() == 0)
      fmt::print("# {:>10} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n",
                 count * 4, rs, mpi, ag, rs + mpi + ag, one_piece, pieces);
  }
  MPI_Comm_free(&cross);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CLI::App app{"mpi_hier_perf: shmring's hierarchical collectives over MPI (run under mpirun)"};
  PerfOptions o;
  std::string coll_name = "allreduce";
  bool stages = false;
  add_perf_options(app, o, Collective::reduce);  // has -o and -r
  app.get_option("-a")->description(
      "Allreduce algorithm: auto, leaders, shards or flat (SHMRING_MPI_ALGO)");
  app.add_option("-C,--collective", coll_name,
                 "allreduce, reduce_scatter, allgather, broadcast or reduce")
      ->capture_default_str();
  app.add_flag("--stages", stages, "Also time the stages of the shards allreduce alone");
  int rc = 0;
  try {
    app.parse(argc, argv);
    validate(o);
    Collective coll = Collective::allreduce;
    bool known = false;
    for (Collective c : {Collective::allreduce, Collective::reduce_scatter, Collective::allgather,
                         Collective::broadcast, Collective::reduce})
      if (coll_name == info(c).name) coll = c, known = true;
    if (!known)
      throw CLI::ValidationError("-C", fmt::format("collective '{}': expected allreduce, "
                                                   "reduce_scatter, allgather, broadcast or reduce",
                                                   coll_name));
    if (o.algorithm != "auto") setenv("SHMRING_MPI_ALGO", o.algorithm.c_str(), 1);
    HierBackend b;
    if (rank == 0 && !o.csv && !o.json)
      fmt::print(
          "# shmring-mpi: {} ranks on {} nodes ({}), algorithm {}, shards from {} bytes, pieces of "
          "{}\n",
          b.size(), b.comm().num_nodes(), b.comm().balanced() ? "balanced" : "unbalanced",
          shmring::mpi::to_string(b.comm().algorithm()), b.comm().shards_bytes(),
          b.comm().piece_bytes());
    rc = run_perf(b, o, coll);
    if (stages && !o.csv && !o.json) print_stages(b, o);
  } catch (const CLI::Error& e) {
    rc = rank == 0 ? app.exit(e) : (e.get_exit_code() ? 1 : 0);
  } catch (const std::exception& e) {
    fmt::print(stderr, "mpi_hier_perf: rank {}: {}\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
