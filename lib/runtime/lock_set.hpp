// lib/runtime/lock_set.hpp: several keys held all or none (lockwatch::all_of).
//
// A set is first tried whole: every key at once, none waited for (one
// round trip on a pipelined store). When that finds every key free, the set
// is held; when a key is busy, the keys taken are given back at once and
// the set is taken the ordered way: its keys one by
// one in canonical order (byte order), each through the runtime's own
// acquisition (SetAcquirer), keeping the keys already taken while it waits
// for the next one within what is left of the call's wait. Two callers of overlapping
// sets always contend first on the lowest key they share, so neither holds
// a key the other waits for while waiting itself: no deadlock, and a
// set-waiter queues on each key like any waiter of that key. Whole-set
// tries hold nothing while they wait (they do not wait). A call that
// ends without the whole set (busy past its wait, an error, cancelled)
// drops the handles it took, which releases them.
//
// Held, a set is one SetRecord: a Lease over its keys' leases, which the
// watchdog keeps as it keeps any (keys granted within a tick fall due
// together, and renewals due together travel in one command per node). The first key lost marks the set
// lost with its reason and stops the set's work; releasing the set releases
// every key it took and reports the first error in canonical order.
//
// Threads: SetAcquirer runs its steps one after another, the first on the
// caller's thread and each next one on the notifier thread where the
// previous key's outcome arrives. A SetRecord's accessors are safe from any
// thread; its parts' stops reach it on the notifier thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "lockwatch/lease.hpp"
#include "lockwatch/lock_handle.hpp"
#include "lockwatch/runtime.hpp"
#include "runtime/completion.hpp"
#include "runtime/lease_record.hpp"
#include "runtime/lock_spec.hpp"

namespace lockwatch::detail {

struct HandleCall;

// What lease.cpp and LockHandle need of a set's lease.
struct LeaseAccess {
  static bool is_set(const Lease& l) noexcept { return l.set_; }
};

class SetRecord final : public Lease, public HandleState {
 public:
  // `parts`: each key's lease, in the order of `keys` (canonical); `owned`:
  // the handles of the keys this set took (the others' leases are borrowed
  // from calls around this one on the caller's thread, which outlive it).
  SetRecord(std::string name, std::vector<std::string> keys, std::vector<const LeaseRecord*> parts,
            std::vector<LockHandle> owned, std::chrono::milliseconds ttl, std::shared_ptr<const RuntimeLinks> links);
  ~SetRecord();
  SetRecord(const SetRecord&) = delete;
  SetRecord& operator=(const SetRecord&) = delete;

  // Once, right after it is made: follows its parts' ends.
  static void start_watching(const std::shared_ptr<SetRecord>& self);
  // Releases the keys it took; finish() once every release is answered.
  static void release_keys(const std::shared_ptr<SetRecord>& self);

  std::span<const std::string> set_keys() const noexcept { return keys_; }
  const std::vector<const LeaseRecord*>& parts() const noexcept { return parts_; }
  std::uint64_t token_of(std::string_view key) const;
  std::chrono::milliseconds least_remaining() const noexcept;
  std::uint64_t least_renewals() const noexcept;
  void watch(const std::shared_ptr<LeaseWatcher>& w);

 private:
  struct PartStop {
    SetRecord* set;
    std::size_t index;
    void operator()() const noexcept { set->part_stopped(index); }
  };
  void part_stopped(std::size_t i) noexcept;
  void part_lost(std::size_t i, LostReason reason) noexcept;
  void end_watchers(std::optional<LostReason> reason) noexcept;
  void released(std::vector<std::exception_ptr> errors) noexcept;

  std::vector<std::string> keys_;
  std::vector<const LeaseRecord*> parts_;
  std::vector<LockHandle> owned_;
  std::vector<std::unique_ptr<std::stop_callback<PartStop>>> part_stops_;
  std::vector<LeaseWatch> part_watches_;
  std::mutex mu_;  // guards the three below
  std::vector<std::shared_ptr<LeaseWatcher>> watchers_;
  bool watch_ended_ = false;
  std::size_t lost_index_ = 0;  // the key lost first, once lost()
};

// Takes a set's keys in canonical order (see the file comment).
class SetAcquirer final : public std::enable_shared_from_this<SetAcquirer> {
 public:
  using Clock = std::chrono::steady_clock;
  // `spec` checked by the runtime (its set distinct and in order);
  // `borrowed` (empty, or one entry per key) names the keys held by calls
  // around this one on the caller's thread. `done` runs on the notifier
  // thread, once. Throws nothing the caller must handle beyond what
  // admission threw already.
  static AcquireTicket start(detail::RuntimeImpl& impl, LockSpec spec, std::vector<const LeaseRecord*> borrowed,
                             AcquireCallback done);

 private:
  LockSpec key_spec(std::size_t i) const;
  // Every key at once, none waited for.
  void try_whole();
  bool ordered_ = false;  // taken the ordered way (its keys granted at different times)
  void tried(std::size_t i, std::exception_ptr error, LockHandle handle);
  // The ordered way, from the key next_.
  void next();
  void taken(std::exception_ptr error, LockHandle handle);
  void fail(std::exception_ptr error);
  void granted();
  void cancel_current();

  std::weak_ptr<detail::RuntimeImpl> runtime_;
  LockSpec spec_;
  Clock::time_point deadline_;
  std::vector<const LeaseRecord*> borrowed_;
  std::vector<LockHandle> held_;
  std::size_t next_ = 0;  // the key being taken
  // The whole-set try: answers still due, and the first error among them
  // in canonical order (guarded by mu_: answers may come on any thread).
  std::size_t tries_left_ = 0;
  std::vector<std::exception_ptr> try_errors_;
  std::shared_ptr<HandleCall> outer_;
  std::mutex mu_;  // guards the two below (the canceller reads them)
  AcquireTicket current_;
  std::size_t current_step_ = 0;
};

}  // namespace lockwatch::detail
