// lib/store/kind_rules.hpp: the rules every store and the wait queue apply
// to the kinds of lock (LockKind), written once: the markers, the family
// rule, how a refusal names a kind, and admission.
//
// Pure functions over values: no state, any thread, no allocation but the
// strings they return.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/whole_number.hpp"
#include "lockwatch/lock_kind.hpp"

namespace lockwatch::detail::kinds {

// What a SQL lock row's owner holds while shared, permit or fair holders (or
// fair waiters) hold the key: owner tokens are hex, so none of them starts
// with "lockwatch:"; stored as they are, so existing tables keep their meaning.
inline constexpr std::string_view kSharedMarker = "lockwatch:shared";
inline constexpr std::string_view kPermitsMarker = "lockwatch:permits:";  // + n
inline constexpr std::string_view kFairMarker = "lockwatch:fair";
inline constexpr std::string_view kMarkerPrefix = "lockwatch:";

// How a store spells the markers: a SQL lock row's owner (kRowMarkers), a
// ZooKeeper node's name ("r", "p2", "f": zk_nodes.hpp).
struct Markers {
  std::string_view shared, permits, fair;  // permits: followed by n
};
inline constexpr Markers kRowMarkers{kSharedMarker, kPermitsMarker, kFairMarker};

// The marker of `kind`; empty for exclusive (its row holds the owner token).
inline std::string marker(LockKind kind, const Markers& spelling = kRowMarkers) {
  switch (kind.mode()) {
    case LockKind::Mode::kShared: return std::string(spelling.shared);
    case LockKind::Mode::kPermits: return std::string(spelling.permits) + std::to_string(kind.permit_count());
    case LockKind::Mode::kFair: return std::string(spelling.fair);
    case LockKind::Mode::kExclusive: break;
  }
  return {};
}

// The kind a marker says the key is held as; exclusive for anything else
// (an owner token, or a marker not read whole: the strictest reading).
inline LockKind kind_of_marker(std::string_view owner, const Markers& spelling = kRowMarkers) {
  if (owner == spelling.shared) return LockKind::shared();
  if (owner == spelling.fair) return LockKind::fair();
  if (!owner.starts_with(spelling.permits)) return LockKind::exclusive();
  const auto n = whole_number<std::uint32_t>(owner.substr(spelling.permits.size()));
  return n && *n > 0 ? LockKind::permits(*n) : LockKind::exclusive();
}

// How long a waiting writer's mark stops new readers without an attempt of
// its own (its ttl if shorter): a writer that gave up holds them back this
// long at most.
inline constexpr std::chrono::milliseconds kWriterMark{2000};

// Whether a key held as `held` lets a call ask for it as `asked`: exclusive
// and shared are one family (a read-write lock); permits only with the
// holders' n; fair only with fair.
constexpr bool same_family(LockKind held, LockKind asked) noexcept {
  const auto rw = [](LockKind k) {
    return k.mode() == LockKind::Mode::kExclusive || k.mode() == LockKind::Mode::kShared;
  };
  if (rw(held) || rw(asked)) return rw(held) && rw(asked);
  return held == asked;
}

// A key's kind as a refusal names it: "an exclusive lock", "a shared lock",
// "a semaphore of 2 permits", "a fair lock".
inline std::string held_as(LockKind kind) {
  switch (kind.mode()) {
    case LockKind::Mode::kShared: return "a shared lock";
    case LockKind::Mode::kPermits: return "a semaphore of " + kind.describe();
    case LockKind::Mode::kFair: return "a fair lock";
    case LockKind::Mode::kExclusive: break;
  }
  return "an exclusive lock";
}

// A call refused for its kind: "the lock 'N' is held as a shared lock; this
// call asked for it 2 permits".
inline std::string refusal(std::string_view name, LockKind held, LockKind asked) {
  return "the lock '" + std::string(name) + "' is held as " + held_as(held) + "; this call asked for it " +
         asked.describe();
}

// Whether a call of `kind` may ask the store for a key this process holds
// `single` times as exclusive or fair and `many` times as shared or
// permits: none while it is held as one holder; a permit only while fewer
// than n are held; a reader, or a writer, while it is held shared (the
// writer's attempt is what makes the store stop new readers for it). The
// store still decides.
constexpr bool admits(std::uint32_t single, std::uint32_t many, LockKind kind) noexcept {
  return single == 0 && (kind.mode() != LockKind::Mode::kPermits || many < kind.permit_count());
}

}  // namespace lockwatch::detail::kinds
