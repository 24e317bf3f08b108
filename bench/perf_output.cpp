// The output of the *_perf tools on rank 0: nccl-tests' table (header,
// one row per size, the summary run_perf prints), or CSV, or JSON. Other
// scripts parse all three (bench/compare, bench/fresh_runs, bench/dtype_ratio).

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "perf_internal.hpp"

namespace shmring::bench {

// allreduce_perf keeps the table, CSV and JSON it always had (bench/compare
// reads them); the other collectives add nccl-tests' root column (-1 where
// there is none) and, in CSV and JSON, the collective's name.
namespace {

const char* size_column(Collective c) {
  switch (c) {
    case Collective::allgather:
    case Collective::allgatherv:
      return "recv (ranks x count)";
    case Collective::reduce_scatter:
      return "send (ranks x count)";
    case Collective::alltoall:
    case Collective::alltoallv:
      return "send = recv (ranks x count)";
    case Collective::gather:
      return "root's recv (ranks x count)";
    case Collective::scatter:
      return "root's send (ranks x count)";
    default:
      return "buffer";
  }
}

const char* count_column(Collective c) {
  switch (c) {
    case Collective::alltoall:
      return " (per peer)";
    case Collective::alltoallv:
    case Collective::allgatherv:
      return " (per rank, on average)";
    default:
      return blocks(c, 2) > 1 ? " (per rank)" : "";
  }
}

}  // namespace

void print_header(const PerfOptions& o, const char* backend, int nranks, Collective coll) {
  const bool extra = coll != Collective::allreduce;
  if (o.csv) {
    fmt::print(
        "backend,nranks,size,count,type,redop,iters,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
        "ip_time_us,ip_algbw,ip_busbw,ip_wrong,floor_us,floor_ratio{},ip_first_us,ip_min_us,"
        "ip_med_us,ip_max_us,oop_first_us,oop_min_us,oop_med_us,oop_max_us\n",
        extra ? ",collective,root" : "");
    return;
  }
  if (o.json) return;
  fmt::print(
      "# {} {}_perf: {} ranks, minBytes {} maxBytes {} step factor {} {} check {} "
      "algorithm {}{}{}\n",
      backend, info(coll).name, nranks, o.min_bytes, o.max_bytes, o.factor,
      fmt::format("{} rounds of {}, warm-up {}", o.rounds,
                  o.iters > 0 ? fmt::format("{} calls", o.iters)
                              : fmt::format("{:g} s / {} (at least)", o.min_time_s, o.rounds),
                  o.warmup >= 0 ? fmt::format("{} calls", o.warmup)
                                : fmt::format("{:g} s", std::max(1e-3, o.min_time_s / 10))),
      o.check, o.algorithm, info(coll).has_root ? fmt::format(" root {}", o.root) : "",
      o.vary ? " (cache-cold: -I)" : "");
  if (extra)
    fmt::print("# size = {} bytes, count = elements per call{}; busbw = algbw x {}\n",
               size_column(coll), count_column(coll),
               coll == Collective::broadcast || coll == Collective::reduce ? "1" : "(n-1)/n");
  if (coll == Collective::alltoallv || coll == Collective::allgatherv)
    fmt::print("# counts: {}\n",
               coll == Collective::alltoallv
                   ? "uneven: rank i sends f((j-i) mod n) to rank j, f(k) ~ (k+1) x 2 count/(n+1)"
               : o.even ? "even: count from every rank"
                        : "uneven: rank r sends f(r) ~ (r+1) x 2 count/(n+1)");
  const bool ip = has_in_place_phase(o, coll);
  fmt::print(
      "# floor = every rank copies its buffer once, concurrently (memcpy); "
      "floor/{0} = floor time / {1} time\n"
      "# time = mean over all timed calls; {1} first = the first call of the size, "
      "min/med/max = over the rounds' means\n#\n",
      ip ? "ip" : "oop", ip ? "in-place" : "out-of-place");
  const std::string root_h = extra ? fmt::format(" {:>4}", "root") : "";
  const std::string root_u = extra ? fmt::format(" {:>4}", "") : "";
  fmt::print("#{:>{}} {:>32} {:>32} {:>18} {:>39}\n", "", extra ? 48 : 43, "out-of-place",
             "in-place", "", ip ? "in-place spread" : "out-of-place spread");
  fmt::print(
      "#{:>11} {:>12} {:>8} {:>6}{} {:>4} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6} "
      "{:>9} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
      "size", "count", "type", "redop", root_h, "n", "time", "algbw", "busbw", "#wrong", "time",
      "algbw", "busbw", "#wrong", "floor", ip ? "floor/ip" : "floor/oop", "first", "min", "med",
      "max");
  fmt::print(
      "#{:>11} {:>12} {:>8} {:>6}{} {:>4} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6} "
      "{:>9} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
      "(B)", "(elements)", "", "", root_u, "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
      "(GB/s)", "", "(us)", "", "(us)", "(us)", "(us)", "(us)");
}

namespace {

std::string wrong_str(const PerfOptions& o, long long w) {
  return o.check ? fmt::format("{}", w) : std::string("N/A");
}

}  // namespace

void print_row(const PerfOptions& o, const RowLabels& l, const Row& r, bool first) {
  // The floor ratio and the spread columns are the in-place phase's, or the
  // out-of-place one's where there is no in-place phase.
  const Timing& main = l.has_ip ? r.ip : r.oop;
  const double ratio = main.us > 0 && r.floor_us > 0 ? r.floor_us / main.us : 0;
  const bool extra = l.coll != Collective::allreduce;
  if (o.csv) {
    const std::string oop = l.has_oop ? fmt::format("{:.3f},{:.4f},{:.4f},{}", r.oop.us,
                                                    r.oop.algbw, r.oop.busbw, r.oop.wrong)
                                      : std::string(",,,");
    auto spread = [](const Timing& t) {
      return fmt::format("{:.3f},{:.3f},{:.3f},{:.3f}", t.first_us, t.min_us, t.med_us, t.max_us);
    };
    const std::string ip = l.has_ip ? fmt::format("{:.3f},{:.4f},{:.4f},{}", r.ip.us, r.ip.algbw,
                                                  r.ip.busbw, r.ip.wrong)
                                    : std::string(",,,");
    fmt::print("{},{},{},{},{},{},{},{},{},{:.3f},{:.4f}{},{},{}\n", l.backend, l.nranks, r.bytes,
               r.count, l.type, l.op, r.iters, oop, ip, r.floor_us, ratio,
               extra ? fmt::format(",{},{}", info(l.coll).name, l.root) : "",
               l.has_ip ? spread(r.ip) : std::string(",,,"),
               l.has_oop ? spread(r.oop) : std::string(",,,"));
  } else if (o.json) {
    const std::string oop =
        l.has_oop ? fmt::format(
                        "{{\"time_us\": {:.3f}, \"algbw\": {:.4f}, \"busbw\": {:.4f}, "
                        "\"wrong\": {}}}",
                        r.oop.us, r.oop.algbw, r.oop.busbw, r.oop.wrong)
                  : std::string("null");
    fmt::print(
        "{}\n  {{{}\"backend\": \"{}\", \"nranks\": {}, \"size\": {}, \"count\": {}, "
        "\"type\": \"{}\", \"redop\": \"{}\", {}\"iters\": {}, "
        "\"out_of_place\": {}, "
        "\"in_place\": {}, \"floor_us\": {:.3f}, \"floor_ratio\": {:.4f}}}",
        first ? "[" : ",", extra ? fmt::format("\"collective\": \"{}\", ", info(l.coll).name) : "",
        l.backend, l.nranks, r.bytes, r.count, l.type, l.op,
        extra ? fmt::format("\"root\": {}, ", l.root) : "", r.iters, oop,
        l.has_ip ? fmt::format("{{\"time_us\": {:.3f}, \"algbw\": {:.4f}, \"busbw\": {:.4f}, "
                               "\"wrong\": {}, \"first_us\": {:.3f}, \"min_us\": {:.3f}, "
                               "\"med_us\": {:.3f}, \"max_us\": {:.3f}}}",
                               r.ip.us, r.ip.algbw, r.ip.busbw, r.ip.wrong, r.ip.first_us,
                               r.ip.min_us, r.ip.med_us, r.ip.max_us)
                 : std::string("null"),
        r.floor_us, ratio);
  } else {
    const std::string root = extra ? fmt::format(" {:>4}", l.root) : "";
    const std::string oop = l.has_oop
                                ? fmt::format("{:>9.2f} {:>7.2f} {:>7.2f} {:>6}", r.oop.us,
                                              r.oop.algbw, r.oop.busbw, wrong_str(o, r.oop.wrong))
                                : fmt::format("{:>9} {:>7} {:>7} {:>6}", "-", "-", "-", "-");
    const std::string ip = l.has_ip ? fmt::format("{:>9.2f} {:>7.2f} {:>7.2f} {:>6}", r.ip.us,
                                                  r.ip.algbw, r.ip.busbw, wrong_str(o, r.ip.wrong))
                                    : fmt::format("{:>9} {:>7} {:>7} {:>6}", "-", "-", "-", "-");
    fmt::print(
        " {:>11} {:>12} {:>8} {:>6}{} {:>4} {} {} {:>9.2f} {:>8.2f} {:>9.2f} {:>9.2f} {:>9.2f} "
        "{:>9.2f}\n",
        r.bytes, r.count, l.type, l.op, root, l.nranks, oop, ip, r.floor_us, ratio, main.first_us,
        main.min_us, main.med_us, main.max_us);
  }
  std::fflush(stdout);
}

}  // namespace shmring::bench
