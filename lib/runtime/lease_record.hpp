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
#include <vector>

#include "core/token.hpp"
#include "lockwatch/lease.hpp"
#include "lockwatch/runtime.hpp"
#include "lockwatch/thread_pool.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class Watchdog;

// A ttl in milliseconds as decimal text, kept inline (a positive int64 has
// at most 19 digits).
class TtlText {
 public:
  TtlText() = default;
  explicit TtlText(std::chrono::milliseconds ttl) noexcept {
    auto r = std::to_chars(text_.data(), text_.data() + text_.size(), ttl.count());
    size_ = static_cast<std::uint8_t>(r.ptr - text_.data());
  }
  std::string_view view() const noexcept { return {text_.data(), size_}; }

 private:
  std::array<char, 19> text_{};
  std::uint8_t size_ = 0;
};

// Runs `task` off the calling thread for a completion handler: on the
// runtime's notifier thread, or, once the runtime is gone (or stopped
// taking tasks), on a thread of its own. Any thread.
void post_completion(const std::weak_ptr<ThreadPool>& notifier, UniqueFunction task) noexcept;

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
    released_ = std::make_unique<std::promise<void>>();
    auto future = released_->get_future();
    if (outcome_.exchange(kAwaited, std::memory_order_acq_rel) == kFinished) settle();
    return future;
  }
  // The handle's thread, once: `handler` is called with the outcome, off
  // this thread (post_completion).
  void released(std::function<void(std::exception_ptr)> handler) {
    on_released_ = std::make_unique<std::function<void(std::exception_ptr)>>(std::move(handler));
    if (outcome_.exchange(kAwaited, std::memory_order_acq_rel) == kFinished) settle();
  }
  std::weak_ptr<Runtime::Impl> runtime;  // set at grant; the lease never keeps it alive
  std::weak_ptr<ThreadPool> notifier;    // set at grant: the runtime's, for handlers
  // Any thread: the handle has not been released (nor the lease ended).
  bool handle_open() const noexcept { return outcome_.load(std::memory_order_acquire) == kOpen; }

 private:
  // Whichever of finish() and released() comes second settles the promise.
  enum : std::uint8_t { kOpen, kAwaited, kFinished };
  void settle() noexcept {
    if (on_released_) {
      post_completion(notifier, [h = std::move(on_released_), e = error_] { (*h)(e); });
      return;
    }
    try {
      if (error_)
        released_->set_exception(error_);
      else
        released_->set_value();
    } catch (...) {
    }
  }
  std::exception_ptr error_;                      // written before finish() publishes
  std::unique_ptr<std::promise<void>> released_;  // written before released() publishes
  std::unique_ptr<std::function<void(std::exception_ptr)>> on_released_;  // or this
  std::atomic<std::uint8_t> outcome_{kOpen};      // last: the record packs its flags behind it
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

// The store's name for a key, inline when short (most are), so a lease
// needs no heap block for it. 40 bytes: a longer name keeps a pointer to
// its own block in the first bytes of the inline space.
class StoreName {
 public:
  StoreName() noexcept = default;
  StoreName(const StoreName&) = delete;
  StoreName& operator=(const StoreName&) = delete;
  ~StoreName() { delete[] heap(); }
  StoreName& operator=(std::string_view s) {
    char* block = s.size() > kInline ? new char[s.size()] : nullptr;
    delete[] heap();
    size_ = static_cast<std::uint32_t>(s.size());
    if (block) std::memcpy(bytes_, &block, sizeof block);
    std::memcpy(block ? block : bytes_, s.data(), s.size());
    return *this;
  }
  std::string_view view() const noexcept {
    char* h = heap();
    return {h ? h : bytes_, size_};
  }

 private:
  static constexpr std::size_t kInline = 36;
  char* heap() const noexcept {
    if (size_ <= kInline) return nullptr;
    char* h;
    std::memcpy(&h, bytes_, sizeof h);
    return h;
  }
  char bytes_[kInline] = {};
  std::uint32_t size_ = 0;
};
static_assert(sizeof(StoreName) == 40);

struct LeaseRecord;

// The leases that held one store key in a row within this runtime, by
// local hand-off: the current holder (a renewal reply sent for an earlier
// one is its), when the runtime took the key from the store, and the
// fencing tokens reserved for the next holders (Options::local_handoff).
struct HandOffStreak {
  std::weak_ptr<LeaseRecord> holder;
  std::chrono::steady_clock::time_point started;
  // Local hand-offs so far in this streak.
  std::uint32_t handoffs = 0;
  // Fencing tokens the store reserved for this streak (TokenBlocks), not
  // handed out yet: next .. last, then the block after it (none: next >
  // last). They are good only while the store's key stays ours without a
  // break: the streak's end drops them.
  std::uint64_t next = 1, last = 0;
  std::uint64_t after_next = 1, after_last = 0;
  bool reserving = false;  // a reservation is on its way
  bool refused = false;    // one failed or found the key not ours: no more hand-offs
  // The lease whose work ended while no token was in stock: it keeps the
  // key (renewed) until the reservation's answer hands it on or releases it.
  std::shared_ptr<LeaseRecord> deferred;

  std::uint64_t in_stock() const noexcept {
    return (last >= next ? last - next + 1 : 0) + (after_last >= after_next ? after_last - after_next + 1 : 0);
  }
  // The next token (0: none in stock).
  std::uint64_t take() noexcept {
    if (next > last) {
      next = std::exchange(after_next, 1);
      last = std::exchange(after_last, 0);
    }
    return next <= last ? next++ : 0;
  }
  // A reserved block, first .. last.
  void add(std::uint64_t first, std::uint64_t to) noexcept {
    if (next > last) {
      next = first;
      last = to;
    } else {
      after_next = first;
      after_last = to;
    }
  }
};

struct LeaseRecord final : Lease, TimerTask, HandleState {
  // What the lease's one wheel timeout means when it fires.
  enum class Phase : std::uint8_t {
    kRenewDue,       // time to renew
    kAwaitingReply,  // a renewal is in flight; the timeout is the local deadline
    kRetryDue,       // a renewal failed transiently; try again
    kExhausted,      // no renewals left; the timeout is the local deadline
    kReleasing,      // the work finished; release in flight or awaiting expiry
  };

  LeaseRecord(Watchdog* watchdog, std::string key, std::uint64_t fence, std::chrono::milliseconds ttl,
              Clock::time_point deadline)
      : Lease(std::move(key), fence, ttl, deadline), watchdog(watchdog) {}

  void run(Timeout timeout) noexcept override;

  Clock::time_point deadline() const noexcept {
    return Clock::time_point(Clock::duration(deadline_ns_.load(std::memory_order_relaxed)));
  }
  using Lease::mark_lost;
  using Lease::set_deadline;
  using Lease::request_stop;
  void bump_renewals() noexcept { renewals_.fetch_add(1, std::memory_order_relaxed); }
  LockRef ref() const noexcept { return LockRef{name.view(), token.view(), ttl_ms.view(), ttl(), kind}; }
  // Why renewals failed or the lease was lost ("" if nothing went wrong).
  std::string lost_detail() const { return lost_detail_ ? *lost_detail_ : std::string(); }
  void set_lost_detail(std::string why) {
    if (why.empty())
      lost_detail_.reset();
    else
      lost_detail_ = std::make_unique<std::string>(std::move(why));
  }

  // Held through a LockHandle, not by running work.
  bool is_handle() const noexcept { return call == nullptr; }

  // Work queued for a pool worker: the worker starts it (begin_work) unless
  // the watchdog gave up on it first (give_up_start), never both. Until it
  // starts, renewals do not spend the lease's `retries`.
  void queue_for_worker() noexcept { start_.store(kQueued, std::memory_order_relaxed); }
  bool begin_work() noexcept { return claim(kStarted); }
  bool give_up_start() noexcept { return claim(kAbandoned); }
  bool started() const noexcept { return start_.load(std::memory_order_acquire) == kStarted; }

  // Loop thread (packed behind the handle state's last byte).
  Phase phase = Phase::kRenewDue;
  bool work_finished = false;
  bool releasing = false;  // release in flight: renewals go on until it is confirmed
  // The work is over and the key waits for reserved tokens to be handed on
  // (HandOffStreak::deferred): renewals go on meanwhile.
  bool awaiting_tokens = false;
  bool no_handoff = false;  // LockSpec::handoff was false
  // Released because a local hand-off streak reached its bound while
  // others waited here: those wait for the store's release notice too.
  bool yield_on_release = false;
  bool renewal_counts = false;  // the renewal in flight spends one of `retries`
  std::int32_t retries = 0;  // set at grant; < 0: forever (more than 2^31 renewals count as forever)
  std::int32_t spent = 0;    // renewals confirmed that counted against `retries`
  // Set once at grant, then read-only.
  Watchdog* const watchdog;  // outlives every lease (both belong to the runtime)
  std::shared_ptr<Call> call;  // the work; none for a handle
  StoreName name;      // the store's name for the key
  OwnerToken token;    // the owner token
  TtlText ttl_ms;      // the ttl as the store takes it, formatted once
  LockKind kind;       // how it is held (renewed and released as such)
  // Loop thread.
  static constexpr std::uint32_t kNoSlot = ~std::uint32_t{0};
  std::uint32_t slot = kNoSlot;    // its place in the watchdog's registry
  Clock::duration renew_after{};   // from a renewal's send to the next one (a tick early)
  Clock::time_point granted_at;  // for the hold time
  Timeout timeout;
  Clock::time_point last_sent;  // the latest request that may have extended the key
  // What few leases use, kept off the record (a million held leases pay a
  // pointer each for it): made on first use, loop thread.
  struct Rare {
    std::shared_ptr<std::promise<void>> finished;  // a nested call's thread waits on it
    // A worker that starts the work late waits on it for the renewal made
    // at the start (Watchdog::renew_at_start) to be answered.
    std::shared_ptr<std::promise<void>> start_renewal;
    // Local hand-offs (Options::local_handoff): shared by the leases of one
    // streak, made at its first token reservation or hand-off (none: the
    // lease took the key from the store while nobody here waited for it).
    std::shared_ptr<HandOffStreak> streak;
  };
  Rare& rare() {
    if (!rare_) rare_ = std::make_unique<Rare>();
    return *rare_;
  }
  const Rare* rare_if() const noexcept { return rare_.get(); }
  HandOffStreak* streak() const noexcept { return rare_ ? rare_->streak.get() : nullptr; }
  std::shared_ptr<std::promise<void>> take_start_renewal() noexcept {
    return rare_ ? std::exchange(rare_->start_renewal, nullptr) : nullptr;
  }
  // Whether any renewal failed since the last confirmed one.
  bool renewal_failing() const noexcept { return lost_detail_ != nullptr; }

  // Lease::on_lost: adds a watcher (any thread), and tells the watchers
  // the lease ended, lost with `reason` or held (loop thread; each is told
  // once, the first time).
  void watch(const std::shared_ptr<LeaseWatcher>& w);
  void end_watchers(std::optional<LostReason> reason) noexcept;

 private:
  enum : std::uint8_t { kStarted, kQueued, kAbandoned };
  bool claim(std::uint8_t to) noexcept {
    std::uint8_t queued = kQueued;
    return start_.compare_exchange_strong(queued, to, std::memory_order_acq_rel);
  }
  std::unique_ptr<Rare> rare_;
  std::unique_ptr<std::string> lost_detail_;  // rare: kept off the record
  // Lease::on_lost's watchers (rare: made on the first), and whether the
  // lease ended (no watcher waits then); both under the lease's striped lock.
  std::unique_ptr<std::vector<std::shared_ptr<LeaseWatcher>>> watchers_;
  bool watch_ended_ = false;
  std::atomic<std::uint8_t> start_{kStarted};
};

// The leases of the locked calls running on this thread, innermost last.
struct HeldOnThread {
  const void* runtime;  // the Runtime::Impl that granted it
  const LeaseRecord* lease;
};
std::vector<HeldOnThread>& leases_on_this_thread() noexcept;

// Pushes a lease for the scope of the work on this thread.
class ThreadLeaseScope {
 public:
  ThreadLeaseScope(const void* runtime, const LeaseRecord* lease) { leases_on_this_thread().push_back({runtime, lease}); }
  ~ThreadLeaseScope() { leases_on_this_thread().pop_back(); }
  ThreadLeaseScope(const ThreadLeaseScope&) = delete;
  ThreadLeaseScope& operator=(const ThreadLeaseScope&) = delete;
};

}  // namespace lockwatch::detail
