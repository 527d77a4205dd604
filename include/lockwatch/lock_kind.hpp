/// @file
/// lockwatch/lock_kind.hpp: how a lock on a key is held.
///
///   exclusive()   one holder (the default): a mutex, and the writer of a
///                 read-write lock
///   shared()      many holders, and no exclusive one: the readers of a
///                 read-write lock on the same key. A waiting writer stops
///                 new readers (writers are not starved); each reader's lease
///                 is its own, renewed and lost like any other, so a dead
///                 reader frees its share after its ttl. Readers see the
///                 fencing token of the last writer's grant.
///   permits(n)    at most n holders at once (a semaphore); every permit is a
///                 lease, so a crashed holder's permit comes back after its
///                 ttl. Each permit's grant raises the fencing token. Callers
///                 that name the key with another n, or hold it as another
///                 kind, fail with InvalidArgument: never an over-admission.
///   fair()        one holder, granted in the order the waiters arrived,
///                 across processes: the store keeps a queue of waiters. A
///                 waiter keeps its place while it waits (each attempt
///                 refreshes it, at least every ttl/3) and leaves it when it
///                 gives up; one that dies is dropped from the queue within
///                 its ttl, so it never blocks the others. Each grant raises
///                 the fencing token.
///
/// A key is used as one family while anyone holds it: exclusive and shared
/// together, or permits alone, or fair alone. A store that cannot give a kind its guarantee
/// refuses it with Unsupported, never a weaker lock.
#pragma once

#include <cstdint>
#include <string>

namespace lockwatch {

/// How a lock on a key is held: exclusive (the default), shared, permits(n) or fair (see the
/// header comment). A small value type.
class LockKind {
 public:
  /// The kinds.
  enum class Mode : std::uint8_t { kExclusive, kShared, kPermits, kFair };

  constexpr LockKind() noexcept = default;  ///< exclusive
  /// One holder (the default): a mutex, and the writer of a read-write lock.
  static constexpr LockKind exclusive() noexcept { return {}; }
  /// Many holders, and no exclusive one: the readers of a read-write lock.
  static constexpr LockKind shared() noexcept { return LockKind(Mode::kShared, 0); }
  /// At most `n` holders at once (a semaphore).
  static constexpr LockKind permits(std::uint32_t n) noexcept { return LockKind(Mode::kPermits, n); }

  /// One holder, granted in the waiters' order of arrival (a fair lock).
  static constexpr LockKind fair() noexcept { return LockKind(Mode::kFair, 0); }

  /// Which of the kinds.
  constexpr Mode mode() const noexcept { return mode_; }
  /// permits(n): n; 0 for the other kinds.
  constexpr std::uint32_t permit_count() const noexcept { return permits_; }
  /// True for exclusive().
  constexpr bool exclusive_kind() const noexcept { return mode_ == Mode::kExclusive; }
  /// Equal when of the same mode and permit count.
  constexpr bool operator==(const LockKind&) const noexcept = default;

  /// True for the kinds with one holder at a time: exclusive() and fair().
  constexpr bool single_holder() const noexcept { return mode_ == Mode::kExclusive || mode_ == Mode::kFair; }
  /// "exclusive", "shared", "3 permits", "fair".
  std::string describe() const {
    switch (mode_) {
      case Mode::kShared: return "shared";
      case Mode::kFair: return "fair";
      case Mode::kPermits: return std::to_string(permits_) + (permits_ == 1 ? " permit" : " permits");
      case Mode::kExclusive: break;
    }
    return "exclusive";
  }

 private:
  constexpr LockKind(Mode mode, std::uint32_t permits) noexcept : mode_(mode), permits_(permits) {}
  Mode mode_ = Mode::kExclusive;
  std::uint32_t permits_ = 0;
};

}  // namespace lockwatch
