// What a timeout or a dead peer's message says about the whole job, read
// from every rank's flight recorder (docs/design/recorder.md), and the
// SHMRING_DUMP_DIR dump of those recorders as one JSON file.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/log.hpp"
#include "base/settings.hpp"
#include "core/state.hpp"
#include "transport/recorder_read.hpp"

namespace shmring {

namespace {

std::string call_name(const detail::RecordedCall& c) {
  return fmt::format("{} #{}", to_string(static_cast<CollectiveKind>(c.kind)), c.seq);
}

// "rank 3" / "ranks 0 and 3" / "ranks 0, 1 and 3"
std::string rank_list(const std::vector<int>& rs) {
  std::string s = rs.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (i > 0) s += i + 1 == rs.size() ? " and " : ", ";
    s += std::to_string(rs[i]);
  }
  return s;
}

double secs(std::uint64_t now, std::uint64_t then) {
  return then == 0 || now < then ? 0.0 : static_cast<double>(now - then) * 1e-9;
}

}  // namespace

std::string CommState::job_summary() {
  const std::uint64_t now = detail::mono_ns();
  const std::uint64_t c = collectives;
  const std::string mine =
      current ? fmt::format("{} #{}", to_string(current->kind), c) : fmt::format("call #{}", c);
  std::vector<std::string> parts;
  std::map<std::string, std::vector<int>> waiting;  // call -> ranks in it
  for (int r = 0; r < size; ++r) {
    const auto rec = detail::read_rank_record(seg->base(), seg->layout(), r);
    std::optional<detail::RecordedCall> in;  // the call it is in (its newest, if not ended)
    for (auto it = rec.history.rbegin(); it != rec.history.rend(); ++it) {
      if (it->state == detail::kCallQueued) continue;
      if (it->state == detail::kCallStarted || it->state == detail::kCallFailed) in = *it;
      break;
    }
    const auto last = rec.last_completed();
    // A dead rank's recorder still shows the call it was in: it waits for
    // nothing any more.
    const bool alive = seg->rank_alive(r);
    // A rank that is not alive either destroyed its communicator (it left)
    // or died; the two call for different fixes, so the text says which.
    const bool left =
        !alive && area(r).info.state.load(std::memory_order_acquire) == detail::kRankFinalized;
    const char* gone = alive ? "" : left ? " (left: destroyed its communicator)" : " (dead)";
    if (in && in->seq >= c && alive) {
      waiting[in->state == detail::kCallFailed ? call_name(*in) + " (failed)" : call_name(*in)]
          .push_back(r);
      continue;
    }
    std::string s;
    if (in && in->seq >= c)
      s = fmt::format("rank {}{} was in {}, which it started {:.1f} s ago", r, gone, call_name(*in),
                      secs(now, in->start_ns));
    else if (last && last->seq >= c)
      // A rank may finish a call before its peers do (an eager gather's
      // sender, a broadcast's root): it is past ours, not late for it.
      s = fmt::format("rank {}{} has completed {} and gone on", r, gone, mine);
    else
      s = fmt::format("rank {}{} has not entered {}", r, gone, mine);
    s += last ? fmt::format("; its last completed call was {}, {:.1f} s ago", call_name(*last),
                            secs(now, last->end_ns))
              : std::string("; it completed no call yet");
    if (in && in->seq < c)
      s += fmt::format("; it {} {} since {:.1f} s", alive ? "is in" : "was in", call_name(*in),
                       secs(now, in->start_ns));
    if (rec.p2p && rec.p2p->end_ns == 0)
      s += fmt::format("; it {} {} since {:.1f} s", alive ? "is in" : "was in",
                       detail::describe_p2p(*rec.p2p), secs(now, rec.p2p->start_ns));
    parts.push_back(s);
  }
  for (const auto& [call, ranks] : waiting)
    parts.push_back(
        fmt::format("{} {} in {}", rank_list(ranks), ranks.size() == 1 ? "waits" : "wait", call));
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::string CommState::dump_recorders(const std::string& reason) {
  const std::optional<std::string> dir_setting = detail::settings::text("SHMRING_DUMP_DIR");
  if (!dir_setting || dir_setting->empty()) return "";
  const char* dir = dir_setting->c_str();
  std::string base = seg->name();
  for (char& ch : base)
    if (ch == '/') ch = '_';
  while (!base.empty() && base.front() == '_') base.erase(0, 1);
  // One file per segment: ranks that time out in the same instant all name
  // it, the first of them writes it (the file says which: "reporter").
  const std::string path = fmt::format("{}/{}.json", dir, base);
  if (seg->header().dump_claimed.exchange(1, std::memory_order_acq_rel) != 0) return path;
  const std::uint64_t now = detail::mono_ns();
  nlohmann::json j;
  j["segment"] = seg->name();
  j["reporter"] = rank;
  j["world_size"] = size;
  j["reason"] = reason;
  j["clock"] = "CLOCK_MONOTONIC ns (add realtime_offset_ns for CLOCK_REALTIME)";
  j["now_ns"] = now;
  j["ranks"] = nlohmann::json::array();
  for (int r = 0; r < size; ++r) {
    const auto rec = detail::read_rank_record(seg->base(), seg->layout(), r);
    nlohmann::json jr;
    jr["rank"] = r;
    jr["pid"] = rec.pid;
    jr["alive"] = seg->rank_alive(r);
    jr["announced"] = rec.announced;
    jr["done"] = rec.done;
    jr["start_ns"] = rec.start_ns;
    jr["realtime_offset_ns"] = rec.realtime_offset_ns;
    jr["calls_completed"] = rec.calls;
    jr["bytes_completed"] = rec.bytes;
    jr["waiting_for"] = rec.wait_since_ns != 0 ? rec.waiting_for : -1;
    jr["wait_since_ns"] = rec.wait_since_ns;
    jr["step"] = rec.step;
    if (rec.p2p) {
      const auto& p = *rec.p2p;
      jr["p2p_calls"] = rec.p2p_calls;
      jr["p2p_last"] = {{"kind", p.is_send ? "send" : "recv"},
                        {"peer", p.peer},
                        {"tag", p.tag},
                        {"count", p.count},
                        {"dtype", std::string(to_string(static_cast<DataType>(p.dtype)))},
                        {"state", detail::call_state_name(p.state)},
                        {"start_ns", p.start_ns},
                        {"end_ns", p.end_ns}};
    }
    jr["calls"] = nlohmann::json::array();
    for (const auto& call : rec.history) {
      nlohmann::json jc;
      jc["seq"] = call.seq;
      jc["kind"] = to_string(static_cast<CollectiveKind>(call.kind));
      jc["count"] = call.count;
      jc["dtype"] = std::string(to_string(static_cast<DataType>(call.dtype)));
      jc["op"] = std::string(to_string(static_cast<ReduceOp>(call.op)));
      jc["root"] = call.root;
      jc["algorithm"] = to_string(static_cast<Algorithm>(call.algorithm));
      jc["bytes"] = call.bytes;
      jc["state"] = detail::call_state_name(call.state);
      jc["start_ns"] = call.start_ns;
      jc["end_ns"] = call.end_ns;
      jc["step"] = call.step;
      jr["calls"].push_back(std::move(jc));
    }
    j["ranks"].push_back(std::move(jr));
  }
  const std::string tmp = fmt::format("{}.{}.tmp", path, getpid());
  {
    std::ofstream f(tmp);
    f << j.dump(1) << '\n';
    if (!f.good()) {
      SHMRING_LOG(warn, "SHMRING_DUMP_DIR={}: cannot write {}: {}", dir, tmp, std::strerror(errno));
      std::remove(tmp.c_str());
      return "";
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return "";
  }
  return path;
}

}  // namespace shmring
