/// @file
/// lockwatch/timer_wheel.hpp: a hashed timing wheel that runs a task once a
/// delay has passed, built for very many short-lived timeouts that are mostly
/// cancelled before they fire (lease renewals, request deadlines).
///
/// Three concepts: a TimerTask is the work, a Timeout is the handle that a
/// schedule returns (it can cancel and tell what happened), and the TimerWheel
/// keeps the pending timeouts and runs the ones that are due when its owner
/// calls advance().
///
/// How it works: time is cut into ticks, and ticks into epochs of `wheel_size`
/// ticks. A near ring of `wheel_size` buckets holds the current epoch, one
/// bucket per tick, visited when its tick passes. A far ring of as many buckets
/// holds later epochs, one bucket per epoch; when an epoch begins its bucket is
/// poured into the near ring. So, unlike a single ring with rounds (Netty), a
/// timeout many revolutions away is moved once instead of being revisited every
/// revolution; only beyond `wheel_size` epochs does the far ring count rounds.
/// Scheduling and cancelling are O(1) list operations; advancing costs the
/// occupied buckets passed (empty ones are skipped by a bitmap) plus at most
/// two visits per timeout.
///
/// Threading: one thread, the owner, calls advance(), next_expiry_in() and
/// stop() (the first advance() binds the owner unless bind_to_current_thread()
/// did). new_timeout() and Timeout::cancel() may be called from any thread,
/// including from inside a running task. On the owner they link and unlink
/// directly, without locks; other threads put new timeouts and cancellations on
/// a mutex-guarded batch that the next advance() takes in one swap, so a
/// timeout scheduled elsewhere can only fire from an advance() after its
/// new_timeout() returned. A Timeout may be used from any thread.
///
/// Time: deadlines are never early: a task runs at the first advance() whose
/// time is at or after its deadline, rounded up to the next tick boundary
/// (delays <= 0 run at the next advance()). So lateness is up to one tick plus
/// however late the owner calls advance(). Like libuv's uv_now(), the owner does
/// not read the clock when it schedules: delays given on the owner thread count
/// from the time of the last advance() (the wheel's construction before the
/// first), which keeps the fast path cheap and makes a task that re-arms itself
/// keep a steady period. Delays given on other threads count from the clock.
///
/// Costs: one schedule or cancel on the owner is a pop from or push to a free
/// list, a compare-and-swap and a few pointer writes (about 20 ns when the
/// timeout is in cache; a cancel of a cold one costs its cache misses); nodes
/// come from slabs that are reused, so steady-state scheduling does not
/// allocate (the std::function overload allocates the function). Other threads
/// pay a clock read and the batch mutex per call. A pending timeout takes 40
/// bytes of slab (none for a LinkedTimerTask's own, which it carries); an
/// empty wheel about 17 KB (two rings of 16-byte buckets at the default
/// size). Slabs are kept until the wheel is destroyed, so memory follows the
/// peak number of pending timeouts.
///
/// Tuning: `tick` bounds lateness and precision (and how often a busy loop
/// wakes). `wheel_size * tick` is one epoch (512 x 5 ms = 2.56 s by default):
/// timeouts due within the current epoch are visited once, later ones twice,
/// and the whole far ring spans `wheel_size` epochs (22 min by default), past
/// which timeouts are revisited once per such span. A wheel covering the usual
/// delay saves the second visit at 32 bytes per bucket. `max_pending` caps
/// memory when producers may outrun expiry.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

namespace lockwatch {

namespace detail {
struct TimerNode;
class TimerWheelCore;

// A doubly linked ring. Buckets and the due list are sentinels of this type,
// so unlinking an entry needs neither its list nor a branch for the head.
struct TimerLink {
  TimerLink* prev;  // null: on no list
  TimerLink* next;
};

// What every timeout on a list has: its links and its deadline, as
// nanoseconds since the wheel's start times two, plus one for a
// LinkedTimerTask's own entry (a TimerNode's otherwise).
struct TimerEntry : TimerLink {
  std::int64_t when;
};
}  // namespace detail

class Timeout;

/// Work run when a timeout expires, on the thread calling TimerWheel::advance().
/// Must not throw. The wheel never owns or destroys a TimerTask passed by
/// reference; it must stay alive until it ran or cancel() returned true.
class TimerTask {
 public:
  /// Runs the task; `timeout` is the handle it was scheduled with.
  virtual void run(Timeout timeout) noexcept = 0;

 protected:
  ~TimerTask() = default;
};

/// A TimerTask that carries its one timeout itself, for a task that is
/// scheduled again and again, one timeout at a time: 24 bytes in the task
/// instead of a Timeout handle (16) and a node of the wheel's (40). Its
/// timeout is scheduled, moved and cancelled with TimerWheel::schedule()
/// and TimerWheel::cancel(), on the owner thread only. run() is given an
/// empty Timeout. The task must not be destroyed while its timeout is
/// pending (TimerWheel::stop() ends it, as it cancels every timeout).
class LinkedTimerTask : public TimerTask, private detail::TimerEntry {
 public:
  /// Owner thread. Scheduled, and neither run nor cancelled (nor stopped).
  bool is_pending() const noexcept { return prev != nullptr; }

 protected:
  LinkedTimerTask() noexcept : detail::TimerEntry{{nullptr, nullptr}, 0} {}
  ~LinkedTimerTask() = default;
  LinkedTimerTask(const LinkedTimerTask&) = delete;
  LinkedTimerTask& operator=(const LinkedTimerTask&) = delete;

 private:
  friend class detail::TimerWheelCore;
};

/// A small copyable handle to one scheduled timeout (16 bytes: the node and the
/// generation it had when scheduled). Default-constructed it is empty. Once the
/// timeout finished, the wheel may reuse its node for another timeout; the
/// generation then no longer matches and every call on the old handle becomes
/// inert (cancel() false, every query false), so keeping handles is safe. A
/// handle must not be used after its wheel is destroyed.
class Timeout {
 public:
  Timeout() noexcept = default;

  /// Thread-safe. Returns true only for the one call that moved the timeout
  /// from pending to cancelled; the task will then never run. False when
  /// empty, already cancelled, expired (even while its task is running) or
  /// reused. Never blocks on the owner; on other threads it takes the wheel's
  /// batch mutex briefly.
  bool cancel() noexcept;

  /// Scheduled and neither run, cancelled nor reused.
  bool is_pending() const noexcept;
  /// Cancelled (by cancel() or by TimerWheel::stop()) and not reused yet.
  bool is_cancelled() const noexcept;
  /// Its task was started and the node was not reused yet.
  bool is_expired() const noexcept;

  /// Refers to a timeout, which may have finished.
  explicit operator bool() const noexcept { return node_ != nullptr; }

 private:
  friend class detail::TimerWheelCore;
  Timeout(detail::TimerNode* node, std::uint64_t generation) noexcept
      : node_(node), generation_(generation) {}

  detail::TimerNode* node_ = nullptr;
  std::uint64_t generation_ = 0;
};

/// The wheel's sizing.
struct TimerWheelOptions {
  /// Resolution; at least 1 ms, else std::invalid_argument.
  std::chrono::nanoseconds tick = std::chrono::milliseconds(5);
  /// Buckets, rounded up to a power of two; 0 or more than 2^20 is
  /// std::invalid_argument.
  std::size_t wheel_size = 512;
  /// 0 = unlimited; when this many are pending new_timeout throws
  /// std::length_error.
  std::size_t max_pending = 0;
};

/// A Netty-style hashed wheel timer (see the header comment): O(1) new_timeout() and cancel() from
/// any thread; the owner thread advances it and runs what expired.
class TimerWheel {
 public:
  /// The clock of deadlines.
  using Clock = std::chrono::steady_clock;
  using NowFn = Clock::time_point (*)() noexcept;  ///< injectable for tests

  /// `now` nullptr means steady_clock::now. Throws std::invalid_argument for
  /// bad options. Does not bind an owner thread.
  explicit TimerWheel(TimerWheelOptions options = {}, NowFn now = nullptr);
  /// On the owner thread, or when no other thread uses the wheel any more.
  /// Tasks of pending timeouts are not run; functions the wheel owns are
  /// destroyed. Handles must not be used afterwards.
  ~TimerWheel();
  TimerWheel(const TimerWheel&) = delete;
  TimerWheel& operator=(const TimerWheel&) = delete;

  /// Any thread. Runs task.run() once, on the owner, at the first advance()
  /// whose time is >= now + delay (never early), where "now" is the last
  /// advance() on the owner thread and the clock elsewhere (see the header
  /// comment). delay <= 0 means "at the next advance()". The task must outlive
  /// the timeout (until it ran or cancel() returned true). Throws
  /// std::logic_error after stop(), std::length_error at max_pending,
  /// std::bad_alloc when a new slab cannot be had.
  Timeout new_timeout(TimerTask& task, std::chrono::nanoseconds delay);
  /// As above with an absolute deadline; a past deadline runs at the next
  /// advance().
  Timeout new_timeout_at(TimerTask& task, Clock::time_point deadline);
  /// Convenience that allocates: the wheel owns `fn` and destroys it, on the
  /// owner thread, after it ran, once the cancellation was processed, or at
  /// stop(). An empty `fn` is std::invalid_argument.
  Timeout new_timeout(std::function<void(Timeout)> fn, std::chrono::nanoseconds delay);

  /// Owner thread only (else std::logic_error). Schedules `task`'s own
  /// timeout at `deadline`, as new_timeout_at() would (a past deadline runs
  /// at the next advance()); a pending one is moved there. Throws as
  /// new_timeout_at() does (std::logic_error after stop(),
  /// std::length_error at max_pending), never std::bad_alloc.
  void schedule(LinkedTimerTask& task, Clock::time_point deadline);
  /// Owner thread only. Cancels `task`'s pending timeout: true if it was
  /// pending (its task will then not run), false otherwise.
  bool cancel(LinkedTimerTask& task) noexcept;

  /// Makes the calling thread the owner (the one that calls advance()). Until
  /// called, the first advance() binds the owner. Rebinding is allowed when the
  /// old owner has stopped using the wheel and the hand-over is synchronised
  /// (for example by starting the new thread).
  void bind_to_current_thread() noexcept;

  /// Owner thread only. Moves the wheel to `now` (default: the clock; a time
  /// before the last advance() counts as the last advance()) and runs every
  /// task whose deadline passed. Order among the tasks of one advance is not
  /// by deadline. Tasks may call new_timeout() and cancel() on this wheel, so a
  /// task that re-arms itself works; what they schedule with delay <= 0 runs at
  /// the next advance(), not this one. Returns how many tasks ran; 0 after
  /// stop().
  std::size_t advance();
  /// As advance(), at `now` instead of the clock (for tests and loops that read the clock once).
  std::size_t advance(Clock::time_point now);

  /// Owner thread. How long until the next tick that holds work, from the
  /// clock (zero if that is already past); nullopt when nothing is pending, so
  /// a loop can sleep instead of ticking while idle. A lower bound: it may be
  /// earlier than the real next expiry (a bucket may hold only timeouts of a
  /// later revolution), never later. A loop that sleeps on it must be woken
  /// when another thread schedules something earlier.
  std::optional<std::chrono::nanoseconds> next_expiry_in() const;

  /// Any thread. The tick on which a timeout with this deadline expires: the
  /// first tick at or after it (one already passed expires on the next
  /// advance). A loop that sleeps until a deadline should sleep until this.
  Clock::time_point tick_time(Clock::time_point deadline) const noexcept;

  /// Any thread. Scheduled and not yet run or cancelled; approximate while
  /// other threads schedule or cancel.
  std::size_t pending() const noexcept;

  /// The wheel's resolution.
  std::chrono::nanoseconds tick() const noexcept;

  /// Owner thread. Refuses further new_timeout() (they throw std::logic_error),
  /// cancels every pending timeout without running it (their handles report
  /// is_cancelled(); functions the wheel owns are destroyed) and returns how
  /// many those were. Later calls return 0. May be called from a task.
  std::size_t stop();

 private:
  std::unique_ptr<detail::TimerWheelCore> core_;
};

}  // namespace lockwatch
