// lib/store/sql/sql_literals.hpp: how the SQL store writes values into its
// statements and reads numbers back from their text answers.
//
// Names and tokens go in as hex literals: any bytes, no escaping, nothing a
// key holds can change a statement. The kinds' markers are in
// store/kind_rules.hpp.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "store/capabilities.hpp"
#include "store/kind_rules.hpp"
#include "store/sqlcommon/inspection.hpp"
#include "store/sqlcommon/values.hpp"

namespace lockwatch::detail::sql {

using kinds::kFairMarker;
using kinds::kMarkerPrefix;
using kinds::kPermitsMarker;
using kinds::kSharedMarker;
using sqlcommon::like_prefix;
using sqlcommon::micros;
using sqlcommon::ms_up;
using sqlcommon::to_ll;
using sqlcommon::unix_micros;
// The one writer's mark of a lock, in the companion table.
inline constexpr std::string_view kWriterOwner = "lockwatch:writer";

inline std::string hex(std::string_view bytes) {
  std::string out;
  out.reserve(3 + 2 * bytes.size());
  out += "X'";
  sqlcommon::append_hex(out, bytes);
  out.push_back('\'');
  return out;
}

// `text` with each $1..$9 in it replaced by that one of `params` as a
// literal, as `types` says at its place: 'x' hex text as X'..', 'n' a
// number as it is; a parameter that is not what its type says (or is
// missing) goes in as NULL, so nothing a caller passes can change a
// statement.
inline std::string fill(std::string_view text, std::string_view types, const std::vector<std::string>& params) {
  std::string out;
  out.reserve(text.size() + 64);
  for (std::size_t i = 0; i < text.size(); ++i) {
    const std::size_t k = i + 1 < text.size() ? static_cast<std::size_t>(text[i + 1] - '1') : 9;
    if (text[i] != '$' || k >= 9) {
      out.push_back(text[i]);
      continue;
    }
    ++i;
    const std::string_view p = k < params.size() ? std::string_view(params[k]) : std::string_view();
    const char type = k < types.size() ? types[k] : '?';
    const bool hex_text =
        p.size() % 2 == 0 && std::all_of(p.begin(), p.end(), [](char c) { return hex_digit(c) >= 0; });
    const std::string_view digits = p.starts_with('-') ? p.substr(1) : p;
    const bool number = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
    if (k < params.size() && type == 'x' && hex_text)
      out.append("X'").append(p).push_back('\'');
    else if (k < params.size() && type == 'n' && number)
      out.append(p);
    else
      out.append("NULL");
  }
  return out;
}

// A compound statement around `body`: one transaction, rolled back (and
// the error passed on) when any of its statements fails.
inline constexpr std::string_view kCompound = "BEGIN NOT ATOMIC ";
inline std::string transaction(std::string_view body) {
  return fmt::format("{}DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END; START TRANSACTION; "
                     "{} COMMIT; END",
                     kCompound, body);
}

// A renewal's lists: `names` the locks' names ("X'..',X'..'"), `pairs`
// their (name, owner) pairs ("(X'..',X'..'),..."), for `lock_name IN`
// beside `(lock_name, owner) IN`: MariaDB reads a single pair as a full
// index scan, the names as a range on the key.
struct RenewalLists {
  std::string names;
  std::string pairs;
  template <class Locks, class Members>
  RenewalLists(const Locks& locks, const Members& members) {
    for (std::size_t i : members) {
      const char* sep = names.empty() ? "" : ",";
      const std::string n = hex(locks[i].name);
      names += sep + n;
      pairs += sep + ("(" + n + "," + hex(locks[i].token) + ")");
    }
  }
};

}  // namespace lockwatch::detail::sql
