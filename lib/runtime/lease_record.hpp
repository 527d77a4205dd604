// lib/runtime/lease_record.hpp: a held lease as the watchdog tracks it.
//
// Ownership: the public part (Lease) is read by the work from any thread
// (atomics). `call` is run once on the thread that does the work (a pool
// thread, or the caller's for a nested call); everything else belongs to
// the loop thread.
#pragma once

#include <array>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <exception>
#include <utility>
#include <variant>
#include <vector>

#include "ops/hold_warning.hpp"
#include "core/small_string.hpp"
#include "core/token.hpp"
#include "lockwatch/lease.hpp"
#include "lockwatch/lock_request.hpp"
#include "lockwatch/locked_work.hpp"
#include "lockwatch/thread_pool.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "runtime/step.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class RuntimeImpl;
class Watchdog;

// A valid ttl (1 .. max_ttl) in milliseconds as decimal text, kept inline
// in 11 bytes (max_ttl has 9 digits).
class TtlText {
 public:
  TtlText() = default;
  explicit TtlText(std::chrono::milliseconds ttl) noexcept
      : size_(static_cast<std::uint8_t>(write(ttl, text_.data()) - text_.data())) {}
  std::string_view view() const noexcept { return {text_.data(), size_}; }
  // Writes the text of `ttl` at `to` (room for kMaxSize bytes) and returns
  // its end (`to` itself for a ttl that is not valid).
  static constexpr std::size_t kMaxSize = 10;
  static char* write(std::chrono::milliseconds ttl, char* to) noexcept {
    auto r = std::to_chars(to, to + kMaxSize, ttl.count());
    return r.ec == std::errc() ? r.ptr : to;
  }

 private:
  std::array<char, 10> text_{};
  std::uint8_t size_ = 0;
};
static_assert(max_ttl.count() < 10'000'000'000, "a valid ttl fits TtlText");
static_assert(sizeof(TtlText) == 11);

// Runs `task` off the calling thread for a completion handler: on the
// runtime's notifier thread, or, once the runtime is gone (or stopped
// taking tasks), on a thread of its own. Any thread.
void post_completion(const std::weak_ptr<ThreadPool>& notifier, UniqueFunction task) noexcept;

// What a lease knows of the runtime that granted it, without keeping the
// runtime alive: one per runtime, shared by its leases (a lease pays one
// pointer pair for both).
struct RuntimeLinks {
  std::weak_ptr<detail::RuntimeImpl> runtime;
  std::weak_ptr<ThreadPool> notifier;  // the runtime's, for handlers
  // The runtime's: its leases' timeouts run there (LeaseRecord::run, on
  // the loop thread, so while the runtime lives).
  Watchdog* watchdog = nullptr;
};

// What a LockHandle holds (as part of its lease's record): whether the
// lease ended, how, and what awaits the release, made only when the handle
// releases: a promise (release()) or a handler (release(handler)).
struct HandleState {
  // Loop thread: the held lease ended (released, or lost and given back).
  void finish(std::exception_ptr error) noexcept {
    error_ = error;
    if (outcome_.exchange(kFinished, std::memory_order_acq_rel) == kAwaited) settle();
  }
  // The handle's thread, once: the future of the release.
  std::future<void> released() {
    awaiter_ = std::make_unique<Awaiter>(std::in_place_index<0>);
    auto future = std::get<0>(*awaiter_).get_future();
    if (outcome_.exchange(kAwaited, std::memory_order_acq_rel) == kFinished) settle();
    return future;
  }
  // The handle's thread, once: `handler` is called with the outcome, off
  // this thread (post_completion).
  void released(std::function<void(std::exception_ptr)> handler) {
    awaiter_ = std::make_unique<Awaiter>(std::in_place_index<1>, std::move(handler));
    if (outcome_.exchange(kAwaited, std::memory_order_acq_rel) == kFinished) settle();
  }
  std::shared_ptr<const RuntimeLinks> links;  // set at grant
  // The runtime (null once it is gone), and its notifier.
  std::shared_ptr<detail::RuntimeImpl> runtime() const noexcept { return links ? links->runtime.lock() : nullptr; }
  const std::weak_ptr<ThreadPool>& notifier() const noexcept {
    static const std::weak_ptr<ThreadPool> none;
    return links ? links->notifier : none;
  }

 private:
  // Whichever of finish() and released() comes second settles the promise.
  enum : std::uint8_t { kOpen, kAwaited, kFinished };
  void settle() noexcept {
    if (awaiter_->index() == 1) {
      post_completion(notifier(), [a = std::move(awaiter_), e = error_] { std::get<1>(*a)(e); });
      return;
    }
    try {
      auto& promise = std::get<0>(*awaiter_);
      if (error_)
        promise.set_exception(error_);
      else
        promise.set_value();
    } catch (...) {
    }
  }
  // The release's promise (released()) or its handler (released(handler)).
  using Awaiter = std::variant<std::promise<void>, std::function<void(std::exception_ptr)>>;
  std::exception_ptr error_;                  // written before finish() publishes
  std::unique_ptr<Awaiter> awaiter_;          // written before released() publishes
  std::atomic<std::uint8_t> outcome_{kOpen};  // last: the record packs its flags behind it
};

// One handler waiting for a lease's end (Lease::on_lost). Whoever flips
// `state` first, the end or LeaseWatch::cancel(), decides.
struct LeaseWatcher {
  explicit LeaseWatcher(std::function<void(std::optional<LostReason>)> h) : handler(std::move(h)) {}
  bool claim() noexcept {
    bool open = false;
    return done.compare_exchange_strong(open, true, std::memory_order_acq_rel);
  }
  std::function<void(std::optional<LostReason>)> handler;
  std::atomic<bool> done{false};
};

struct LeaseRecord;

// The hand-off streak a lease is part of (runtime/handoff.hpp).
struct HandOffStreak;

// Its timeout is its own (LinkedTimerTask): no node of the wheel's.
struct LeaseRecord final : Lease, LinkedTimerTask, HandleState {
  // What the lease's one wheel timeout means when it fires.
  enum class Phase : std::uint8_t {
    kRenewDue,       // time to renew
    kAwaitingReply,  // a renewal is in flight; the timeout is the local deadline
    kRetryDue,       // a renewal failed transiently; try again
    kExhausted,      // no renewals left; the timeout is the local deadline
    kAwaitingExpiry,  // the release was not confirmed: the key's expiry ends it
  };

  LeaseRecord(std::string key, std::uint64_t fence, std::chrono::milliseconds ttl, Clock::time_point deadline)
      : Lease(std::move(key), fence, ttl, deadline) {}
  ~LeaseRecord() { delete rare_.load(std::memory_order_acquire); }
  LeaseRecord(const LeaseRecord&) = delete;
  LeaseRecord& operator=(const LeaseRecord&) = delete;

  void run(Timeout timeout) noexcept override;

  Clock::time_point deadline() const noexcept {
    return Clock::time_point(Clock::duration(deadline_ns_.load(std::memory_order_relaxed)));
  }
  using Lease::mark_lost;
  using Lease::set_deadline;
  using Lease::request_stop;
  // After set_deadline(): whoever reads the count (acquire) sees the deadline.
  void bump_renewals() noexcept { renewals_.fetch_add(1, std::memory_order_release); }
  // Why renewals failed or the lease was lost ("" if nothing went wrong).
  // Loop thread.
  std::string lost_detail() const {
    const Rare* r = rare_if();
    return r ? r->lost_detail : std::string();
  }
  void set_lost_detail(std::string why) {
    if (!why.empty() || rare_if()) rare().lost_detail = std::move(why);
  }

  // The hold histogram's label: its LockSpec::pattern (a set's keys carry
  // the set's). Set at grant, then read-only.
  std::uint16_t pattern() const noexcept { return metrics_pattern_; }
  void set_pattern(std::uint16_t pattern) noexcept { metrics_pattern_ = pattern; }

  // Held through a LockHandle, not by running work.
  bool is_handle() const noexcept { return call == nullptr; }
  // The work is over (releasing or ended).
  bool work_over() const noexcept { return step >= Step::kReleasing; }

  // Work queued for a pool worker: the worker starts it (begin_work) unless
  // the watchdog gave up on it first (give_up_start), never both. Until it
  // starts, renewals do not spend the lease's `retries`.
  void queue_for_worker() noexcept { start_.store(kQueued, std::memory_order_relaxed); }
  bool begin_work() noexcept { return claim(kStarted); }
  bool give_up_start() noexcept { return claim(kAbandoned); }
  bool started() const noexcept { return start_.load(std::memory_order_acquire) == kStarted; }
  // The work is over and its thread wrote the release itself
  // (DirectLane): the loop learns the work's end from the release's
  // answer. Until then the lease is releasing to the watchdog: renewals
  // keep the key alive, and nothing judges the lease lost but that answer.
  // Any thread; true for the one that marked it (the work's own, once the
  // work started).
  bool mark_release_written() noexcept {
    std::uint8_t started = kStarted;
    return start_.compare_exchange_strong(started, kReleaseWritten, std::memory_order_acq_rel);
  }
  // The release could not be written after all: the loop's way (any thread).
  void unmark_release_written() noexcept { start_.store(kStarted, std::memory_order_release); }
  bool release_written() const noexcept { return start_.load(std::memory_order_acquire) == kReleaseWritten; }
  // Taken by a blocking caller (Runtime::lock): the caller's alone until
  // the loop adopts it (adopted(), before its first renewal is due) or the
  // caller writes its release first (mark_release_written_early()); one
  // compare-and-swap decides which. Set before the record is shared.
  void keep_for_caller() noexcept { start_.store(kCallerKeeps, std::memory_order_relaxed); }
  bool adopted() noexcept { return claim_from(kCallerKeeps, kStarted); }
  bool mark_release_written_early() noexcept { return claim_from(kCallerKeeps, kReleaseWritten); }
  // Nothing was written after all: the caller's again.
  void unmark_release_written_early() noexcept { start_.store(kCallerKeeps, std::memory_order_release); }

  // Loop thread (packed behind the handle state's last byte; the flags
  // share one byte, which only the loop thread writes).
  Phase phase : 3 = Phase::kRenewDue;
  // Held from its grant; releasing once the work is over (Watchdog::end_work);
  // ended once out of the watchdog's registry (Watchdog::finish, or handed
  // on). Loop thread, as the bits below.
  Step step : 3 = Step::kHeld;
  bool release_in_flight : 1 = false;  // renewals go on until the release is confirmed
  // The work is over and the key waits for reserved tokens to be handed on
  // (HandOffStreak::deferred): renewals go on meanwhile.
  bool awaiting_tokens : 1 = false;
  bool no_handoff : 1 = false;  // LockSpec::handoff was false
  // Released because a local hand-off streak reached its bound while
  // others waited here: those wait for the store's release notice too.
  bool yield_on_release : 1 = false;
  bool renewal_counts : 1 = false;  // the renewal in flight spends one of `retries`
  bool call_completed : 1 = false;  // complete_call() ran: the caller has its outcome
  bool uncounted : 1 = false;       // lost: no longer counted among the held (RuntimeStats)
  // A renewal sent before the release has no answer yet: a hung server runs
  // it when it resumes, extending the key past any bound counted from its
  // send (Watchdog::send_renew, Watchdog::released).
  bool renewal_in_doubt : 1 = false;

 private:
  enum : std::uint8_t { kStarted, kQueued, kAbandoned, kReleaseWritten, kCallerKeeps };
  bool claim_from(std::uint8_t from, std::uint8_t to) noexcept {
    return start_.compare_exchange_strong(from, to, std::memory_order_acq_rel);
  }
  std::atomic<std::uint8_t> start_{kStarted};
  // Whether the lease ended for Lease::on_lost (no watcher waits then);
  // under the lease's striped lock.
  bool watch_ended_ = false;

 public:
  // The members are in an order that leaves no padding but 3 bytes after
  // the token (a million held leases pay for every byte).
  // Set once at grant, then read-only. The store's name for the key and
  // the ttl's text are not kept, and the token is kept as its bytes: each
  // request writes their text (LeaseLock, Watchdog::refer), where a
  // million held leases would pay 67 bytes each to keep it.
  PackedToken token;  // the owner token
  // Loop thread: renewals that may still count against `retries`; set at
  // grant, < 0: forever (more than 2^31 - 1 retries count as forever).
  std::int32_t renewals_left = 0;
  static constexpr std::uint32_t kNoSlot = ~std::uint32_t{0};
  std::uint32_t slot = kNoSlot;  // loop thread: its place in the watchdog's registry
  // Set once at grant, then read-only.
  LockKind kind;               // how it is held (renewed and released as such)
  std::shared_ptr<LockedWork> call;  // the work; none for a handle
  // Loop thread.
  Clock::duration renew_after{};  // from a renewal's send to the next one (a tick early)
  Clock::time_point granted_at;   // for the hold time
  Clock::time_point last_sent;  // the latest request that may have extended the key
  // What few leases use, kept off the record (a million held leases pay a
  // pointer each for it): made on first use, by whichever thread needs it
  // first (the watchers are added from any thread), then never replaced.
  struct Rare {
    // Loop thread.
    std::shared_ptr<std::promise<void>> finished;  // a nested call's thread waits on it
    // A worker that starts the work late waits on it for the renewal made
    // at the start (Watchdog::renew_at_start) to be answered.
    std::shared_ptr<std::promise<void>> start_renewal;
    // Local hand-offs (Options::handoff.enabled): shared by the leases of one
    // streak, made at its first token reservation or hand-off (none: the
    // lease took the key from the store while nobody here waited for it).
    std::shared_ptr<HandOffStreak> streak;
    std::string lost_detail;  // see lost_detail()
    // Loop thread: when work ended past the local deadline with a renewal
    // still unanswered (its answer may yet extend the deadline past it);
    // the release's answer judges it (Watchdog::ended_in_time).
    Clock::time_point work_ended_late{};
    // Options::observability.hold_warning (ops/hold_warning.hpp): made at grant when on.
    std::unique_ptr<HoldWarning> hold_warning;
    // Under the lease's striped lock: Lease::on_lost's watchers.
    std::vector<std::shared_ptr<LeaseWatcher>> watchers;
    // LockRequest::context, for the span events (set at grant when not
    // empty: a lease without one pays nothing for it).
    std::string context;
  };
  Rare& rare() {
    Rare* r = rare_.load(std::memory_order_acquire);
    if (r != nullptr) return *r;
    auto made = std::make_unique<Rare>();
    if (rare_.compare_exchange_strong(r, made.get(), std::memory_order_acq_rel)) return *made.release();
    return *r;  // another thread made it first
  }
  const Rare* rare_if() const noexcept { return rare_.load(std::memory_order_acquire); }
  HandOffStreak* streak() const noexcept {
    const Rare* r = rare_if();
    return r ? r->streak.get() : nullptr;
  }
  std::shared_ptr<std::promise<void>> take_start_renewal() noexcept {
    Rare* r = rare_.load(std::memory_order_acquire);
    return r ? std::exchange(r->start_renewal, nullptr) : nullptr;
  }
  // LockRequest::context ("" if none). Loop thread.
  std::string_view context() const noexcept {
    const Rare* r = rare_if();
    return r ? std::string_view(r->context) : std::string_view();
  }
  // Whether any renewal failed since the last confirmed one.
  bool renewal_failing() const noexcept {
    const Rare* r = rare_if();
    return r && !r->lost_detail.empty();
  }

  // Loop thread, once (later calls do nothing): the caller learns how the
  // lease ended. Held to the end: nothing (or RuntimeStopped for work that
  // never ran); lost: LeaseLost. A lost lease whose work is over completes
  // at once, while its release goes on (Watchdog::lose, release_ended); one
  // that ended held completes once its release is confirmed.
  void complete_call() noexcept;

  // Lease::on_lost: adds a watcher (any thread), and tells the watchers
  // the lease ended, lost with `reason` or held (loop thread; each is told
  // once, the first time).
  void watch(const std::shared_ptr<LeaseWatcher>& w);
  void end_watchers(std::optional<LostReason> reason) noexcept;

 private:
  bool claim(std::uint8_t to) noexcept {
    std::uint8_t queued = kQueued;
    return start_.compare_exchange_strong(queued, to, std::memory_order_acq_rel);
  }
  std::atomic<Rare*> rare_{nullptr};
};

#if defined(__GLIBCXX__) && defined(__x86_64__)
// With its shared_ptr's count, 256 bytes of the allocator's: what a million
// held leases cost each, with their timeouts, before the registry's slot
// (BENCHMARKS.md, million_bench). A member that grows it should say why.
static_assert(sizeof(LeaseRecord) == 232);
#endif

// The store's name for a lease's key (the record keeps the key once, as
// the caller wrote it).
inline StoreName store_name(const LockStore& store, const LeaseRecord& l) {
  StoreName name;
  store.encode(l.key(), name);
  return name;
}

// A lease's lock as a store takes it, for one request: the store's name
// for the key, the token's text and the ttl's text, derived from the
// record (which keeps the key once, as the caller wrote it). ref() views
// this object: it must outlive the call it is given to.
class LeaseLock {
 public:
  LeaseLock(const LockStore& store, const LeaseRecord& l)
      : name_(store_name(store, l)), token_(l.token.text()), ttl_ms_(l.ttl()), l_(l) {}
  LeaseLock(const LeaseLock&) = delete;
  LeaseLock& operator=(const LeaseLock&) = delete;
  LockRef ref() const noexcept { return LockRef{name_.view(), token_.view(), ttl_ms_.view(), l_.ttl(), l_.kind}; }
  std::string_view name() const noexcept { return name_.view(); }

 private:
  StoreName name_;
  OwnerToken token_;
  TtlText ttl_ms_;
  const LeaseRecord& l_;
};

// The leases of the locked calls running on this thread, innermost last:
// one entry per key held (a set's keys each have one, all showing the set's
// lease).
struct HeldOnThread {
  const void* runtime;  // the detail::RuntimeImpl that granted it
  const LeaseRecord* lease;  // the key's lease
  const Lease* shown;        // what this_lease() gives: the key's lease, or its set's
};
std::vector<HeldOnThread>& leases_on_this_thread() noexcept;

// Pushes a lease for the scope of the work on this thread.
class ThreadLeaseScope {
 public:
  ThreadLeaseScope(const void* runtime, const LeaseRecord* lease) {
    leases_on_this_thread().push_back({runtime, lease, lease});
  }
  ~ThreadLeaseScope() { leases_on_this_thread().pop_back(); }
  ThreadLeaseScope(const ThreadLeaseScope&) = delete;
  ThreadLeaseScope& operator=(const ThreadLeaseScope&) = delete;
};

}  // namespace lockwatch::detail
