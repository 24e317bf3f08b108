// The settings table (src/base/settings.hpp): every declaration is sound,
// the typed lookups return what the variable says and refuse a bad value
// with "NAME='value': expected ...", and Communicator::config() reports the
// settings the communicator uses, the CMA ones included.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <map>

#include <set>
#include <stdexcept>
#include <string>

#include "base/config.hpp"
#include "base/settings.hpp"
#include "harness.hpp"
#include "shmring/shmring.hpp"

using namespace shmring;
namespace st = shmring::detail::settings;

namespace {

// The message a lookup throws for `value`, or "" when it accepts it.
template <class F>
std::string refusal(const char* name, const char* value, F&& lookup) {
  setenv(name, value, 1);
  std::string what;
  try {
    (void)lookup();
  } catch (const InvalidArgumentError& e) {
    what = e.what();
  }
  unsetenv(name);
  return what;
}

}  // namespace

TEST_CASE("every declaration names a SHMRING_ variable once, with a doc and a sound range") {
  std::set<std::string> seen;
  for (const st::Setting& s : st::kSettings) {
    CAPTURE(s.name);
    CHECK(s.name.starts_with("SHMRING_"));
    CHECK(seen.insert(std::string(s.name)).second);
    CHECK(!s.doc.empty());
    CHECK(!s.default_value.empty());
    CHECK(!s.readers.empty());
    if (s.kind == st::Kind::integer) CHECK(s.lo <= s.hi);
    if (s.kind == st::Kind::number) CHECK(s.number_lo <= s.number_hi);
    if (s.kind == st::Kind::choice) CHECK(!s.choices.empty());
    // A default written as a value is one the variable accepts.
    const std::string d(s.default_value);
    const bool is_value = (d[0] >= '0' && d[0] <= '9') || s.kind == st::Kind::choice;
    if (is_value && d.find(' ') == std::string::npos) CHECK_NOTHROW(st::check(s, d));
  }
  // The defaults the table shows are the ones the code uses.
  auto shown = [](const char* name) { return std::string(st::find(name)->default_value); };
  CHECK(shown("SHMRING_SLOTS") == std::to_string(detail::kDefaultSlots));
  CHECK(shown("SHMRING_SLOT_BYTES") == std::to_string(detail::kDefaultSlotBytes));
  CHECK(shown("SHMRING_DIRECT_BYTES") == std::to_string(detail::kDefaultDirectBytes));
  CHECK(shown("SHMRING_CMA_MIN_BYTES") == std::to_string(detail::kDefaultCmaMinBytes));
  CHECK(std::stod(shown("SHMRING_TIMEOUT")) == detail::kDefaultTimeoutS);
  CHECK(st::find("SHMRING_SLOTS")->hi == static_cast<long long>(detail::kMaxSlots));
  CHECK(seen.size() >= 28);
  CHECK(st::find("SHMRING_SLOTS") == &st::kSettings[st::index_of("SHMRING_SLOTS")]);
  CHECK(st::find("SHMRING_NOT_A_SETTING") == nullptr);
}

TEST_CASE("unknown SHMRING_* variables are found, each with the declared name nearest to it") {
  setenv("SHMRING_SLOTBYTES", "8192", 1);      // one letter from SHMRING_SLOT_BYTES
  setenv("SHMRING_TIMOUT", "5", 1);            // one from SHMRING_TIMEOUT
  setenv("SHMRING_QQQQQQQQQQQQQQQQ", "1", 1);  // near nothing
  std::map<std::string, std::string> found;
  for (const auto& u : st::unknown_variables()) found[u.name] = std::string(u.nearest);
  unsetenv("SHMRING_SLOTBYTES");
  unsetenv("SHMRING_TIMOUT");
  unsetenv("SHMRING_QQQQQQQQQQQQQQQQ");
  CHECK(found["SHMRING_SLOTBYTES"] == "SHMRING_SLOT_BYTES");
  CHECK(found["SHMRING_TIMOUT"] == "SHMRING_TIMEOUT");
  CHECK(
      (found.count("SHMRING_QQQQQQQQQQQQQQQQ") == 1 && found["SHMRING_QQQQQQQQQQQQQQQQ"].empty()));
  for (const st::Setting& s : st::kSettings)
    CHECK_MESSAGE(found.count(std::string(s.name)) == 0, s.name);  // declared: never unknown
  CHECK(st::nearest("SHMRING_SLOT") == "SHMRING_SLOTS");
}

TEST_CASE("integers: the table's range and multiple, or a narrower one with its reason") {
  setenv("SHMRING_SLOTS", "8", 1);
  CHECK(st::integer("SHMRING_SLOTS") == 8);
  unsetenv("SHMRING_SLOTS");
  CHECK(!st::integer("SHMRING_SLOTS").has_value());
  setenv("SHMRING_SLOTS", "", 1);  // empty is unset
  CHECK(!st::integer("SHMRING_SLOTS").has_value());
  unsetenv("SHMRING_SLOTS");
  CHECK(refusal("SHMRING_SLOTS", "1", [] { return st::integer("SHMRING_SLOTS"); }) ==
        "SHMRING_SLOTS='1': expected an integer in [2, 62]");
  CHECK(refusal("SHMRING_SLOTS", "4x", [] { return st::integer("SHMRING_SLOTS"); }) ==
        "SHMRING_SLOTS='4x': expected an integer in [2, 62]");
  for (const char* bad : {"1000", "12345", "abc", "2147483648"})
    CHECK(refusal("SHMRING_SLOT_BYTES", bad, [] { return st::integer("SHMRING_SLOT_BYTES"); }) ==
          std::string("SHMRING_SLOT_BYTES='") + bad +
              "': expected a multiple of 4096 in [4096, 2^30]");
  CHECK(refusal("SHMRING_DIRECT_BYTES", "100", [] {
          return st::integer("SHMRING_DIRECT_BYTES");
        }) == "SHMRING_DIRECT_BYTES='100': expected a multiple of 4096 in [4096, 2^26]");
  CHECK(refusal("SHMRING_RANK", "3", [] {
          return st::integer("SHMRING_RANK", 0, 2, "below SHMRING_WORLD_SIZE=3");
        }) == "SHMRING_RANK='3': expected an integer in [0, 2] (below SHMRING_WORLD_SIZE=3)");
  CHECK(refusal("SHMRING_CMA_MIN_BYTES", "-5", [] {
          return st::integer("SHMRING_CMA_MIN_BYTES");
        }) == "SHMRING_CMA_MIN_BYTES='-5': expected an integer in [0, 1099511627776]");
}

TEST_CASE("numbers, choices and hex") {
  setenv("SHMRING_TIMEOUT", "2.5", 1);
  CHECK(st::number("SHMRING_TIMEOUT") == 2.5);
  unsetenv("SHMRING_TIMEOUT");
  CHECK(refusal("SHMRING_TIMEOUT", "soon", [] { return st::number("SHMRING_TIMEOUT"); }) ==
        "SHMRING_TIMEOUT='soon': expected a number of seconds in [0.001, 1000000000]");
  CHECK(refusal("SHMRING_SPIN_US", "inf", [] { return st::number("SHMRING_SPIN_US"); }) ==
        "SHMRING_SPIN_US='inf': expected a number of microseconds in [0, 1000000]");

  setenv("SHMRING_ALGO", "Two-Shot", 1);
  CHECK(st::choice("SHMRING_ALGO") == "two_shot");
  unsetenv("SHMRING_ALGO");
  CHECK(refusal("SHMRING_ALGO", "fastest", [] { return st::choice("SHMRING_ALGO"); }) ==
        "SHMRING_ALGO='fastest': expected ring, direct, two_shot or auto");
  setenv("SHMRING_NT_STORES", "0", 1);
  CHECK(st::choice("SHMRING_NT_STORES") == "never");
  setenv("SHMRING_NT_STORES", "ALWAYS", 1);
  CHECK(st::choice("SHMRING_NT_STORES") == "always");
  unsetenv("SHMRING_NT_STORES");
  CHECK(refusal("SHMRING_NT_STORES", "maybe", [] { return st::choice("SHMRING_NT_STORES"); }) ==
        "SHMRING_NT_STORES='maybe': expected auto, 0 or never, 1 or always");
  // SHMRING_OVERSUBSCRIBED has always been exact: "AUTO" is refused.
  CHECK(refusal("SHMRING_OVERSUBSCRIBED", "AUTO", [] {
          return st::choice("SHMRING_OVERSUBSCRIBED");
        }) == "SHMRING_OVERSUBSCRIBED='AUTO': expected 1, 0 or auto");

  setenv("SHMRING_JOB_NONCE", "00ff", 1);
  CHECK(st::hex("SHMRING_JOB_NONCE") == 0xffu);
  unsetenv("SHMRING_JOB_NONCE");
  for (const char* bad : {"0", "xyz", "12345678901234567"})
    CHECK(refusal("SHMRING_JOB_NONCE", bad, [] { return st::hex("SHMRING_JOB_NONCE"); }) ==
          std::string("SHMRING_JOB_NONCE='") + bad +
              "': expected 1 to 16 hex digits, not all zero (shmrun sets it)");
}

TEST_CASE("the public lookups: byte counts, choices and text by name, through the one table") {
  // Byte counts: digits only, up to 2^64 - 1.
  const char* bytes = "SHMRING_MPI_CALL_BYTES";
  unsetenv(bytes);
  CHECK(!settings::bytes(bytes).has_value());
  setenv(bytes, "4096", 1);
  CHECK(settings::bytes(bytes) == std::optional<std::uint64_t>(4096));
  setenv(bytes, "18446744073709551615", 1);
  CHECK(settings::bytes(bytes) == std::optional<std::uint64_t>(UINT64_MAX));
  unsetenv(bytes);
  setenv(bytes, "0", 1);
  CHECK(settings::bytes(bytes) == std::optional<std::uint64_t>(0));
  unsetenv(bytes);
  // Below the table's minimum (0 means one call), refused as a bad number is.
  for (const char* bad :
       {"-1", "+5", "4k", " 7", "0x10", "18446744073709551616", "auto", "1", "100", "4095"}) {
    CAPTURE(bad);
    CHECK(refusal(bytes, bad, [&] { return settings::bytes(bytes); }) ==
          fmt::format("SHMRING_MPI_CALL_BYTES='{}': expected 0 (one call) or at least 4096 bytes",
                      bad));
  }
  // A bytes variable declared with "auto" takes the word as unset.
  for (const char* name : {"SHMRING_MPI_PIECE_BYTES", "SHMRING_MPI_SHARDS_BYTES"}) {
    CAPTURE(name);
    setenv(name, "AUTO", 1);
    CHECK(!settings::bytes(name).has_value());
    CHECK_NOTHROW(st::check(*st::find(name), "auto"));
    unsetenv(name);
  }
  CHECK_THROWS_AS(st::check(*st::find(bytes), "100"), InvalidArgumentError);
  CHECK_NOTHROW(st::check(*st::find(bytes), "0"));
  CHECK(refusal("SHMRING_TORCH_SHARD_BYTES", "-4096", [] {
          return settings::bytes("SHMRING_TORCH_SHARD_BYTES");
        }) == "SHMRING_TORCH_SHARD_BYTES='-4096': expected a number of bytes (an integer >= 0)");
  // Choices: the canonical value, case-insensitively where the table says so.
  setenv("SHMRING_MPI_ALGO", "Shards", 1);
  CHECK(settings::choice("SHMRING_MPI_ALGO") == std::optional<std::string>("shards"));
  unsetenv("SHMRING_MPI_ALGO");
  CHECK(refusal("SHMRING_MPI_ON_ERROR", "ignore", [] {
          return settings::choice("SHMRING_MPI_ON_ERROR");
        }) == "SHMRING_MPI_ON_ERROR='ignore': expected abort or throw");
  // Text, and names the table does not declare or declares as another kind.
  setenv("SHMRING_TORCH_JOB_TAG", "run.7", 1);
  CHECK(settings::text("SHMRING_TORCH_JOB_TAG") == std::optional<std::string>("run.7"));
  unsetenv("SHMRING_TORCH_JOB_TAG");
  CHECK_THROWS_AS(settings::text("SHMRING_NO_SUCH_VARIABLE"), std::invalid_argument);
  CHECK_THROWS_AS(settings::bytes("SHMRING_MPI_ALGO"), std::invalid_argument);
  CHECK_THROWS_AS(settings::choice("SHMRING_TORCH_SHARD_BYTES"), std::invalid_argument);
  // shmrun -x and --info check a byte count the same way.
  CHECK_THROWS_AS(st::check(*st::find("SHMRING_MPI_SHARDS_BYTES"), "1e6"), InvalidArgumentError);
  CHECK_NOTHROW(st::check(*st::find("SHMRING_MPI_SHARDS_BYTES"), "65536"));
  CHECK_NOTHROW(st::check(*st::find("SHMRING_MPI_PIECE_BYTES"), "auto"));
}

TEST_CASE("resolve_settings fills the CMA settings into Config") {
  Config c;
  c.rank = 0;
  detail::resolve_settings({}, c);
  CHECK(c.cma == 1);
  CHECK(c.cma_large == -1);
  CHECK(c.cma_min_bytes == 16 * 1024);
  setenv("SHMRING_CMA", "0", 1);
  setenv("SHMRING_CMA_LARGE", "1", 1);
  setenv("SHMRING_CMA_MIN_BYTES", "65536", 1);
  detail::resolve_settings({}, c);
  CHECK(c.cma == 0);
  CHECK(c.cma_large == 1);
  CHECK(c.cma_min_bytes == 65536);
  setenv("SHMRING_CMA_LARGE", "2", 1);
  CHECK_THROWS_WITH_AS(detail::resolve_settings({}, c),
                       "rank 0: SHMRING_CMA_LARGE='2': expected an integer in [0, 1]",
                       InvalidArgumentError);
  unsetenv("SHMRING_CMA");
  unsetenv("SHMRING_CMA_LARGE");
  unsetenv("SHMRING_CMA_MIN_BYTES");
}

TEST_CASE("Communicator::config() reports the CMA settings it runs with") {
  setenv("SHMRING_CMA", "0", 1);
  setenv("SHMRING_CMA_MIN_BYTES", "32768", 1);
  {
    Communicator comm(0, 1, test::unique_job_id("settings"));
    const Config& c = comm.config();
    CHECK(c.cma == 0);
    CHECK(c.cma_min_bytes == 32768);
    CHECK(c.cma_large == -1);
    CHECK(c.slots == 4);
  }
  unsetenv("SHMRING_CMA");
  unsetenv("SHMRING_CMA_MIN_BYTES");
}
