#include "store/sqlcommon/sql_recipe.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "store/kind_rules.hpp"
#include "store/sqlcommon/inspection.hpp"

namespace lockwatch::detail::sqlcommon {

void exclusive_busy(Acquired& out, const PendingAcquire& lock, std::string_view marker, const std::string& server) {
  if (marker == kinds::kSharedMarker) {
    const auto mark = std::min(lock.ttl, kinds::kWriterMark);
    out.busy_for = std::max(std::chrono::milliseconds(1), std::min(out.busy_for, mark / 2));
    return;
  }
  out.status = Acquired::Status::kFailed;
  out.error = refusal(server, lock, marker);
}

void answer_acquisitions(const AcquireBatch& batch, const Rows& rows, const std::string& server) {
  const auto& locks = batch.locks;
  std::vector<bool> answered(locks.size(), false);
  for (int r = 0; r < rows.size(); ++r) {
    const long long i = to_ll(rows.at(r, 0)) - 1;
    if (i < 0 || i >= static_cast<long long>(locks.size()) || answered[i]) continue;
    answered[i] = true;
    if (!rows.null(r, 1)) {
      locks[i].answer(Acquired::taken(static_cast<std::uint64_t>(to_ll(rows.at(r, 1)))));
      continue;
    }
    // Busy; no time (PostgreSQL: no row in the statement's snapshot,
    // taken meanwhile by a statement that started later): a moment.
    Acquired out{Acquired::Status::kBusy, 0,
                 rows.null(r, 2) ? std::chrono::milliseconds(1) : ms_up(to_ll(rows.at(r, 2))), {}};
    std::string owner;
    if (!rows.null(r, 3) && rows.read_bytes(r, 3, owner)) exclusive_busy(out, locks[i], owner, server);
    locks[i].answer(out);
  }
  for (std::size_t i = 0; i < answered.size(); ++i)
    if (!answered[i])
      locks[i].answer(Acquired::failed(StoreError::unavailable(server, "the acquisition's answer left a lock out")));
}

StoreError refusal(const std::string& server, const PendingAcquire& lock, std::string_view owner) {
  const LockKind held = kinds::kind_of_marker(owner);
  const auto permits = [](LockKind k) { return fmt::format("{} permit(s)", k.permit_count()); };
  return StoreError::invalid(
      server, fmt::format("{} is held as {}; this call asked for it {}", lock.name,
                          held.mode() == LockKind::Mode::kPermits ? "a semaphore of " + permits(held) : held.describe(),
                          lock.kind.mode() == LockKind::Mode::kPermits ? permits(lock.kind) : lock.kind.describe()));
}

Acquired kind_answer(const PendingAcquire& lock, const Rows& rows, const std::string& server) {
  if (rows.size() != 1 || rows.null(0, 0) || rows.null(0, 1))
    return Acquired::failed(StoreError::unavailable(server, "no answer to the acquisition"));
  const std::string_view verdict = rows.at(0, 0);
  if (verdict == "t" || verdict == "r") return Acquired::taken(static_cast<std::uint64_t>(to_ll(rows.at(0, 1))));
  if (verdict != "b") return Acquired::failed(refusal(server, lock, rows.bytes(0, 3)));
  auto busy = rows.null(0, 2) ? std::chrono::milliseconds(1) : ms_up(to_ll(rows.at(0, 2)));
  if (lock.kind.mode() == LockKind::Mode::kFair) busy = std::min(busy, lock.ttl / 3);
  return Acquired::busy(busy);
}

}  // namespace lockwatch::detail::sqlcommon
