#include "base/settings.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "shmring/error.hpp"

namespace shmring::detail::settings {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::optional<std::string> raw(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// "[lo, hi]" in the shape the messages have always had.
std::string range_text(long long lo, long long hi) {
  return fmt::format("[{}, {}]", lo, hi);
}

std::string choice_value(const Setting& s, const std::string& given) {
  const std::string v = s.exact_case ? given : lower(given);
  std::string_view rest = s.choices;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const auto eq = item.find('=');
    const std::string_view spelling = item.substr(0, eq);
    if (spelling == v)
      return std::string(eq == std::string_view::npos ? item : item.substr(eq + 1));
  }
  refuse(s.name, given, s.expected);
}

std::uint64_t parse_hex(const Setting& s, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 16);
  if (errno != 0 || end == v.c_str() || *end != '\0' || v.size() > 16 || x == 0)
    refuse(s.name, v, s.expected);
  return x;
}

std::uint64_t parse_bytes(const Setting& s, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  // strtoull takes a sign and wraps "-1": only digits are a byte count.
  if (errno != 0 || end == v.c_str() || *end != '\0' ||
      v.find_first_not_of("0123456789") != std::string::npos ||
      (x != 0 && x < static_cast<unsigned long long>(s.lo)))
    refuse(s.name, v, s.expected.empty() ? "a number of bytes (an integer >= 0)" : s.expected);
  return x;
}

}  // namespace

void refuse(std::string_view name, std::string_view value, std::string_view what) {
  throw InvalidArgumentError(fmt::format("{}='{}': expected {}", name, value, what));
}

namespace {

// Levenshtein distance: single-letter insertions, deletions and changes.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<UnknownVariable> unknown_variables() {
  std::vector<UnknownVariable> out;
  constexpr std::string_view kPrefix = "SHMRING_";
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv = *e;
    const std::size_t eq = kv.find('=');
    if (eq == std::string_view::npos || kv.substr(0, kPrefix.size()) != kPrefix) continue;
    const std::string_view name = kv.substr(0, eq);
    if (find(name) == nullptr) out.push_back({std::string(name), nearest(name)});
  }
  return out;
}

std::string_view nearest(std::string_view name) {
  // At most a third of the letters after the prefix may differ (a name
  // that drops the underscore of SHMRING_SLOT_BYTES is one letter off).
  constexpr std::string_view kPrefix = "SHMRING_";
  const std::string_view tail = name.substr(std::min(name.size(), kPrefix.size()));
  std::string_view best_name;
  std::size_t best = tail.size() / 3 + 1;
  for (const Setting& s : kSettings) {
    const std::size_t d = edit_distance(tail, s.name.substr(kPrefix.size()));
    if (d < best) best = d, best_name = s.name;
  }
  return best_name;
}

const Setting* find(std::string_view name) {
  const std::size_t i = index_of(name);
  return i < std::size(kSettings) ? &kSettings[i] : nullptr;
}

long long parse_integer(std::string_view name, const std::string& v, long long lo, long long hi,
                        long long multiple, std::string_view expected, std::string_view why) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0' || x < lo || x > hi ||
      (multiple > 0 && x % multiple != 0))
    refuse(name, v,
           fmt::format("{}{}", expected.empty() ? "an integer in " + range_text(lo, hi) : expected,
                       why.empty() ? "" : fmt::format(" ({})", why)));
  return x;
}

double parse_number(std::string_view name, const std::string& v, double lo, double hi,
                    std::string_view expected) {
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi)
    refuse(name, v,
           expected.empty() ? fmt::format("a number in [{}, {}]", lo, hi) : std::string(expected));
  return x;
}

std::optional<std::string> text(Name name) {
  return raw(name.setting().name);
}

std::optional<long long> integer(Name name) {
  const Setting& s = name.setting();
  return integer(name, s.lo, s.hi);
}

std::optional<long long> integer(Name name, long long lo, long long hi, std::string_view why) {
  const Setting& s = name.setting();
  auto v = raw(s.name);
  if (!v) return std::nullopt;
  // A narrowed range is stated as such; the table's own may have its words.
  const bool narrowed = lo != s.lo || hi != s.hi;
  return parse_integer(s.name, *v, lo, hi, s.multiple, narrowed ? "" : s.expected, why);
}

std::optional<double> number(Name name) {
  const Setting& s = name.setting();
  auto v = raw(s.name);
  if (!v) return std::nullopt;
  return parse_number(s.name, *v, s.number_lo, s.number_hi, s.expected);
}

std::optional<std::string> choice(Name name) {
  const Setting& s = name.setting();
  auto v = raw(s.name);
  if (!v) return std::nullopt;
  return choice_value(s, *v);
}

std::optional<std::uint64_t> hex(Name name) {
  const Setting& s = name.setting();
  auto v = raw(s.name);
  if (!v) return std::nullopt;
  return parse_hex(s, *v);
}

std::optional<std::string> text_of(const Setting& s) {
  return raw(s.name);
}

std::optional<std::string> choice_of(const Setting& s) {
  auto v = raw(s.name);
  if (!v) return std::nullopt;
  return choice_value(s, *v);
}

// A bytes variable declared takes_auto takes that word too, as unset.
bool is_auto(const Setting& s, const std::string& v) {
  return s.takes_auto && lower(v) == "auto";
}

std::optional<std::uint64_t> bytes_of(const Setting& s) {
  auto v = raw(s.name);
  if (!v || is_auto(s, *v)) return std::nullopt;
  return parse_bytes(s, *v);
}

void check(const Setting& s, const std::string& v) {
  switch (s.kind) {
    case Kind::integer:
      (void)parse_integer(s.name, v, s.lo, s.hi, s.multiple, s.expected, {});
      break;
    case Kind::number:
      (void)parse_number(s.name, v, s.number_lo, s.number_hi, s.expected);
      break;
    case Kind::choice:
      (void)choice_value(s, v);
      break;
    case Kind::hex:
      (void)parse_hex(s, v);
      break;
    case Kind::bytes:
      if (!is_auto(s, v)) (void)parse_bytes(s, v);
      break;
    case Kind::text:
      break;
  }
}

std::string_view audience_name(Audience a) {
  switch (a) {
    case Audience::user:
      return "user";
    case Audience::tuning:
      return "tuning";
    case Audience::debug:
      return "debug";
    case Audience::development:
      return "development";
  }
  return "?";
}

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::integer:
      return "integer";
    case Kind::number:
      return "number";
    case Kind::choice:
      return "choice";
    case Kind::hex:
      return "hex";
    case Kind::text:
      return "text";
    case Kind::bytes:
      return "bytes";
  }
  return "?";
}

std::string allowed(const Setting& s) {
  if (!s.expected.empty()) return std::string(s.expected);
  if (s.kind == Kind::integer) return "an integer in " + range_text(s.lo, s.hi);
  if (s.kind == Kind::number) return fmt::format("a number in [{}, {}]", s.number_lo, s.number_hi);
  return std::string(kind_name(s.kind));
}

}  // namespace shmring::detail::settings
