// Adversarial tests of the staged collectives' single-copy round
// (src/algorithms/staged/staged.cpp "Single copy"): alltoall, gather, scatter, allgather and
// allgatherv whose largest block is 64-256 KiB read the writers' buffers with process_vm_readv at
// N=2 when the job is not oversubscribed. Every result is compared with a serial reference; the
// edges probed are odd element sizes and unaligned buffers, i-forms in flight together,
// interleaving with other collectives and point-to-point, one rank with SHMRING_CMA=0, a writer
// that overwrites its buffer right after return, a writer killed while its peer still has to read
// it, oversubscribed jobs (N=3, or N=2 on one CPU), split communicators and ranks that are parent
// and child.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "shmring/shmring.hpp"

using namespace shmring;

namespace {

// One byte of a value distinct in practice per (rank, byte index, salt): a
// 64-bit mix, so that a block read from a wrong offset, a wrong rank or an
// earlier call fails with overwhelming probability.
std::uint8_t pat(int rank, std::size_t i, std::uint64_t salt) {
  std::uint64_t x = (static_cast<std::uint64_t>(rank) << 56) ^ (salt << 40) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint8_t>(x);
}

// A byte buffer whose data starts `skew` bytes past an aligned allocation.
struct Buf {
  std::vector<std::uint8_t> store;
  std::size_t skew;
  Buf(std::size_t bytes, std::size_t skew_, std::uint8_t fill = 0xa5)
      : store(bytes + skew_ + 64, fill), skew(skew_) {}
  std::uint8_t* data() { return store.data() + skew; }
  std::uint8_t& operator[](std::size_t i) { return store[skew + i]; }
};

void fill(Buf& b, int rank, std::size_t bytes, std::uint64_t salt, std::size_t from = 0) {
  for (std::size_t i = 0; i < bytes; ++i) b[i] = pat(rank, from + i, salt);
}

// Checks `bytes` of `got` against rank `rank`'s pattern from byte `from`.
void expect(const std::uint8_t* got, int rank, std::size_t from, std::size_t bytes,
            std::uint64_t salt, const char* what, std::size_t a, std::size_t b) {
  for (std::size_t i = 0; i < bytes; ++i)
    SHMRING_CHILD_CHECK(got[i] == pat(rank, from + i, salt),
                        "%s (%zu, %zu): from rank %d byte %zu = %u, expected %u (salt %llu)", what,
                        a, b, rank, i, got[i], pat(rank, from + i, salt),
                        static_cast<unsigned long long>(salt));
}

// Rank r of a 2-rank job `job`, with a 60 s deadline.
Options pair_options(int r, const std::string& job) {
  Options o;
  o.rank = r;
  o.world_size = 2;
  o.job_id = job;
  o.timeout_s = 60;
  return o;
}

struct Case {
  DataType dtype;
  std::size_t count;  // elements per block
  std::size_t skew;   // bytes past alignment of every buffer
};

// Block sizes at and around both ends of the range, odd element sizes and
// counts, unaligned buffers, plus one below and one past the range.
std::vector<Case> cases() {
  std::vector<Case> v;
  for (std::size_t bytes : {65535u, 65536u, 65537u, 131075u, 262143u, 262144u, 262145u}) {
    v.push_back({DataType::int8, bytes, 1});
    v.push_back({DataType::float16, (bytes / 2) | 1, 0});
    v.push_back({DataType::float16, (bytes / 2) | 1, 2});
    v.push_back({DataType::int32, bytes / 4, 4});
  }
  v.push_back({DataType::float64, 8190, 0});   // just below 64 KiB
  v.push_back({DataType::float64, 32769, 8});  // just past 256 KiB
  return v;
}

// A small collective of another kind between the big ones, checked.
void interleave(Communicator& c, std::uint64_t salt, int which) {
  const int me = c.rank(), n = c.size();
  switch (which % 5) {
    case 0: {
      std::vector<std::int64_t> x(1000 + salt % 7);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int64_t>(me * 1000 + i);
      c.allreduce(x.data(), x.data(), x.size(), DataType::int64, ReduceOp::sum);
      for (std::size_t i = 0; i < x.size(); ++i)
        SHMRING_CHILD_CHECK(x[i] == static_cast<std::int64_t>(n * (n - 1) / 2 * 1000 + n * i),
                            "allreduce [%zu] = %lld", i, static_cast<long long>(x[i]));
      break;
    }
    case 1: {
      const int root = static_cast<int>(salt % n);
      Buf b(70000, 0);
      if (me == root) fill(b, root, 70000, salt);
      c.broadcast(b.data(), 70000, DataType::uint8, root);
      expect(b.data(), root, 0, 70000, salt, "broadcast", salt, 0);
      break;
    }
    case 2: {  // alltoallv with uneven blocks, one past 64 KiB
      std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
      auto cnt = [&](int from, int to) { return std::size_t(from == to ? 3 : 70000 + 11 * from); };
      std::size_t at = 0;
      for (int j = 0; j < n; ++j) sd[j] = at, sc[j] = cnt(me, j), at += sc[j];
      Buf s(at, 0);
      fill(s, me, at, salt);
      at = 0;
      for (int j = 0; j < n; ++j) rd[j] = at, rc[j] = cnt(j, me), at += rc[j];
      Buf r(at, 0);
      c.alltoallv(s.data(), sc, sd, r.data(), rc, rd, DataType::uint8);
      for (int j = 0; j < n; ++j) {
        std::size_t from = 0;
        for (int k = 0; k < me; ++k) from += cnt(j, k);
        expect(r.data() + rd[j], j, from, rc[j], salt, "alltoallv", j, 0);
      }
      break;
    }
    case 3: {
      std::vector<std::size_t> rc(n);
      std::size_t total = 0;
      for (int j = 0; j < n; ++j) rc[j] = 5000 + j, total += rc[j];
      std::vector<std::int32_t> s(total), r(rc[me]);
      for (std::size_t i = 0; i < total; ++i) s[i] = static_cast<std::int32_t>(me + i);
      c.reduce_scatter_v(s.data(), r.data(), rc, DataType::int32, ReduceOp::sum);
      std::size_t off = 0;
      for (int j = 0; j < me; ++j) off += rc[j];
      for (std::size_t i = 0; i < rc[me]; ++i)
        SHMRING_CHILD_CHECK(r[i] == static_cast<std::int32_t>(n * (n - 1) / 2 + n * (off + i)),
                            "reduce_scatter_v [%zu] = %d", i, r[i]);
      break;
    }
    default: {  // point-to-point in a ring, 100 KiB (a CMA read of its own)
      if (n < 2) break;
      const std::size_t bytes = 100000;
      Buf s(bytes, 1), r(bytes, 3);
      fill(s, me, bytes, salt);
      Request q = c.irecv(r.data(), bytes, DataType::uint8, (me + n - 1) % n, 7);
      c.send(s.data(), bytes, DataType::uint8, (me + 1) % n, 7);
      q.wait();
      expect(r.data(), (me + n - 1) % n, 0, bytes, salt, "sendrecv", 0, 0);
    }
  }
}

// Every collective with a single-copy round on one case, blocking or the
// i-form, every root, in place where allowed; `salt` makes each call's
// values new, so a block left over from an earlier call cannot pass.
void one_case(Communicator& c, const Case& k, bool nonblocking, std::uint64_t salt) {
  const int me = c.rank(), n = c.size();
  const std::size_t es = datatype_size(k.dtype), bytes = k.count * es;
  auto run = [&](auto blocking, auto immediate) {
    if (nonblocking) {
      Request q = immediate();
      q.wait();
    } else {
      blocking();
    }
  };
  {  // alltoall: block j of my send is bytes [j*bytes, ...) of my pattern
    Buf s(bytes * n, k.skew), r(bytes * n, k.skew);
    fill(s, me, bytes * n, salt);
    run([&] { c.alltoall(s.data(), r.data(), k.count, k.dtype); },
        [&] { return c.ialltoall(s.data(), r.data(), k.count, k.dtype); });
    for (int j = 0; j < n; ++j)
      expect(r.data() + j * bytes, j, me * bytes, bytes, salt, "alltoall", bytes, j);
    expect(s.data(), me, 0, bytes * n, salt, "alltoall send unchanged", bytes, 0);
  }
  // alltoallv: block sizes count, count/2+1 and 0 by pair; send blocks
  // packed in rank order (the single-copy round) or, on one rank, in
  // reverse order with gaps (no round for anyone: the slots).
  for (int unpacked = -1; unpacked < n; ++unpacked) {
    const std::uint64_t s4 = salt * 17 + static_cast<std::uint64_t>(unpacked + 1);
    auto cnt = [&](int from, int to) -> std::size_t {
      const int d = (to - from + n) % n;
      return d == 1 ? k.count : d == 2 ? 0 : k.count / 2 + 1;
    };
    std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
    std::size_t at = 0;
    if (me == unpacked)
      for (int j = n; j-- > 0;) sd[j] = at + 1, sc[j] = cnt(me, j), at += sc[j] + 3;
    else
      for (int j = 0; j < n; ++j) sd[j] = at, sc[j] = cnt(me, j), at += sc[j];
    Buf snd((at + 1) * es, k.skew);
    std::size_t rat = 0;
    for (int j = 0; j < n; ++j) rd[j] = rat, rc[j] = cnt(j, me), rat += rc[j];
    Buf rcv(rat * es, k.skew);
    // Block j of my send holds my pattern from byte sum_{i<j} sc[i] * es.
    std::size_t from = 0;
    for (int j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < sc[j] * es; ++i) snd[sd[j] * es + i] = pat(me, from + i, s4);
      from += sc[j] * es;
    }
    run([&] { c.alltoallv(snd.data(), sc, sd, rcv.data(), rc, rd, k.dtype); },
        [&] { return c.ialltoallv(snd.data(), sc, sd, rcv.data(), rc, rd, k.dtype); });
    for (int j = 0; j < n; ++j) {
      std::size_t f = 0;  // where j's block for me starts in j's pattern
      for (int i = 0; i < me; ++i) f += cnt(j, i) * es;
      expect(rcv.data() + rd[j] * es, j, f, rc[j] * es, s4, "alltoallv", unpacked + 1, j);
    }
  }
  for (int root = 0; root < n; ++root)
    for (bool in_place : {false, true}) {
      const std::uint64_t s2 = salt * 7 + root * 2 + in_place;
      Buf s(bytes, k.skew), r(bytes * n, k.skew);
      fill(s, me, bytes, s2);
      const void* send = s.data();
      if (in_place && me == root) {
        std::memcpy(r.data() + root * bytes, s.data(), bytes);
        send = r.data() + root * bytes;
      }
      void* recv = me == root ? r.data() : nullptr;
      run([&] { c.gather(send, recv, k.count, k.dtype, root); },
          [&] { return c.igather(send, recv, k.count, k.dtype, root); });
      if (me == root)
        for (int j = 0; j < n; ++j)
          expect(r.data() + j * bytes, j, 0, bytes, s2, "gather", bytes, root);
      else
        expect(s.data(), me, 0, bytes, s2, "gather send unchanged", bytes, root);

      Buf ss(bytes * n, k.skew), rr(bytes, k.skew);
      if (me == root) fill(ss, root, bytes * n, s2 + 1000);
      void* srecv = in_place && me == root ? ss.data() + root * bytes : rr.data();
      const void* ssend = me == root ? ss.data() : nullptr;
      run([&] { c.scatter(ssend, srecv, k.count, k.dtype, root); },
          [&] { return c.iscatter(ssend, srecv, k.count, k.dtype, root); });
      expect(static_cast<std::uint8_t*>(srecv), root, me * bytes, bytes, s2 + 1000, "scatter",
             bytes, root);
      if (me == root)
        expect(ss.data(), root, 0, bytes * n, s2 + 1000, "scatter send unchanged", bytes, root);
    }
  // allgather (its single-copy round at N=2 from 4 KiB blocks, choose()),
  // out of place and in place.
  for (bool in_place : {false, true}) {
    const std::uint64_t s5 = salt * 19 + in_place;
    Buf mine(bytes, k.skew), all(bytes * n, k.skew);
    fill(mine, me, bytes, s5);
    const void* send = mine.data();
    if (in_place) {
      std::memcpy(all.data() + me * bytes, mine.data(), bytes);
      send = all.data() + me * bytes;
    }
    run([&] { c.allgather(send, all.data(), k.count, k.dtype); },
        [&] { return c.iallgather(send, all.data(), k.count, k.dtype); });
    for (int j = 0; j < n; ++j)
      expect(all.data() + j * bytes, j, 0, bytes, s5, "allgather", in_place, j);
  }
  // allgatherv: my block is `bytes`-sized on even ranks; others get zero,
  // tiny, and `count` again, rotating with the salt.
  const std::size_t others[] = {0, 1, 3, k.count / 2 + 1, k.count};
  for (std::size_t o = 0; o < 5; ++o)
    for (bool in_place : {false, true}) {
      const std::uint64_t s3 = salt * 13 + o * 2 + in_place;
      std::vector<std::size_t> rc(n), d(n);
      for (int j = 0; j < n; ++j) rc[j] = (j + o) % 2 == 0 ? k.count : others[(o + j) % 5];
      std::size_t at = 1;  // reverse order with gaps
      for (int j = n; j-- > 0;) d[j] = at, at += rc[j] + 2;
      Buf all(at * es, k.skew, 0x5a), mine(rc[me] * es, k.skew);
      fill(mine, me, rc[me] * es, s3);
      const void* send = mine.data();
      if (in_place) {
        std::memcpy(all.data() + d[me] * es, mine.data(), rc[me] * es);
        send = all.data() + d[me] * es;
      }
      run([&] { c.allgatherv(send, rc[me], all.data(), rc, d, k.dtype); },
          [&] { return c.iallgatherv(send, rc[me], all.data(), rc, d, k.dtype); });
      for (int j = 0; j < n; ++j) {
        expect(all.data() + d[j] * es, j, 0, rc[j] * es, s3, "allgatherv", o, j);
        for (std::size_t g = 0; g < 2 * es; ++g)  // the gap after each block stays
          SHMRING_CHILD_CHECK(all[(d[j] + rc[j]) * es + g] == 0x5a,
                              "allgatherv wrote past block %d (o %zu)", j, o);
      }
      SHMRING_CHILD_CHECK(all[0] == 0x5a, "allgatherv wrote before the first block");
    }
}

void sweep(Communicator& c, std::uint64_t salt0 = 1) {
  std::uint64_t salt = salt0;
  int which = 0;
  for (const Case& k : cases())
    for (bool nb : {false, true}) {
      one_case(c, k, nb, ++salt);
      interleave(c, salt, which++);
    }
}

void check_all(const std::vector<int>& st) {
  for (std::size_t r = 0; r < st.size(); ++r)
    CHECK_MESSAGE(st[r] == 0, "rank ", r, " status ", st[r]);
}

bool leftover_segments(const std::string& job) {
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().find(job) != std::string::npos) return true;
  return false;
}

Communicator make(const std::string& job, int r, int n) {
  Options o;
  o.rank = r;
  o.world_size = n;
  o.job_id = job;
  return Communicator(o);
}

}  // namespace

TEST_CASE("single copy: every collective, dtype, size, alignment and form, N=2") {
  check_all(test::run_ranks(
      2, [](Communicator& c) { sweep(c); }, 600));
}

TEST_CASE("single copy: N=3 (oversubscribed here) and N=2 on one CPU give the same results") {
  check_all(test::run_ranks(
      3, [](Communicator& c) { sweep(c, 100); }, 600));
  const std::string job = test::unique_job_id("cma1cpu");
  check_all(test::run_processes(
      2,
      [&](int r) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(0, &set);
        SHMRING_CHILD_CHECK(sched_setaffinity(0, sizeof set, &set) == 0, "sched_setaffinity");
        Communicator c = make(job, r, 2);
        sweep(c, 200);
      },
      600));
}

TEST_CASE("single copy: SHMRING_CMA=0 on one rank, alternating with the default") {
  for (int round = 0; round < 4; ++round) {
    const int off_rank = round % 2;  // which rank has it off (round 2, 3: rank r too
    const std::string job = test::unique_job_id("cmamix");
    check_all(test::run_processes(
        2,
        [&](int r) {
          if (r == off_rank) setenv("SHMRING_CMA", "0", 1);
          Communicator c = make(job, r, 2);
          if (round >= 2) {
            // A second communicator of the same ranks made with the other
            // setting, both alive, calls interleaved.
            if (r == off_rank)
              unsetenv("SHMRING_CMA");
            else
              setenv("SHMRING_CMA", "0", 1);
            Communicator d = make(job + "b", r, 2);
            for (int i = 0; i < 3; ++i) {
              one_case(c, {DataType::int8, 100001, 1}, i % 2, 500 + i);
              one_case(d, {DataType::float16, 65537, 2}, i % 2, 600 + i);
            }
          } else {
            one_case(c, {DataType::int8, 65536, 1}, false, 300);
            one_case(c, {DataType::int32, 40000, 0}, true, 301);
            one_case(c, {DataType::float16, 131071, 0}, false, 302);
          }
        },
        300));
  }
}

TEST_CASE("single copy: many i-forms in flight together, waited in reverse order") {
  check_all(test::run_ranks(
      2,
      [](Communicator& c) {
        const int me = c.rank(), n = c.size();
        const std::size_t bytes = 100003;
        for (int it = 0; it < 20; ++it) {
          const std::uint64_t s = 1000 + it;
          Buf a(bytes * n, 1), ar(bytes * n, 1), g(bytes, 0), gr(bytes * n, 0), sc(bytes * n, 3),
              scr(bytes, 0), v(bytes, 1), vr(bytes * n + 16, 1);
          fill(a, me, bytes * n, s);
          fill(g, me, bytes, s + 1);
          fill(sc, me, bytes * n, s + 2);
          fill(v, me, bytes, s + 3);
          const int root = it % n;
          std::vector<std::size_t> rc(n, bytes), d(n);
          for (int j = 0; j < n; ++j) d[j] = (n - 1 - j) * bytes + 8;
          std::vector<Request> q;
          q.push_back(c.ialltoall(a.data(), ar.data(), bytes, DataType::uint8));
          q.push_back(
              c.igather(g.data(), me == root ? gr.data() : nullptr, bytes, DataType::uint8, root));
          q.push_back(c.iscatter(me == root ? sc.data() : nullptr, scr.data(), bytes,
                                 DataType::uint8, root));
          q.push_back(c.iallgatherv(v.data(), bytes, vr.data(), rc, d, DataType::uint8));
          std::vector<std::int32_t> x(5000, me + 1);
          q.push_back(c.iallreduce(x.data(), x.data(), x.size(), DataType::int32, ReduceOp::sum));
          // Point-to-point (its own single-copy reads) in flight with them.
          Buf ps(bytes, 1), pr(bytes, 3);
          fill(ps, me, bytes, s + 4);
          q.push_back(c.irecv(pr.data(), bytes, DataType::uint8, (me + n - 1) % n, it));
          q.push_back(c.isend(ps.data(), bytes, DataType::uint8, (me + 1) % n, it));
          for (std::size_t i = q.size(); i-- > 0;) q[i].wait();
          expect(pr.data(), (me + n - 1) % n, 0, bytes, s + 4, "isend/irecv", it, 0);
          for (int j = 0; j < n; ++j) {
            expect(ar.data() + j * bytes, j, me * bytes, bytes, s, "ialltoall", it, j);
            if (me == root) expect(gr.data() + j * bytes, j, 0, bytes, s + 1, "igather", it, j);
            expect(vr.data() + d[j], j, 0, bytes, s + 3, "iallgatherv", it, j);
          }
          expect(scr.data(), root, me * bytes, bytes, s + 2, "iscatter", it, 0);
          SHMRING_CHILD_CHECK(x[0] == n * (n + 1) / 2, "iallreduce %d", x[0]);
        }
      },
      300));
}

TEST_CASE("single copy: a writer overwrites its buffer right after return") {
  // The writer (gather's non-roots, scatter's root, everyone in alltoall and
  // allgatherv) may reuse its buffer once the call returns: the readers must
  // have copied the old values by then.
  check_all(test::run_ranks(
      2,
      [](Communicator& c) {
        const int me = c.rank(), n = c.size();
        const std::size_t bytes = 200000;
        Buf s(bytes * n, 0), r(bytes * n, 0);
        for (int it = 0; it < 60; ++it) {
          const std::uint64_t salt = 5000 + it;
          const int root = it % n;
          fill(s, me, bytes * n, salt);
          switch (it % 4) {
            case 0:
              c.gather(s.data(), r.data(), bytes, DataType::uint8, root);
              std::memset(s.data(), 0xee, bytes * n);
              if (me == root)
                for (int j = 0; j < n; ++j)
                  if (j != me) expect(r.data() + j * bytes, j, 0, bytes, salt, "gather", it, j);
              break;
            case 1:
              c.scatter(s.data(), r.data(), bytes, DataType::uint8, root);
              std::memset(s.data(), 0xee, bytes * n);
              expect(r.data(), root, me * bytes, bytes, salt, "scatter", it, 0);
              break;
            case 2:
              c.alltoall(s.data(), r.data(), bytes, DataType::uint8);
              std::memset(s.data(), 0xee, bytes * n);
              for (int j = 0; j < n; ++j)
                expect(r.data() + j * bytes, j, me * bytes, bytes, salt, "alltoall", it, j);
              break;
            default: {
              std::vector<std::size_t> rc(n, bytes), d(n);
              for (int j = 0; j < n; ++j) d[j] = j * bytes;
              Request q = c.iallgatherv(s.data(), bytes, r.data(), rc, d, DataType::uint8);
              q.wait();
              std::memset(s.data(), 0xee, bytes * n);
              for (int j = 0; j < n; ++j)
                expect(r.data() + j * bytes, j, 0, bytes, salt, "allgatherv", it, j);
            }
          }
          // The readers check after a barrier that follows everyone's
          // overwrite, so an early return shows as 0xee bytes.
          c.barrier();
        }
      },
      300));
}

TEST_CASE("single copy: a writer killed before its reader reads: clear error, no hang") {
  if (!test::sibling_reads_work()) {
    MESSAGE("skipped: process_vm_readv between sibling processes is refused here");
    return;
  }
  for (int kind = 0; kind < 3; ++kind) {  // gather, scatter, alltoall
    INFO("kind ", kind);
    const std::string job = test::unique_job_id("cmakill");
    // Set by rank 1's killer thread just before the kill: rank 0 starts its
    // call only then, however late the thread runs on a loaded machine.
    auto* killing = static_cast<std::atomic<int>*>(mmap(nullptr, sizeof(std::atomic<int>),
                                                        PROT_READ | PROT_WRITE,
                                                        MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    REQUIRE(killing != MAP_FAILED);
    killing->store(0);
    const auto t0 = std::chrono::steady_clock::now();
    auto st = test::run_processes(
        2,
        [&](int r) {
          Options o = pair_options(r, job);
          Communicator c(o);
          if (c.config().oversubscribed) _exit(77);  // no single-copy round here
          const std::size_t bytes = 150000;
          Buf s(bytes * 2, 0), d(bytes * 2, 0);
          fill(s, r, bytes * 2, 9);
          c.barrier();
          // kind 0: rank 1 writes (gather to 0); 1: rank 1 writes (scatter
          // from 1); 2: both. Rank 1 publishes its buffer and waits; a
          // thread kills it; rank 0 comes late and must read a dead pid.
          if (r == 1) {
            std::thread([killing] {
              std::this_thread::sleep_for(std::chrono::milliseconds(300));
              killing->store(1);
              kill(getpid(), SIGKILL);
            }).detach();
          } else {
            while (killing->load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          try {
            if (kind == 0) c.gather(s.data(), d.data(), bytes, DataType::uint8, 0);
            if (kind == 1) c.scatter(s.data(), d.data(), bytes, DataType::uint8, 1);
            if (kind == 2) c.alltoall(s.data(), d.data(), bytes, DataType::uint8);
          } catch (const Error& e) {
            std::fprintf(stderr, "rank %d got: %s\n", r, e.what());
            _exit(r == 0 ? 42 : 3);
          }
          std::this_thread::sleep_for(std::chrono::seconds(2));  // rank 1: killed here
          _exit(r == 0 ? 4 : 5);
        },
        120);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    munmap(killing, sizeof(std::atomic<int>));
    if (st[0] == 77 || st[1] == 77) {
      MESSAGE("skipped: the ranks share a CPU here, so no single-copy round");
      return;
    }
    CHECK(st[0] == 42);
    CHECK(st[1] == 128 + SIGKILL);
    CHECK(s < 30);
    CHECK_FALSE(leftover_segments(job));
  }
}

TEST_CASE("single copy: split communicators, and ranks that are parent and child") {
  check_all(test::run_ranks(
      3,
      [](Communicator& c) {
        // {0, 1} reversed (a pair with a CPU each: the round runs) and {2}.
        Communicator sub = c.split(c.rank() < 2 ? 0 : 1, -c.rank());
        if (c.rank() < 2) {
          SHMRING_CHILD_CHECK(sub.size() == 2 && sub.rank() == 1 - c.rank(), "split rank %d",
                              sub.rank());
          for (int i = 0; i < 3; ++i)
            one_case(sub, {DataType::int8, 70001u + static_cast<std::size_t>(i), 1}, i % 2,
                     700 + i);
        }
        c.barrier();
      },
      300));
  // Rank 1 is forked by rank 0 (not a sibling).
  const std::string job = test::unique_job_id("cmafork");
  check_all(test::run_processes(1, [&](int) {
    pid_t child = fork();
    if (child == 0) {
      int code = 0;
      try {
        Communicator c = make(job, 1, 2);
        one_case(c, {DataType::float16, 65537, 2}, false, 800);
        one_case(c, {DataType::int8, 262144, 1}, true, 801);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
        code = 1;
      }
      _exit(code);
    }
    Communicator c = make(job, 0, 2);
    one_case(c, {DataType::float16, 65537, 2}, false, 800);
    one_case(c, {DataType::int8, 262144, 1}, true, 801);
    int st = 0;
    waitpid(child, &st, 0);
    SHMRING_CHILD_CHECK(test::decode_status(st) == 0, "child status %d", test::decode_status(st));
  }));
}

namespace {

// Eager gathers and scatters may leave a rank one call (or 32) ahead; the
// single-copy round and the slot rounds then share the direct buffers with
// them. The same seeded choices on every rank, no barriers in between.
void random_stream(Communicator& c) {
  const int me = c.rank(), n = c.size();
  std::uint64_t rng = 12345;
  auto next = [&] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 33;
  };
  const std::size_t sizes[] = {100, 488, 4000, 60000, 65536, 65537, 200000, 262144, 300000};
  for (int it = 0; it < 300; ++it) {
    const std::size_t bytes = sizes[next() % 9];
    const int root = static_cast<int>(next() % n);
    const std::uint64_t salt = 20000 + it;
    const int kind = static_cast<int>(next() % 5);
    Buf s(bytes * n, it % 3), r(bytes * n, 0);
    fill(s, me, bytes * n, salt);
    if (kind == 0) {
      c.gather(s.data(), r.data(), bytes, DataType::uint8, root);
      if (me == root)
        for (int j = 0; j < n; ++j)
          expect(r.data() + j * bytes, j, 0, bytes, salt, "gather", it, bytes);
    } else if (kind == 1) {
      c.scatter(s.data(), r.data(), bytes, DataType::uint8, root);
      expect(r.data(), root, me * bytes, bytes, salt, "scatter", it, bytes);
    } else if (kind == 2) {
      c.alltoall(s.data(), r.data(), bytes, DataType::uint8);
      for (int j = 0; j < n; ++j)
        expect(r.data() + j * bytes, j, me * bytes, bytes, salt, "alltoall", it, bytes);
    } else if (kind == 3) {
      std::vector<std::size_t> rc(n), d(n);
      for (int j = 0; j < n; ++j) rc[j] = j == root ? bytes : sizes[(it + j) % 9];
      d[0] = 0;
      for (int j = 1; j < n; ++j) d[j] = d[j - 1] + rc[j - 1];
      Buf all(d[n - 1] + rc[n - 1], 1), mine(rc[me], 2);
      fill(mine, me, rc[me], salt);
      c.allgatherv(mine.data(), rc[me], all.data(), rc, d, DataType::uint8);
      for (int j = 0; j < n; ++j)
        expect(all.data() + d[j], j, 0, rc[j], salt, "allgatherv", it, bytes);
    } else {
      interleave(c, salt, it);
    }
  }
}

}  // namespace

TEST_CASE("single copy: a random stream of small, single-copy and large collectives") {
  check_all(test::run_ranks(
      2, [](Communicator& c) { random_stream(c); }, 300));
  // One rank with SHMRING_CMA=0 (the writers that could leave their block
  // out of round 0 must not), and N=3 with the round forced on (white-box).
  for (int off = 0; off < 2; ++off) {
    const std::string job = test::unique_job_id("cmarand");
    check_all(test::run_processes(2, [&](int r) {
      if (r == off) setenv("SHMRING_CMA", "0", 1);
      Communicator c = make(job, r, 2);
      random_stream(c);
    }));
  }
  check_all(test::run_ranks(
      3,
      [](Communicator& c) {
        const_cast<Config&>(c.config()).oversubscribed = false;
        random_stream(c);
      },
      300));
}

TEST_CASE("single copy: a rank killed at a random point of a stream: clear error, no hang") {
  for (int trial = 0; trial < 6; ++trial) {
    INFO("trial ", trial);
    const std::string job = test::unique_job_id("cmakill2");
    const auto t0 = std::chrono::steady_clock::now();
    auto st = test::run_processes(
        2,
        [&](int r) {
          Options o = pair_options(r, job);
          Communicator c(o);
          const std::size_t bytes = 250000;
          Buf s(bytes * 2, 0), d(bytes * 2, 0);
          fill(s, r, bytes * 2, 9);
          c.barrier();
          if (r == trial % 2)
            std::thread([trial] {
              std::this_thread::sleep_for(std::chrono::milliseconds(20 + 37 * trial));
              kill(getpid(), SIGKILL);
            }).detach();
          try {
            for (int it = 0; it < 1000000; ++it) {
              if (it % 3 == 0) c.alltoall(s.data(), d.data(), bytes, DataType::uint8);
              if (it % 3 == 1) c.gather(s.data(), d.data(), bytes, DataType::uint8, 0);
              if (it % 3 == 2) c.scatter(s.data(), d.data(), bytes, DataType::uint8, 1);
              if (r == 0 && it % 3 != 2) expect(d.data() + bytes, 1, 0, bytes, 9, "stream", it, 0);
            }
          } catch (const Error& e) {
            std::fprintf(stderr, "rank %d got: %s\n", r, e.what());
            _exit(r != trial % 2 ? 42 : 3);
          }
          _exit(r == 0 ? 4 : 5);
        },
        120);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(st[1 - trial % 2] == 42);  // the survivor
    CHECK(st[trial % 2] == 128 + SIGKILL);
    CHECK(s < 30);
    CHECK_FALSE(leftover_segments(job));
  }
}

TEST_CASE("single copy: a reader's own receive buffer it cannot write is named as such") {
  if (!test::sibling_reads_work()) {
    MESSAGE("skipped: process_vm_readv between sibling processes is refused here");
    return;
  }
  // The root of a gather passes a read-only receive buffer. process_vm_readv
  // fails with EFAULT for a bad local buffer as for a bad remote one; the
  // error must not blame the writer's buffer.
  check_all(test::run_ranks(2, [](Communicator& c) {
    if (c.config().oversubscribed) return;  // no single-copy round here
    const std::size_t bytes = 128 * 1024;
    void* page = mmap(nullptr, 2 * bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SHMRING_CHILD_CHECK(page != MAP_FAILED, "mmap");
    Buf s(bytes, 0);
    fill(s, c.rank(), bytes, 1);
    try {
      // In place at the root: its own block is not copied, so the first
      // write into `page` is the read of rank 1's block.
      c.gather(c.rank() == 0 ? page : s.data(), c.rank() == 0 ? page : nullptr, bytes,
               DataType::uint8, 0);
      SHMRING_CHILD_CHECK(false, "rank %d: gather into a read-only buffer returned", c.rank());
    } catch (const Error& e) {
      const std::string what = e.what();
      SHMRING_CHILD_CHECK(what.find("rank 1's buffer is not valid memory") == std::string::npos,
                          "rank %d blames the writer: %s", c.rank(), e.what());
      SHMRING_CHILD_CHECK(what.find("rank 0") != std::string::npos &&
                              what.find("receive buffer") != std::string::npos,
                          "rank %d: %s", c.rank(), e.what());
    }
    munmap(page, 2 * bytes);
  }));
}

namespace {

// Whether this test can run ranks whose memory their peers may not read:
// sibling reads must work, and dropping to an unprivileged user needs root.
bool can_make_ranks_unreadable() {
  if (!test::sibling_reads_work()) {
    MESSAGE("skipped: process_vm_readv between sibling processes is refused here");
    return false;
  }
  if (geteuid() != 0) {
    MESSAGE("skipped: needs root to run the ranks as an unprivileged user");
    return false;
  }
  return true;
}

// Without CAP_SYS_PTRACE, a process that is not dumpable (prctl, or after
// a setuid) cannot be read by its peers. An alltoall of `bytes` blocks at
// N=2 (the job's oversubscription flag cleared: white-box) after a first
// one that probed, with rank 1 turned non-dumpable in between: status 42 on
// a rank whose second alltoall failed, 0 when it went through the slots.
// SHMRING_CMA_LARGE per rank (nullptr: unset).
// Rank 1 turns unreadable after the probe, then both call alltoall (or,
// with `allgather`, allgather) on blocks of `bytes`: 42 on a rank means the
// call took a single-copy read, 0 that it went through the segment.
std::vector<int> alltoall_after_unreadable(const std::string& job, std::size_t bytes,
                                           const char* large0 = nullptr,
                                           const char* large1 = nullptr, bool shared_cpus = false,
                                           bool allgather = false) {
  return test::run_processes(
      2,
      [&](int r) {
        SHMRING_CHILD_CHECK(setgid(65534) == 0 && setuid(65534) == 0, "drop to nobody");
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);  // setuid cleared it
        if (const char* v = r == 0 ? large0 : large1) setenv("SHMRING_CMA_LARGE", v, 1);
        Options o = pair_options(r, job);
        o.oversubscribed = shared_cpus ? 1 : 0;
        Communicator c(o);
        const std::size_t total = std::max<std::size_t>(bytes, 100000) * 2;
        Buf s(total, 0), d(total, 0);
        fill(s, r, total, 3);
        c.alltoall(s.data(), d.data(), 100000, DataType::uint8);  // probes: readable
        expect(d.data() + (1 - r) * 100000, 1 - r, r * 100000, 100000, 3, "alltoall", 0, 0);
        if (r == 1) prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        c.barrier();
        try {
          if (allgather) {
            c.allgather(s.data() + r * bytes, d.data(), bytes, DataType::uint8);
            expect(d.data() + (1 - r) * bytes, 1 - r, (1 - r) * bytes, bytes, 3, "allgather", 1, 0);
          } else {
            c.alltoall(s.data(), d.data(), bytes, DataType::uint8);
            expect(d.data() + (1 - r) * bytes, 1 - r, r * bytes, bytes, 3, "alltoall", 1, 0);
          }
          _exit(0);
        } catch (const Error& e) {
          std::fprintf(stderr, "rank %d got: %s\n", r, e.what());
          _exit(42);
        }
      },
      120);
}

}  // namespace

TEST_CASE("single copy: a rank that becomes non-dumpable after the probe: clear error, no hang") {
  if (!can_make_ranks_unreadable()) return;
  // The probe runs once per communicator, so the next single-copy read
  // fails (EPERM): the job must end with the reason on both ranks, not
  // hang. Today's behaviour (staged.cpp cma_take): the job ends with EPERM
  // named on both ranks; a fallback to the slot rounds would also be
  // acceptable.
  const std::string job = test::unique_job_id("cmadump");
  auto st = alltoall_after_unreadable(job, 100000);
  CHECK(st[0] == 42);
  CHECK(st[1] == 42);
  CHECK_FALSE(leftover_segments(job));
}

TEST_CASE("single copy: N=3 and N=4 with the round forced on (white-box)") {
  // On this 2-CPU machine only N=2 runs the round. Clearing the
  // oversubscription flag on every rank right after the communicator is
  // made (the same on every rank, so every rank still takes the same path)
  // runs it at N > 2: more readers per writer, gather and scatter roots in
  // the middle, alltoall offsets other than 0 and 1.
  for (int n : {3, 4}) {
    INFO("N=", n);
    check_all(test::run_ranks(
        n,
        [](Communicator& c) {
          const_cast<Config&>(c.config()).oversubscribed = false;
          std::uint64_t salt = 900;
          for (const Case& k : {Case{DataType::int8, 65537, 1}, Case{DataType::float16, 65537, 2},
                                Case{DataType::int32, 65536, 4}})
            for (bool nb : {false, true}) {
              one_case(c, k, nb, ++salt);
              interleave(c, salt, static_cast<int>(salt));
            }
        },
        600));
  }
}

// Sets an environment variable for the ranks forked in its scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

TEST_CASE("single copy, SHMRING_CMA_LARGE=1 and 0: blocks of 8 KiB and past 256 KiB") {
  // Where process_vm_readv is nearly as fast as memcpy (measured per
  // process, or SHMRING_CMA_LARGE=1) blocks of 8 KiB to any size go in one
  // copy: every bound's edge (8 KiB, gather's 512 KiB), a block past the 8
  // MiB from which the reads split across threads, N=2 and N=3 (white-box,
  // as above). With 0 (N=2), the same blocks take round 0 or the slots.
  const std::vector<Case> big = {
      {DataType::int8, 8191, 1},       {DataType::int8, 8192, 0},
      {DataType::float16, 4097, 2},    {DataType::int32, 16383, 4},
      {DataType::int8, 262145, 1},     {DataType::float16, 262143, 2},
      {DataType::int32, 131072, 0},    {DataType::int8, 524289, 3},
      {DataType::float64, 1310721, 8}, {DataType::int8, (9u << 20) + 5, 1},
      {DataType::int8, 16383, 2},      {DataType::int8, 16384, 1},     // scatter: eager / rounds
      {DataType::int8, 4095, 3},       {DataType::int8, 4096, 0},      // allgather: direct / rounds
      {DataType::int8, 2097151, 1},    {DataType::int8, 2097152, 0}};  // allgather: rounds / ring
  for (auto [n, large] : {std::pair{2, "1"}, std::pair{3, "1"}, std::pair{2, "0"}}) {
    INFO("N=", n, " SHMRING_CMA_LARGE=", large);
    ScopedEnv env("SHMRING_CMA_LARGE", large);
    check_all(test::run_ranks(
        n,
        [&](Communicator& c) {
          const_cast<Config&>(c.config()).oversubscribed = false;
          std::uint64_t salt = 1000 + 100 * n + (large[0] == '0' ? 50 : 0);
          for (const Case& k : big) {
            ++salt;
            one_case(c, k, salt % 2 == 0, salt);
            interleave(c, salt, static_cast<int>(salt));
          }
        },
        600));
  }
}

TEST_CASE("single copy where ranks share CPUs: blocks at the 32 KiB edges (white-box)") {
  // Marked oversubscribed on every rank: scatter keeps its eager path below
  // 32 KiB blocks and alltoall its round 0, each taking the single-copy
  // round from there; every collective of one_case at both edges, N=2, 3.
  const std::vector<Case> edges = {{DataType::int8, 32767, 1},
                                   {DataType::int8, 32768, 0},
                                   {DataType::int32, 8193, 4},
                                   {DataType::int8, 16384, 2}};
  for (int n : {2, 3}) {
    INFO("N=", n);
    check_all(test::run_ranks(
        n,
        [&](Communicator& c) {
          const_cast<Config&>(c.config()).oversubscribed = true;
          std::uint64_t salt = 3000 + 100 * n;
          for (const Case& k : edges) {
            ++salt;
            one_case(c, k, salt % 2 == 0, salt);
            interleave(c, salt, static_cast<int>(salt));
          }
        },
        600));
  }
}

TEST_CASE("single copy of large blocks: taken only when every rank says so") {
  if (!can_make_ranks_unreadable()) return;
  // Both ranks large: the 1 MiB blocks are read in one copy, which fails.
  auto st = alltoall_after_unreadable(test::unique_job_id("cmalarge"), 1u << 20, "1", "1");
  CHECK(st[0] == 42);
  CHECK(st[1] == 42);
  // Off on both, or on one rank only (the ranks must agree): the slots.
  for (auto [a, b] : {std::pair{"0", "0"}, std::pair{"1", "0"}, std::pair{"0", "1"}}) {
    INFO("SHMRING_CMA_LARGE ", a, " / ", b);
    st = alltoall_after_unreadable(test::unique_job_id("cmalarge"), 1u << 20, a, b);
    CHECK(st[0] == 0);
    CHECK(st[1] == 0);
  }
}

TEST_CASE("single copy where ranks share CPUs: alltoall from 32 KiB blocks, not below") {
  if (!can_make_ranks_unreadable()) return;
  // The job marked oversubscribed on both ranks (white-box, as above):
  // blocks of 32 KiB and 1 MiB take the round, which the unreadable rank
  // fails; 16 KiB blocks keep round 0 and arrive.
  for (std::size_t bytes : {std::size_t{32} << 10, std::size_t{1} << 20}) {
    INFO("bytes ", bytes);
    auto st = alltoall_after_unreadable(test::unique_job_id("cmashared"), bytes, "1", "1", true);
    CHECK(st[0] == 42);
    CHECK(st[1] == 42);
  }
  auto st = alltoall_after_unreadable(test::unique_job_id("cmashared"), 16 << 10, "1", "1", true);
  CHECK(st[0] == 0);
  CHECK(st[1] == 0);
}

TEST_CASE("allgather at N=2 where ranks share CPUs: the staged rounds for 160-640 KiB blocks") {
  // White-box: rank 0 alone is marked oversubscribed, so the two ranks
  // choose alike only where both windows take the staged rounds (rank 1's:
  // 4 KiB to 2 MiB blocks; rank 0's: 160 KiB to 640 KiB); elsewhere rank 0
  // takes the ring and both ranks must fail with the path named, not hang.
  // SHMRING_CMA=0, so that the flag changes nothing else inside the staged
  // rounds (where ranks share CPUs an allgather takes no single copy). A
  // real job never disagrees: Options::oversubscribed is combined over the
  // ranks.
  struct Edge {
    std::size_t bytes;
    bool agree;
  };
  for (Edge e : {Edge{(std::size_t{160} << 10) - 1, false}, Edge{std::size_t{160} << 10, true},
                 Edge{(std::size_t{640} << 10) - 1, true}, Edge{std::size_t{640} << 10, false}}) {
    INFO("bytes ", e.bytes);
    const std::string job = test::unique_job_id("agshared");
    auto st = test::run_processes(
        2,
        [&](int r) {
          Options o = pair_options(r, job);
          o.oversubscribed = 0;
          setenv("SHMRING_CMA", "0", 1);
          Communicator c(o);
          const_cast<Config&>(c.config()).oversubscribed = r == 0;
          Buf s(e.bytes, 0), d(2 * e.bytes, 0);
          fill(s, r, e.bytes, 5);
          try {
            c.allgather(s.data(), d.data(), e.bytes, DataType::uint8);
          } catch (const MismatchError& err) {
            const bool named = std::string(err.what()).find("ring algorithm") != std::string::npos;
            std::fprintf(stderr, "rank %d got: %s\n", r, err.what());
            _exit(named ? 42 : 43);
          }
          for (int q = 0; q < 2; ++q)
            expect(d.data() + q * e.bytes, q, 0, e.bytes, 5, "allgather", 0, 0);
        },
        120);
    CHECK(st[0] == (e.agree ? 0 : 42));
    CHECK(st[1] == (e.agree ? 0 : 42));
  }
}

TEST_CASE("single copy: mismatched calls around the round's range fail every rank") {
  // One rank in the range (leaves its block out of round 0), the other
  // below it (inline), past it (slot rounds) or another collective: every
  // rank must get MismatchError, not a hang, a wrong read or a crash.
  struct Pair {
    int kind0, kind1;  // 0 alltoall, 1 gather to 0, 2 scatter from 0, 3 allgatherv, 4 allgather
    std::size_t bytes0, bytes1;
  };
  const Pair pairs[] = {{0, 0, 4000, 120000},   {0, 0, 120000, 300000}, {0, 0, 65535, 65536},
                        {1, 1, 120000, 100},    {2, 2, 200000, 262145}, {0, 1, 100000, 100000},
                        {3, 3, 100000, 100001}, {1, 2, 100000, 100000}, {2, 2, 16383, 16384},
                        {2, 2, 16384, 100},     {4, 4, 4095, 4096},     {4, 4, 100000, 2097152},
                        {4, 3, 100000, 100000}};
  for (const Pair& p : pairs) {
    INFO("kinds ", p.kind0, "/", p.kind1, " bytes ", p.bytes0, "/", p.bytes1);
    check_all(test::run_ranks(
        2,
        [&](Communicator& c) {
          const int me = c.rank();
          const int kind = me == 0 ? p.kind0 : p.kind1;
          const std::size_t bytes = me == 0 ? p.bytes0 : p.bytes1;
          Buf s(2 * bytes, 0), r(2 * std::max<std::size_t>(bytes, 300000), 0);
          fill(s, me, 2 * bytes, 1);
          try {
            if (kind == 0) c.alltoall(s.data(), r.data(), bytes, DataType::uint8);
            if (kind == 1) c.gather(s.data(), r.data(), bytes, DataType::uint8, 0);
            if (kind == 2) c.scatter(s.data(), r.data(), bytes, DataType::uint8, 0);
            if (kind == 3) {
              std::vector<std::size_t> rc = {bytes, bytes}, d = {0, bytes};
              c.allgatherv(s.data(), bytes, r.data(), rc, d, DataType::uint8);
            }
            if (kind == 4) c.allgather(s.data(), r.data(), bytes, DataType::uint8);
            c.barrier();  // an eager gather / scatter learns at the next call
            SHMRING_CHILD_CHECK(false, "rank %d: no error", me);
          } catch (const MismatchError&) {
          }
        },
        120));
  }
}
