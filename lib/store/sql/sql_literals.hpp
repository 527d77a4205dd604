// lib/store/sql/sql_literals.hpp: how the SQL store writes values into its
// statements and reads numbers back from their text answers.
//
// Names and tokens go in as hex literals: any bytes, no escaping, nothing a
// key holds can change a statement. The kinds' markers are in
// store/kind_rules.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>

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
