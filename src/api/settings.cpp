// The public shmring::settings lookups (include/shmring/settings.hpp): the
// one table and parser of base/settings.hpp, by a name given at run time.
#include "shmring/settings.hpp"

#include <fmt/format.h>

#include <stdexcept>

#include "base/settings.hpp"

namespace shmring::settings {

namespace {

const detail::settings::Setting& declared(std::string_view name, detail::settings::Kind kind) {
  const detail::settings::Setting* s = detail::settings::find(name);
  if (s == nullptr)
    throw std::invalid_argument(fmt::format(
        "shmring::settings: {} is not a declared variable (shmrun --info lists them)", name));
  if (s->kind != kind && kind != detail::settings::Kind::text)
    throw std::invalid_argument(fmt::format("shmring::settings: {} is a {} variable, read as a {}",
                                            name, detail::settings::kind_name(s->kind),
                                            detail::settings::kind_name(kind)));
  return *s;
}

}  // namespace

std::optional<std::string> text(std::string_view name) {
  return detail::settings::text_of(declared(name, detail::settings::Kind::text));
}

std::optional<std::string> choice(std::string_view name) {
  return detail::settings::choice_of(declared(name, detail::settings::Kind::choice));
}

std::optional<std::uint64_t> bytes(std::string_view name) {
  return detail::settings::bytes_of(declared(name, detail::settings::Kind::bytes));
}

}  // namespace shmring::settings
