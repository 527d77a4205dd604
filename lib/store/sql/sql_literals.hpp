// lib/store/sql/sql_literals.hpp: how the SQL store writes values into its
// statements: a named statement's parameters (fill()), a batch's locks as
// rows of a derived table, compound transactions.
//
// Names and tokens go in as hex literals: any bytes, no escaping, nothing a
// key holds can change a statement. The kinds' markers are in
// store/kind_rules.hpp. Pure functions; any thread.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "store/kind_rules.hpp"
#include "store/sqlcommon/values.hpp"

namespace lockwatch::detail::sql {

using kinds::kMarkerPrefix;
using kinds::kSharedMarker;
using sqlcommon::micros;
// The one writer's mark of a lock, in the companion table.
inline constexpr std::string_view kWriterOwner = "lockwatch:writer";

// `bytes` as a hex literal, X'..'.
inline std::string hex(std::string_view bytes) { return "X'" + sqlcommon::to_hex(bytes) + "'"; }

// The items of an array parameter ({"6b31","6b32"} or {1,2}:
// sqlcommon::array_literal()).
inline std::vector<std::string_view> items(std::string_view p) {
  std::vector<std::string_view> out;
  if (p.size() < 2 || p.front() != '{' || p.back() != '}') return out;
  for (p = p.substr(1, p.size() - 2); !p.empty();) {
    const std::size_t comma = std::min(p.find(','), p.size());
    std::string_view item = p.substr(0, comma);
    if (item.size() >= 2 && item.front() == '"' && item.back() == '"') item = item.substr(1, item.size() - 2);
    out.push_back(item);
    p.remove_prefix(std::min(comma + 1, p.size()));
  }
  return out;
}

// `p` as a literal of `type`: 'x' hex text as X'..', 'n' a number as it
// is; anything else (or none) as NULL, so nothing a caller passes can
// change a statement.
inline void append_literal(std::string& out, const std::string_view* p, char type) {
  constexpr auto npos = std::string_view::npos;
  const std::size_t sign = p && p->starts_with('-') ? 1 : 0;  // a number's
  if (type == 'x' && p && p->size() % 2 == 0 && p->find_first_not_of("0123456789abcdefABCDEF") == npos)
    out.append("X'").append(*p).push_back('\'');
  else if (type == 'n' && p && p->size() > sign && p->find_first_not_of("0123456789", sign) == npos)
    out.append(*p);
  else
    out.append("NULL");
}

// `text` with each $1..$9 in it replaced by that one of `params` as a
// literal, as `types` says at its place ('x', 'n': append_literal()), and
// `$[sep|body$]` by `body` once per item of the first array parameter
// (types 'X', 'N': an array of either), joined by `sep`. In a body, $k of
// an array is its item there and $0 the item's position (from 1);
// elsewhere $k of an array is its first item.
inline std::string fill(std::string_view text, std::string_view types, const std::vector<std::string>& params) {
  std::vector<std::vector<std::string_view>> lists(params.size());
  std::size_t count = 0;
  for (std::size_t k = params.size(); k-- > 0;)
    if (k < types.size() && (types[k] == 'X' || types[k] == 'N')) count = (lists[k] = items(params[k])).size();
  std::string out;
  const auto put = [&](std::string_view t, std::size_t at) {
    for (std::size_t i = 0; i < t.size(); ++i) {
      const std::size_t k = i + 1 < t.size() ? static_cast<std::size_t>(t[i + 1] - '0') : 10;
      if (t[i] != '$' || k > 9) {
        out.push_back(t[i]);
        continue;
      }
      ++i;
      if (k == 0) {
        out += std::to_string(at);
        continue;
      }
      const char type = k <= types.size() ? types[k - 1] : '?';
      const bool list = type == 'X' || type == 'N';
      const std::size_t item = std::max<std::size_t>(at, 1);
      std::string_view value;
      const bool present = k <= params.size() && (!list || item <= lists[k - 1].size());
      if (present) value = list ? lists[k - 1][item - 1] : std::string_view(params[k - 1]);
      append_literal(out, present ? &value : nullptr, list ? static_cast<char>(type - 'A' + 'a') : type);
    }
  };
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t open = std::min(text.find("$[", i), text.size());
    put(text.substr(i, open - i), 0);
    if (open == text.size()) break;
    const std::size_t bar = text.find('|', open), close = text.find("$]", open);
    for (std::size_t n = 1; n <= count; ++n) {
      if (n > 1) out.append(text.substr(open + 2, bar - open - 2));
      put(text.substr(bar + 1, close - bar - 1), n);
    }
    i = close + 2;
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

// A batch as a derived table r, a row per lock: its position (i, from 1),
// name (nm) and token (tk), from the statement's first two arrays (fill()),
// and `more` columns.
inline std::string batch_rows(std::string_view more = "") {
  return fmt::format("($[ UNION ALL |SELECT $0 AS i, $1 AS nm, $2 AS tk{}$]) r", more);
}
// A batch's names (for `lock_name IN`) and its (name, token) pairs (for
// `(lock_name, owner) IN`, beside the names: MariaDB reads a single pair
// as a full index scan, the names as a range on the key).
inline constexpr std::string_view kNames = "$[,|$1$]";
inline constexpr std::string_view kPairs = "$[,|($1, $2)$]";

}  // namespace lockwatch::detail::sql
