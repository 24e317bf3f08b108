// train_mlp: data-parallel training of an MLP on Fashion-MNIST across the
// ranks of a shmring job.
//
//   build/tools/shmrun -n 4 -- build/examples/train_mlp --epochs 4
//
// Data parallelism, step by step:
//  - Every rank holds the whole data set and the same model (same seed).
//  - Each epoch, every rank draws the same permutation of the training set
//    from (seed, epoch). Global batch g is order[g*B, (g+1)*B), whatever N.
//  - Rank r takes the disjoint shard order[g*B + r*B/N, ...) of it, cut into
//    `accum` micro-batches of B/(N*accum) samples; each micro-batch adds its
//    gradient *sum* into one flat buffer.
//  - The loss sum and correct count ride in the same buffer, so a step costs
//    exactly one allreduce (sum). Dividing by B then gives the gradient of the
//    global mean loss, exactly as one process with batch B would compute it
//    (up to float rounding), and the global mean loss of the step.
//  - Every rank applies the same SGD-with-momentum update to the same
//    (bitwise identical) averaged gradient, so parameters stay identical; the
//    final parameter hash printed by every rank checks that.

#include <fmt/format.h>
#include <shmring/shmring.hpp>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mlp.hpp"
#include "mnist.hpp"

namespace {

using shmring::examples::BatchStats;
using shmring::examples::Dataset;
using shmring::examples::Mlp;
using Clock = std::chrono::steady_clock;
constexpr double kPi = 3.14159265358979323846;

struct Settings {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 8;
  std::size_t batch = 256;  // global batch per optimizer step (all ranks, all micro-batches)
  int accum = 1;
  float lr = 0.1f;
  float momentum = 0.9f;
  int hidden = 256;
  std::uint64_t seed = 1;
  std::size_t max_steps = 0;  // 0: no limit
  std::size_t limit = 0;      // training samples used; 0: all
  std::size_t test_limit = 0;
  bool print_step_loss = false;
  bool cosine = true;      // cosine decay of the learning rate to 0 over all epochs
  bool split_skew = true;  // a barrier before each allreduce separates skew from data time
};

/// This thread's time runnable but waiting for a CPU so far, in ns (the
/// second field of /proc/thread-self/schedstat: run-queue delay); -1 where
/// the kernel does not keep it.
std::int64_t run_queue_delay_ns() {
  std::FILE* f = std::fopen("/proc/thread-self/schedstat", "r");
  if (f == nullptr) return -1;
  unsigned long long on_cpu = 0, waiting = 0;
  const int got = std::fscanf(f, "%llu %llu", &on_cpu, &waiting);
  std::fclose(f);
  // Without scheduler accounting the kernel writes "0 0 0".
  return got == 2 && on_cpu > 0 ? static_cast<std::int64_t>(waiting) : -1;
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Every rank reports its own error line, tagged with its rank, so a failure is
// visible however shmrun interleaves the streams.
void report(int rank, const std::string& what) {
  fmt::print(stderr, "train_mlp: rank {}: error: {}\n", rank, what);
  std::fflush(stderr);
}

// For an error every rank finds alike: report it, then wait until every rank
// has reported, so that the first rank to exit does not have shmrun stop the
// others before they print.
void report_all(shmring::Communicator& comm, const std::string& what) {
  report(comm.rank(), what);
  try {
    comm.barrier();
  } catch (const shmring::Error&) {
    // A peer already left: nothing more to wait for.
  }
}

// All ranks load the data, then agree: if any rank failed, all stop together,
// each having printed why (every rank reads the same files, so each names the
// bad one itself). Without the agreement, the first rank to exit would have
// shmrun kill the others before they could say anything.
bool load_data(shmring::Communicator& comm, const Settings& s, Dataset& train, Dataset& test) {
  std::string error;
  try {
    train = shmring::examples::load_split(s.data_dir, "train");
    test = shmring::examples::load_split(s.data_dir, "t10k");
    if (train.rows != test.rows || train.cols != test.cols)
      throw shmring::examples::DataError(
          fmt::format("training images are {}x{} but test images are {}x{} (in {})", train.rows,
                      train.cols, test.rows, test.cols, s.data_dir));
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::int32_t ok = error.empty() ? 1 : 0;
  comm.allreduce(std::span<std::int32_t>(&ok, 1), shmring::ReduceOp::min);
  if (ok) return true;
  report_all(comm, error.empty() ? "stopping: another rank could not load the data" : error);
  return false;
}

// Mean loss and accuracy on the test set, each rank evaluating one shard.
// Returns {loss_sum, correct} summed over all ranks.
std::pair<double, double> evaluate(shmring::Communicator& comm, Mlp& model, const Dataset& test,
                                   std::size_t count) {
  const std::size_t lo = count * std::size_t(comm.rank()) / std::size_t(comm.size());
  const std::size_t hi = count * std::size_t(comm.rank() + 1) / std::size_t(comm.size());
  constexpr std::size_t kEvalBatch = 1000;
  std::vector<std::uint32_t> index;
  Eigen::MatrixXf x;
  std::vector<std::uint8_t> y;
  double sums[2] = {0, 0};
  for (std::size_t b = lo; b < hi; b += kEvalBatch) {
    index.resize(std::min(kEvalBatch, hi - b));
    std::iota(index.begin(), index.end(), static_cast<std::uint32_t>(b));
    shmring::examples::gather(test, index, x, y);
    const BatchStats st = model.forward(x, y);
    sums[0] += st.loss_sum;
    sums[1] += double(st.correct);
  }
  comm.allreduce(std::span<double>(sums, 2), shmring::ReduceOp::sum);
  return {sums[0], sums[1]};
}

int train(shmring::Communicator& comm, const Settings& s) {
  const int rank = comm.rank();
  const std::size_t world = std::size_t(comm.size());
  const bool lead = rank == 0;

  // Settings every rank checks alike, so every rank prints the same error.
  const std::size_t parts = world * std::size_t(s.accum);
  if (s.batch % parts != 0) {
    const std::size_t below = s.batch / parts * parts;
    report_all(comm, fmt::format("--batch {} must be divisible by world size {} x --accum {} = {} "
                                 "(the nearest that are: {}{})",
                                 s.batch, world, s.accum, parts,
                                 below > 0 ? fmt::format("{} or ", below) : "", below + parts));
    return 2;
  }

  Dataset train_set, test_set;
  if (!load_data(comm, s, train_set, test_set)) return 1;

  const std::size_t n_train = s.limit ? std::min(s.limit, train_set.size()) : train_set.size();
  const std::size_t n_test =
      s.test_limit ? std::min(s.test_limit, test_set.size()) : test_set.size();
  const std::size_t steps_per_epoch = n_train / s.batch;
  if (steps_per_epoch == 0) {
    report_all(comm, fmt::format("--batch {} is larger than the {} training samples in use",
                                 s.batch, n_train));
    return 2;
  }
  const std::size_t shard = s.batch / world;
  const std::size_t micro = shard / std::size_t(s.accum);

  Mlp model(train_set.pixels(), s.hidden, shmring::examples::kClasses);
  model.init(s.seed);
  const std::size_t n_params = model.param_count();
  // [gradient sums | loss sum | correct count]: the one buffer of the step.
  std::vector<float> step_buf(n_params + 2);
  std::vector<float> velocity(n_params, 0.0f);

  if (lead)
    fmt::print(
        "train_mlp: {} rank(s); MLP {}-{}-{} ({} parameters); {} training / {} test samples\n"
        "train_mlp: global batch {} = {} rank(s) x {} micro-batch(es) x {}; {} steps/epoch; "
        "SGD lr {} ({}) momentum {}; seed {}\n",
        world, model.in(), model.hidden(), model.out(), n_params, n_train, n_test, s.batch, world,
        s.accum, micro, steps_per_epoch, s.lr, s.cosine ? "cosine decay" : "constant", s.momentum,
        s.seed);
  if (lead && static_cast<int>(world) > comm.config().job_cpus)
    fmt::print(
        "train_mlp: {} ranks on {} CPU(s): the ranks outnumber the CPUs, so a rank still in an "
        "allreduce can wait for a CPU that a peer's compute holds (the 'runnable but not running' "
        "part below; docs/guide/tuning.md, \"Oversubscription\")\n",
        world, comm.config().job_cpus);

  std::vector<std::uint32_t> order(train_set.size());
  std::iota(order.begin(), order.end(), 0u);
  std::vector<std::uint32_t> index(micro);
  Eigen::MatrixXf x;
  std::vector<std::uint8_t> y;
  std::size_t step = 0;
  const std::size_t total_steps = steps_per_epoch * std::size_t(s.epochs);
  double final_accuracy = 0;
  const auto t_start = Clock::now();

  for (int epoch = 1; epoch <= s.epochs && (s.max_steps == 0 || step < s.max_steps); ++epoch) {
    // The same permutation on every rank and for every N: a function of (seed, epoch).
    std::seed_seq seq{std::uint32_t(s.seed), std::uint32_t(s.seed >> 32), std::uint32_t(epoch)};
    std::mt19937_64 gen(seq);
    std::iota(order.begin(), order.begin() + std::ptrdiff_t(n_train), 0u);
    std::shuffle(order.begin(), order.begin() + std::ptrdiff_t(n_train), gen);

    double loss_sum = 0, correct = 0, samples = 0;
    Clock::duration step_time{}, allreduce_time{}, skew_time{};
    // Per step: when this rank left the barrier that absorbs the ranks' skew
    // (steady_clock is CLOCK_MONOTONIC, one clock for every process of the
    // machine) and when its allreduce returned, in ns. The data time counts
    // from the last rank's exit: a rank that the barrier wakes late would
    // otherwise bill its wake-up to the others' data time.
    std::vector<std::int64_t> t_start_ns, t_end_ns;
    // Per step: this rank's run-queue delay during its allreduce (us).
    std::vector<double> cpu_wait_us;
    const auto t_epoch = Clock::now();
    for (std::size_t g = 0; g < steps_per_epoch && (s.max_steps == 0 || step < s.max_steps);
         ++g, ++step) {
      const auto t0 = Clock::now();
      std::fill(step_buf.begin(), step_buf.end(), 0.0f);
      const std::span<float> grad(step_buf.data(), n_params);
      double local_loss = 0, local_correct = 0;
      for (int k = 0; k < s.accum; ++k) {
        const std::size_t base = g * s.batch + std::size_t(rank) * shard + std::size_t(k) * micro;
        std::copy_n(order.begin() + std::ptrdiff_t(base), micro, index.begin());
        shmring::examples::gather(train_set, index, x, y);
        const BatchStats st = model.forward_backward(x, y, grad);
        local_loss += st.loss_sum;
        local_correct += double(st.correct);
      }
      step_buf[n_params] = float(local_loss);
      step_buf[n_params + 1] = float(local_correct);

      // The barrier takes the time spent waiting for the slowest rank (skew:
      // its compute ran longer), so that t1..t2 is the data moving alone.
      const auto t_arrive = Clock::now();
      if (s.split_skew) comm.barrier();
      const std::int64_t delay0 = run_queue_delay_ns();
      const auto t1 = Clock::now();
      comm.allreduce(std::span<float>(step_buf), shmring::ReduceOp::sum);
      const auto t2 = Clock::now();
      const std::int64_t delay1 = run_queue_delay_ns();
      if (delay0 >= 0 && delay1 >= 0) cpu_wait_us.push_back(double(delay1 - delay0) / 1e3);
      skew_time += t1 - t_arrive;
      t_start_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(t1.time_since_epoch()).count());
      t_end_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(t2.time_since_epoch()).count());

      // Mean gradient of the global batch, then SGD with momentum
      // (v = mu v + g; p -= lr v), identical on every rank.
      const float scale = 1.0f / float(s.batch);
      const float lr =
          s.cosine ? s.lr * 0.5f * float(1.0 + std::cos(kPi * double(step) / double(total_steps)))
                   : s.lr;
      Eigen::Map<Eigen::ArrayXf> gsum(step_buf.data(), Eigen::Index(n_params));
      Eigen::Map<Eigen::ArrayXf> v(velocity.data(), Eigen::Index(n_params));
      Eigen::Map<Eigen::ArrayXf> p(model.params().data(), Eigen::Index(n_params));
      v = s.momentum * v + scale * gsum;
      p -= lr * v;
      const auto t3 = Clock::now();

      step_time += t3 - t0;
      allreduce_time += t2 - t1;
      loss_sum += step_buf[n_params];
      correct += step_buf[n_params + 1];
      samples += double(s.batch);
      if (s.print_step_loss && lead)
        fmt::print("step {} loss {:.9g}\n", step + 1, double(step_buf[n_params]) * scale);
    }
    const double epoch_s = seconds(Clock::now() - t_epoch);

    const auto [test_loss, test_correct] = evaluate(comm, model, test_set, n_test);
    // The allreduce share: mean over ranks, and its spread. A rank that waits
    // for a slower one counts that wait as allreduce time, so the rank with the
    // lowest share is the one closest to the pure cost of the collective.
    double times[2] = {seconds(allreduce_time + skew_time), seconds(step_time)};
    comm.allreduce(std::span<double>(times, 2), shmring::ReduceOp::sum);
    // Skew and data time per step, the worst rank's (max over ranks): data
    // from the last rank's exit from the barrier (all), and from this rank's
    // own exit (own: what a single process sees, wake-up lag included).
    std::vector<std::int64_t> last_start = t_start_ns;
    if (!last_start.empty())
      comm.allreduce(std::span<std::int64_t>(last_start), shmring::ReduceOp::max);
    std::vector<double> data_us(t_end_ns.size()), own_us(t_end_ns.size());
    for (std::size_t i = 0; i < t_end_ns.size(); ++i) {
      data_us[i] = double(t_end_ns[i] - last_start[i]) / 1e3;
      own_us[i] = double(t_end_ns[i] - t_start_ns[i]) / 1e3;
    }
    std::sort(data_us.begin(), data_us.end());
    std::sort(own_us.begin(), own_us.end());
    const double nsteps = std::max<double>(1, double(data_us.size()));
    auto median = [](const std::vector<double>& v) {
      return v.empty() ? 0.0 : v[(v.size() - 1) / 2];
    };
    std::sort(cpu_wait_us.begin(), cpu_wait_us.end());
    double parts[5] = {seconds(skew_time) * 1e6 / nsteps, median(data_us),
                       std::accumulate(data_us.begin(), data_us.end(), 0.0) / nsteps,
                       median(own_us), cpu_wait_us.empty() ? -1.0 : median(cpu_wait_us)};
    comm.allreduce(std::span<double>(parts, 5), shmring::ReduceOp::max);
    const double own_share =
        step_time.count() > 0 ? seconds(allreduce_time + skew_time) / seconds(step_time) : 0.0;
    double share_min = own_share, share_max = own_share;
    comm.allreduce(std::span<double>(&share_min, 1), shmring::ReduceOp::min);
    comm.allreduce(std::span<double>(&share_max, 1), shmring::ReduceOp::max);
    final_accuracy = 100.0 * test_correct / double(n_test);
    if (lead && samples > 0)
      fmt::print(
          "epoch {:>2}/{}  loss {:.4f}  train_acc {:.2f}%  test_loss {:.4f}  test_acc {:.2f}%  "
          "samples/s {:.0f}  allreduce {:.1f}% of step time (ranks {:.0f}-{:.0f}%)  ({:.1f} s)\n",
          epoch, s.epochs, loss_sum / samples, 100.0 * correct / samples,
          test_loss / double(n_test), final_accuracy, samples / epoch_s,
          times[1] > 0 ? 100.0 * times[0] / times[1] : 0.0, 100.0 * share_min, 100.0 * share_max,
          epoch_s);
    if (lead && samples > 0 && s.split_skew)
      fmt::print(
          "           allreduce of {} bytes per step: waiting for the slowest rank {:.1f} us, "
          "moving data {:.1f} us median / {:.1f} us mean once the last rank left the barrier, "
          "{:.1f} us median from its own exit (worst rank)\n",
          step_buf.size() * sizeof(float), parts[0], parts[1], parts[2], parts[3]);
    if (lead && samples > 0 && s.split_skew && parts[4] >= 0)
      fmt::print(
          "           of the allreduce's time, runnable but not running (yielding to a peer, or "
          "waiting for a CPU a peer holds): {:.1f} us median (worst rank; "
          "/proc/thread-self/schedstat)\n",
          parts[4]);
    std::fflush(stdout);
  }

  if (lead)
    fmt::print("final test accuracy: {:.2f}% after {} steps in {:.1f} s\n", final_accuracy, step,
               seconds(Clock::now() - t_start));
  std::fflush(stdout);
  // Ranks print in turn (allreduce as a barrier) so the hash lines are not torn.
  for (int r = 0; r < comm.size(); ++r) {
    if (r == rank) {
      fmt::print("rank {} param_hash {:016x}\n", rank, shmring::examples::fnv1a(model.params()));
      std::fflush(stdout);
    }
    std::int32_t token = 0;
    comm.allreduce(std::span<std::int32_t>(&token, 1), shmring::ReduceOp::sum);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train_mlp: data-parallel MLP training on Fashion-MNIST over shmring"};
  Settings s;
  app.add_option("--data", s.data_dir, "Directory with the Fashion-MNIST IDX files (.gz or raw)")
      ->capture_default_str();
  app.add_option("--epochs", s.epochs, "Passes over the training set")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--batch", s.batch,
                 "Global batch per optimizer step, over all ranks and micro-batches; "
                 "must be divisible by world size x accum")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--accum", s.accum, "Micro-batches whose gradients add up before each allreduce")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--lr", s.lr, "SGD learning rate")
      ->check(CLI::Range(0.0f, 100.0f))
      ->capture_default_str();
  app.add_option("--momentum", s.momentum, "SGD momentum")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  app.add_option("--hidden", s.hidden, "Hidden layer width")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--seed", s.seed, "Seed of the initial weights and the batch order")
      ->capture_default_str();
  app.add_option("--max-steps", s.max_steps, "Stop after this many optimizer steps (0: no limit)")
      ->capture_default_str();
  app.add_option("--limit", s.limit, "Use only the first N training samples (0: all)")
      ->capture_default_str();
  app.add_option("--test-limit", s.test_limit, "Evaluate on the first N test samples (0: all)")
      ->capture_default_str();
  app.add_flag("!--constant-lr", s.cosine,
               "Keep the learning rate constant (default: cosine decay to 0 over --epochs)");
  app.add_flag("!--no-skew", s.split_skew,
               "Skip the barrier before each allreduce that splits its time into waiting for "
               "the slowest rank and moving data");
  app.add_flag("--print-step-loss", s.print_step_loss,
               "Rank 0 prints 'step S loss L' (global mean loss) after every step");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<shmring::Communicator> comm;
  try {
    comm = std::make_unique<shmring::Communicator>();  // rank, world size, job id from shmrun
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_mlp: error: {}\n", e.what());
    return 1;
  }
  try {
    return train(*comm, s);
  } catch (const shmring::Error& e) {
    // A collective failure already reaches every rank as its own error.
    report(comm->rank(), e.what());
    return 1;
  } catch (const std::exception& e) {
    // A local failure: abort the job so the other ranks stop at once with this
    // reason instead of waiting for their deadline.
    report(comm->rank(), e.what());
    comm->abort(fmt::format("rank {}: {}", comm->rank(), e.what()));
    return 1;
  }
}
