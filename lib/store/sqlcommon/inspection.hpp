// lib/store/sqlcommon/inspection.hpp: what the SQL stores (MariaDB and
// PostgreSQL) answer an operator and a scheduled job's period claim
// (JobClaims) with, assembled once over their answers.
//
// Both keep a lock row (owner token or kind marker, deadline, fence, the
// exclusive holder's name and grant time) and a holders' table (shared,
// permit and fair holders). inspect() reads the two in one round trip;
// an Inspection turns the two answers into a LockInfo. list_inspected()
// inspects each name a listing found and keeps the held ones.
//
// Threading: the store's loop thread, as its callbacks. Costs: one
// LockInfo per lock; a listing inspects its names all at once (its limit
// bounds them).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "store/capabilities.hpp"
#include "store/sqlcommon/values.hpp"

namespace lockwatch::detail::sqlcommon {

// A holder from an answer's columns `at`..`at + 3`: token, owner name,
// grant time (NULL where none was recorded) and how long ago that was, in
// µs on the server's clock.
HolderInfo holder(const Rows& rows, int row, int at);

// One inspect() call: the lock row's answer, then the holders' answer
// (in this order, as a connection answers them), then done() once; a
// failure of either answers first, and once.
class Inspection {
 public:
  explicit Inspection(OperatorTools::InspectDone done) : done_(std::move(done)) {}
  // The lock row (none: the name was never locked): µs left (the latest
  // holder's, for a marker), its fence, owner (token or marker) and, for
  // an owner token, its holder (holder()'s columns).
  void lock_answer(const Rows& rows, const StoreError* error);
  // The live shared, permit and fair holders (holder()'s columns each):
  // they count when the key is held as a kind with a marker. Answers.
  void holders_answer(const Rows& rows, const StoreError* error);

 private:
  LockInfo info_;
  OperatorTools::InspectDone done_;  // none once a failed lock row's answer answered
};

// Inspects each of the names a listing's `rows` hold in their first column
// (the store's names) through `tools`, then gives `done` the held ones in
// the names' order, each with its key (the name past `key_prefix` bytes);
// any error fails the listing.
void list_inspected(OperatorTools& tools, const Rows& rows, std::size_t key_prefix, LockListing::ListDone done);

// A period claim is one conditional write on the job's lock row (the
// lease is the caller's and unexpired, the server's clock has reached the
// period's start, no period as late was run), read back in the same round
// trip: whether the write took, whether the lease is the caller's, and
// the last period run. Fills `out` from the answer's row at columns `at`..`at + 3`: the
// server's clock, whether the lease is the caller's, whether the period
// is due (not read: the others decide) and the last period run (NULL:
// none ever); `claimed` the write took.
void read_claim(ClaimResult& out, const Rows& rows, int at, bool claimed, std::int64_t period);

// Microseconds left, as an answer gave them, in whole milliseconds (up).
inline std::chrono::milliseconds ms_up(long long us) {
  return std::chrono::milliseconds(us <= 0 ? 0 : (us + 999) / 1000);
}

// A LIKE pattern for the names that start with `prefix`: its '%', '_' and
// backslashes escaped with a backslash (both servers' default escape), then '%'.
inline std::string like_prefix(std::string_view prefix) {
  std::string out;
  out.reserve(prefix.size() + 1);
  for (char c : prefix) {
    if (c == '%' || c == '_' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('%');
  return out;
}

}  // namespace lockwatch::detail::sqlcommon
