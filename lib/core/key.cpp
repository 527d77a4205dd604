#include <fmt/format.h>

#include "lockwatch/errors.hpp"
#include "lockwatch/locked.hpp"

namespace lockwatch::detail {

void key_pattern_refers_to_an_argument_that_cannot_be_formatted(std::size_t index) {
  throw InvalidArgument(fmt::format("key pattern refers to argument {}, whose type has no fmt::formatter", index));
}

void throw_unformattable_key_argument(const char* type_name) {
  throw InvalidArgument(fmt::format(
      "key pattern refers to an argument of type {} that has no fmt::formatter; give it one or use a key function",
      type_name));
}

void throw_bad_key_pattern(std::string_view pattern, const char* why) {
  throw InvalidArgument(fmt::format("bad key pattern '{}': {}", pattern, why));
}

}  // namespace lockwatch::detail
