// What lockwatch/key_pattern.hpp and locked.hpp leave to the library: the
// messages of key patterns found faulty at run time, and of the builder's
// checks.
#include <fmt/format.h>

#include "lockwatch/errors.hpp"
#include "lockwatch/key_pattern.hpp"
#include "lockwatch/locked.hpp"

namespace lockwatch::detail {

namespace {
std::string what_is_wrong(KeyPatternFault f, std::size_t args, const char* type_name) {
  switch (f.error) {
    case KeyPatternError::kNone: break;
    case KeyPatternError::kUnclosedBrace:
      return fmt::format("the '{{' at offset {} has no '}}' (a literal one is written '{{{{')", f.offset);
    case KeyPatternError::kLoneClosingBrace:
      return fmt::format("the '}}' at offset {} closes no field (a literal one is written '}}}}')", f.offset);
    case KeyPatternError::kBadField:
      return fmt::format("the field at offset {} is neither {{}} nor {{N}}, N an argument's index", f.offset);
    case KeyPatternError::kFormatSpec:
      return fmt::format("the field at offset {} has a format spec, which key patterns do not take", f.offset);
    case KeyPatternError::kMixedIndexing:
      return fmt::format("the field at offset {} mixes {{N}} and {{}} fields in one pattern", f.offset);
    case KeyPatternError::kNoSuchArgument:
      return fmt::format("the field at offset {} refers to argument {}, and the call has {}", f.offset, f.index,
                         args);
    case KeyPatternError::kNotAKeyPart:
      return fmt::format(
          "the field at offset {} refers to argument {}, of type {}, which cannot be a key part; give the type a "
          "lockwatch_key() or use a key function",
          f.offset, f.index, type_name);
  }
  return "unknown fault";
}
}  // namespace

void throw_bad_key_pattern(std::string_view pattern, KeyPatternFault fault, std::size_t args,
                           const char* type_name) {
  throw InvalidArgument(fmt::format("bad key pattern '{}': {}", pattern, what_is_wrong(fault, args, type_name)));
}

void throw_null_key_string() { throw InvalidArgument("a key pattern refers to a null const char* argument"); }

void check_builder_ttl(std::chrono::milliseconds ttl) {
  if (ttl <= std::chrono::milliseconds(0)) {
    throw InvalidArgument(fmt::format("ttl must be positive, got {} ms", ttl.count()));
  }
}

void check_context(std::string_view context) {
  if (context.size() > max_context_bytes)
    throw InvalidArgument(
        fmt::format("a request's context is {} bytes; the limit is {}", context.size(), max_context_bytes));
  for (std::size_t i = 0; i < context.size(); ++i) {
    const auto c = static_cast<unsigned char>(context[i]);
    if (c < 0x20 || c == 0x7f)
      throw InvalidArgument(fmt::format("a request's context has a control character (byte {} is {:#04x})", i,
                                        static_cast<unsigned>(c)));
  }
}

void check_renew_weight(double w) {
  if (!(w > 0 && w < 1)) throw InvalidArgument(fmt::format("renewal weight must be in (0, 1), got {}", w));
}

}  // namespace lockwatch::detail
