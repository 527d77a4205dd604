#include "store/sqlcommon/sql_recipe.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "store/kind_rules.hpp"
#include "store/sqlcommon/inspection.hpp"

namespace lockwatch::detail::sqlcommon {

void AcquireBatch::fail(const StoreError& error) const {
  Acquired out;
  out.error = error;
  for (const auto& l : locks) l.answer(out);
}

bool AcquireQueue::add(std::span<const LockRef> locks, LockStore::AcquireDone done) {
  auto shared_done = std::make_shared<LockStore::AcquireDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    const LockRef& l = locks[i];
    (l.kind.exclusive_kind() ? exclusive_queue_ : kind_queue_)
        .push_back({std::string(l.name), std::string(l.token), l.ttl, l.kind, l.waits, i, shared_done});
  }
  return !locks.empty();
}

namespace {

// `part` as one batch, sent.
void send_batch(const SendBatch& send, std::vector<PendingAcquire> part) {
  auto batch = std::make_shared<AcquireBatch>();
  batch->locks = std::move(part);
  send(std::move(batch));
}

}  // namespace

void AcquireQueue::flush() {
  if (!kind_queue_.empty()) {
    std::vector<PendingAcquire> all = std::move(kind_queue_);
    kind_queue_.clear();
    by_name(all);
    for (std::size_t from = 0; from < all.size(); from += kKindGroup) {
      const auto to = std::min(all.size(), from + kKindGroup);
      send_batch(kinds_, {std::make_move_iterator(all.begin() + from), std::make_move_iterator(all.begin() + to)});
    }
  }
  if (exclusive_queue_.empty()) return;
  std::vector<PendingAcquire> all = std::move(exclusive_queue_);
  exclusive_queue_.clear();
  by_name(all);
  auto send = [this](std::vector<PendingAcquire> part) { send_batch(exclusive_, std::move(part)); };
  if (dialect_.repeated_names) return in_chunks(all, send);
  std::vector<std::vector<PendingAcquire>> rounds;  // the k-th request of each name in the k-th
  for (std::size_t i = 0; i < all.size();) {
    std::size_t j = i;
    for (; j < all.size() && all[j].name == all[i].name; ++j) {
      if (rounds.size() <= j - i) rounds.emplace_back();
      rounds[j - i].push_back(std::move(all[j]));
    }
    i = j;
  }
  for (auto& round : rounds) in_chunks(round, send);
}

void split_releases(std::span<const LockRef> locks, LockStore::ReleaseDone done,
                    std::vector<PendingRelease>& exclusive, std::vector<PendingRelease>& kinds) {
  auto shared_done = std::make_shared<LockStore::ReleaseDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    PendingRelease r{std::string(locks[i].name), std::string(locks[i].token), i, shared_done, locks[i].kind};
    (locks[i].kind.exclusive_kind() ? exclusive : kinds).push_back(std::move(r));
  }
}

bool resend(const AcquireBatchPtr& batch, const StoreError& error, const SendBatch& send, bool split) {
  if (retry_later(batch, error, send)) return true;
  if (!split || batch->locks.size() < 2 || error.kind != StoreError::Kind::kRefused) return false;
  for (auto& l : batch->locks) send_batch(send, {std::move(l)});
  return true;
}

std::optional<std::chrono::milliseconds> exclusive_busy(Acquired& out, const PendingAcquire& lock,
                                                        std::string_view marker, const std::string& server) {
  if (marker == kinds::kSharedMarker) {
    const auto mark = std::min(lock.ttl, kWriterMark);
    out.busy_for = std::max(std::chrono::milliseconds(1), std::min(out.busy_for, mark / 2));
    return mark;
  }
  out.status = Acquired::Status::kFailed;
  out.error = refusal(server, lock, marker);
  return std::nullopt;
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
  Acquired out;
  if (rows.size() != 1 || rows.null(0, 0) || rows.null(0, 1)) {
    out.error = StoreError::unavailable(server, "no answer to the acquisition");
    return out;
  }
  const std::string_view verdict = rows.at(0, 0);
  if (verdict == "t" || verdict == "r") {
    out.status = Acquired::Status::kTaken;
    out.fence = static_cast<std::uint64_t>(to_ll(rows.at(0, 1)));
  } else if (verdict == "b") {
    out.status = Acquired::Status::kBusy;
    const std::optional<long long> busy_us = rows.maybe(0, 2);
    auto busy = busy_us ? ms_up(*busy_us) : std::chrono::milliseconds(1);
    if (lock.kind.mode() == LockKind::Mode::kFair) busy = std::min(busy, lock.ttl / 3);
    out.busy_for = std::max(busy, std::chrono::milliseconds(1));
  } else {
    out.error = refusal(server, lock, rows.bytes(0, 3));
  }
  return out;
}

std::size_t renewal_groups(
    const Dialect& dialect, std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
    LockStore::RenewDone done,
    const std::function<void(RenewBatchPtr, std::vector<std::size_t>, std::chrono::milliseconds, bool)>& send) {
  auto batch = std::make_shared<RenewBatch>();
  batch->locks.assign(locks.begin(), locks.end());
  batch->keepalive = std::move(keepalive);
  batch->done = std::move(done);
  std::vector<std::size_t> order(locks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return locks[a].name < locks[b].name; });
  // Exclusive leases first (false < true), then by ttl where a statement has one.
  std::map<std::pair<bool, long long>, std::vector<std::size_t>> groups;
  for (std::size_t i : order)
    groups[{!locks[i].kind.exclusive_kind(), dialect.ttl_per_lease ? 0 : locks[i].ttl.count()}].push_back(i);
  std::size_t statements = 0;
  for (auto& [group, members] : groups) {
    for (std::size_t from = 0; from < members.size(); from += kChunk) {
      const std::size_t to = std::min(members.size(), from + kChunk);
      send(batch, std::vector<std::size_t>(members.begin() + from, members.begin() + to),
           std::chrono::milliseconds(group.second), group.first);
      ++statements;
    }
  }
  return statements;
}

}  // namespace lockwatch::detail::sqlcommon
