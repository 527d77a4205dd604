// The wheel keeps three kinds of state, each with one rule:
//  - owner-only: buckets, the due list, the free list, the cached time. Only
//    the owner thread reads or writes them, so the owner's fast paths take no
//    lock and touch no shared cache line except the node itself.
//  - the mailbox, guarded by mutex_: timeouts scheduled and cancellations made
//    on other threads, and the reserve of nodes those threads draw from. The
//    owner empties it once per advance() with one swap.
//  - each node's state word, an atomic that every thread may compare-and-swap.
//    It packs generation, wheel id and phase, so cancel() is one CAS that both
//    checks the handle is not stale and claims the timeout.
#include "lockwatch/timer_wheel.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <limits>
#include <mutex>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

namespace lockwatch {
namespace detail {

// One timeout of a TimerTask. 40 bytes: the links, the deadline, the state
// word and the task. Nodes live in slabs and are reused, never freed, before
// the wheel dies. When `prev` is null the node is on no list (mailbox, free
// list or running) and `next` chains those.
struct TimerNode : TimerEntry {
  // generation << 18 | wheel id << 2 | phase. Only the phase changes by CAS;
  // the owner bumps the generation when it hands the node out again.
  std::atomic<std::uint64_t> state;
  // TimerTask* with kOwnedFunction / kImmediate in the low bits (a TimerTask
  // has a vtable pointer, so it is at least 8-aligned).
  std::uintptr_t task;
};
static_assert(sizeof(TimerNode) == 40, "the memory budget counts on 40-byte nodes");
static_assert(sizeof(TimerEntry) == 24, "a LinkedTimerTask carries 24 bytes");

namespace {

constexpr std::uint64_t kPending = 0;
constexpr std::uint64_t kCancelled = 1;
constexpr std::uint64_t kExpired = 2;
constexpr std::uint64_t kPhaseMask = 3;
constexpr int kIdShift = 2;
constexpr int kIdBits = 16;
constexpr std::uint64_t kIdMask = ((std::uint64_t{1} << kIdBits) - 1) << kIdShift;
constexpr std::uint64_t kGenerationStep = std::uint64_t{1} << (kIdShift + kIdBits);

constexpr std::uintptr_t kOwnedFunction = 1;  // the wheel deletes the task
constexpr std::uintptr_t kImmediate = 2;      // delay <= 0: due at the next advance
constexpr std::uintptr_t kTaskFlags = kOwnedFunction | kImmediate;

// Deadlines saturate here (about 73 years), far from overflow in any sum.
constexpr std::int64_t kMaxDeadline = std::numeric_limits<std::int64_t>::max() / 4;
constexpr std::int64_t kMinDeadline = -kMaxDeadline;

// Slabs start small so an idle wheel stays small and grow to this size, where
// the allocator's per-block overhead is negligible (16 of 65536 bytes).
constexpr std::size_t kFirstSlabBytes = 4096 - 16;
constexpr std::size_t kMaxSlabBytes = 65536 - 16;

// Nodes kept ready for other threads; the owner tops the reserve up to at
// least what they took since the last advance().
constexpr std::size_t kReserveLow = 64;

constexpr std::size_t kMaxWheelSize = std::size_t{1} << 20;

__extension__ typedef unsigned __int128 Uint128;

// For the few functions on the owner's schedule and cancel paths, which the
// compiler would otherwise keep out of line.
#define LOCKWATCH_HOT [[gnu::always_inline]] inline

// Identifies the calling thread without a call: the thread pointer (glibc's
// pthread_self() returns the same), else the address of a thread_local.
std::uintptr_t current_thread() noexcept {
#if defined(__has_builtin) && (defined(__x86_64__) || defined(__aarch64__))
#if __has_builtin(__builtin_thread_pointer)
  return reinterpret_cast<std::uintptr_t>(__builtin_thread_pointer());
#define LOCKWATCH_HAVE_THREAD_POINTER 1
#endif
#endif
#ifndef LOCKWATCH_HAVE_THREAD_POINTER
  thread_local char anchor;
  return reinterpret_cast<std::uintptr_t>(&anchor);
#endif
}

// TimerEntry::when: the deadline (saturated, so doubling cannot overflow),
// and whether the entry is a LinkedTimerTask's own.
std::int64_t deadline_of(const TimerEntry* e) noexcept { return e->when >> 1; }
bool is_linked_task(const TimerEntry* e) noexcept { return (e->when & 1) != 0; }
void set_deadline(TimerEntry* e, std::int64_t deadline, bool linked_task) noexcept {
  e->when = deadline * 2 + (linked_task ? 1 : 0);
}

std::int64_t saturate(std::int64_t v) noexcept { return std::clamp(v, kMinDeadline, kMaxDeadline); }

std::int64_t add_saturated(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? kMaxDeadline : kMinDeadline;
  return saturate(r);
}

void list_init(TimerLink& l) noexcept { l.prev = l.next = &l; }
bool list_empty(const TimerLink& l) noexcept { return l.next == &l; }

void list_push_back(TimerLink& l, TimerLink* n) noexcept {
  n->prev = l.prev;
  n->next = &l;
  l.prev->next = n;
  l.prev = n;
}

void list_unlink(TimerLink* n) noexcept {
  n->prev->next = n->next;
  n->next->prev = n->prev;
}

// Moves every element of `from` to the empty `to`.
void list_splice(TimerLink& from, TimerLink& to) noexcept {
  if (list_empty(from)) {
    list_init(to);
    return;
  }
  to.next = from.next;
  to.prev = from.prev;
  to.next->prev = &to;
  to.prev->next = &to;
  list_init(from);
}

// Wheels by id, so that a handle of 16 bytes can find its wheel from the
// node's state word without a pointer in every node.
constinit std::atomic<TimerWheelCore*> g_wheels[std::size_t{1} << kIdBits] = {};
constinit std::mutex g_wheels_mutex;

// The task behind new_timeout(std::function): owned and deleted by the wheel.
class FunctionTask final : public TimerTask {
 public:
  explicit FunctionTask(std::function<void(Timeout)> fn) : fn_(std::move(fn)) {}
  void run(Timeout timeout) noexcept override { fn_(timeout); }

 private:
  std::function<void(Timeout)> fn_;
};

}  // namespace

class TimerWheelCore {
 public:
  TimerWheelCore(const TimerWheelOptions& options, TimerWheel::NowFn now);
  ~TimerWheelCore();
  TimerWheelCore(const TimerWheelCore&) = delete;
  TimerWheelCore& operator=(const TimerWheelCore&) = delete;

  static TimerWheelCore* of(std::uint64_t tag) noexcept {
    return g_wheels[(tag & kIdMask) >> kIdShift].load(std::memory_order_acquire);
  }

  Timeout schedule_after(std::uintptr_t task, std::chrono::nanoseconds delay);
  Timeout schedule_at(std::uintptr_t task, TimerWheel::Clock::time_point deadline);
  void cancelled(TimerNode* node) noexcept;
  void cancelled_elsewhere(TimerNode* node) noexcept;
  void schedule_linked(LinkedTimerTask& task, TimerWheel::Clock::time_point deadline);
  bool cancel_linked(LinkedTimerTask& task) noexcept;

  void bind() noexcept { owner_.store(current_thread(), std::memory_order_relaxed); }
  std::size_t advance(TimerWheel::Clock::time_point now);
  std::size_t advance_to_clock() { return advance(now_()); }
  std::optional<std::chrono::nanoseconds> next_expiry_in() const;
  TimerWheel::Clock::time_point tick_time(TimerWheel::Clock::time_point deadline) const noexcept {
    if (deadline <= start_) return start_;
    std::uint64_t ticks = ticks_ceil(static_cast<std::uint64_t>(rel_ns(deadline)));
    return start_ + std::chrono::nanoseconds(static_cast<std::int64_t>(ticks) * tick_ns_);
  }
  std::size_t pending() const noexcept;
  std::chrono::nanoseconds tick() const noexcept { return std::chrono::nanoseconds(tick_ns_); }
  std::size_t stop();

 private:
  bool on_owner() const noexcept { return owner_.load(std::memory_order_relaxed) == current_thread(); }
  void bind_if_unbound() noexcept {
    if (owner_.load(std::memory_order_relaxed) == 0) bind();
  }
  // Ceiling division by the tick without a hardware divide: the product with
  // the reciprocal is the quotient or one less, and one step corrects it.
  std::uint64_t ticks_ceil(std::uint64_t ns) const noexcept {
    auto q = static_cast<std::uint64_t>((static_cast<Uint128>(ns) * tick_reciprocal_) >> 64);
    std::uint64_t r = ns - q * static_cast<std::uint64_t>(tick_ns_);
    if (r >= static_cast<std::uint64_t>(tick_ns_)) {
      ++q;
      r -= static_cast<std::uint64_t>(tick_ns_);
    }
    return q + (r != 0 ? 1 : 0);
  }
  // Nanoseconds from the wheel's start to `t`, saturated (never overflows).
  std::int64_t rel_ns(TimerWheel::Clock::time_point t) const noexcept {
    std::int64_t rel;
    if (__builtin_sub_overflow(t.time_since_epoch().count(), start_.time_since_epoch().count(), &rel))
      return t > start_ ? kMaxDeadline : kMinDeadline;
    return saturate(rel);
  }
  std::int64_t clock_ns() const noexcept { return rel_ns(now_()); }
  void check_room() const {
    if (max_pending_ != 0 && pending() >= max_pending_) throw_full();
  }
  [[noreturn]] static void throw_full();
  Timeout schedule_on_owner(std::uintptr_t task, std::int64_t deadline, bool immediate);
  Timeout schedule_from_elsewhere(std::uintptr_t task, std::int64_t deadline, bool immediate);

  TimerNode* take_free_node();
  std::size_t add_slab_locked(TimerNode*& list);
  void link(TimerEntry* entry, bool immediate) noexcept;
  void unlink(TimerLink* entry) noexcept;
  void release(TimerNode* node) noexcept;
  void drain_mailbox();
  // Where expire() puts what it does not run.
  enum class Batch { kDue, kNear, kFar };
  std::size_t expire(TimerLink& batch, Batch kind, std::size_t bucket, std::int64_t horizon);
  // Puts back an entry of `batch` that is not due: where it came from, or,
  // from a far bucket, wherever link() places it now.
  void put_back(TimerEntry* entry, Batch kind, std::size_t bucket) noexcept;
  std::size_t walk(Batch kind, std::size_t first, std::size_t span, std::int64_t horizon);
  std::size_t next_occupied(std::size_t level, std::size_t from, std::size_t limit) const noexcept;
  void set_occupied(std::size_t b) noexcept { occupied_[b >> 6] |= std::uint64_t{1} << (b & 63); }
  void clear_occupied(std::size_t b) noexcept { occupied_[b >> 6] &= ~(std::uint64_t{1} << (b & 63)); }
  bool is_bucket(const TimerLink* l) const noexcept {
    auto off = reinterpret_cast<std::uintptr_t>(l) - reinterpret_cast<std::uintptr_t>(buckets_.data());
    return off < buckets_.size() * sizeof(TimerLink);
  }
  std::size_t stop_locked_out();

  // Configuration, fixed at construction.
  const std::int64_t tick_ns_;
  const std::size_t mask_;   // wheel size - 1
  const int shift_;          // log2(wheel size): ticks per far bucket
  const std::size_t max_pending_;
  const TimerWheel::NowFn now_;
  const TimerWheel::Clock::time_point start_;
  const std::uint64_t tick_reciprocal_;  // floor((2^64 - 1) / tick)
  std::uint64_t id_tag_ = 0;             // wheel id << kIdShift
  std::atomic<std::uintptr_t> owner_{0};

  // Owner-only. buckets_[0, size) is the near ring, one bucket per tick of the
  // current epoch (size ticks); buckets_[size, 2 size) the far ring, one bucket
  // per epoch, whose nodes move to the near ring when their epoch begins.
  std::vector<TimerLink> buckets_;
  std::vector<std::uint64_t> occupied_;  // one bit per bucket: non-empty
  TimerLink due_;                        // delay <= 0 and deadlines already passed
  TimerLink* active_ = nullptr;          // the batch expire() is walking, for stop()
  TimerNode* free_ = nullptr;
  std::size_t free_count_ = 0;
  std::int64_t now_ns_ = 0;              // time of the last advance()
  std::int64_t processed_tick_ = 0;      // every bucket up to this tick was walked
  std::int64_t processed_ns_ = 0;        // processed_tick_ * tick_ns_
  std::size_t next_slab_bytes_ = kFirstSlabBytes;
  bool in_advance_ = false;
  std::vector<TimerNode*> cancels_taken_;
  // Written by the owner only, read by pending() anywhere.
  std::atomic<std::size_t> linked_{0};

  bool stopped_ = false;

  // The mailbox, on its own cache lines: other threads write it all the time.
  alignas(64) mutable std::mutex mutex_;
  bool mailbox_closed_ = false;  // set by stop()
  std::atomic<bool> has_mail_{false};
  TimerNode* inbox_ = nullptr;
  std::int64_t inbox_min_deadline_ = kMaxDeadline;
  std::atomic<std::size_t> inbox_count_{0};
  std::vector<TimerNode*> cancels_;
  std::atomic<std::size_t> cancel_count_{0};
  TimerNode* reserve_ = nullptr;
  std::size_t reserve_count_ = 0;
  std::size_t taken_since_drain_ = 0;
  std::vector<void*> slabs_;
};

namespace {

// Checked before any member is computed from them.
const TimerWheelOptions& validated(const TimerWheelOptions& options) {
  if (options.tick < std::chrono::milliseconds(1)) {
    throw std::invalid_argument("TimerWheel: tick must be at least 1 ms");
  }
  if (options.wheel_size == 0 || options.wheel_size > kMaxWheelSize) {
    throw std::invalid_argument("TimerWheel: wheel_size must be in [1, 2^20]");
  }
  return options;
}

}  // namespace

TimerWheelCore::TimerWheelCore(const TimerWheelOptions& options, TimerWheel::NowFn now)
    : tick_ns_(validated(options).tick.count()),
      mask_(std::bit_ceil(options.wheel_size) - 1),
      shift_(std::countr_zero(mask_ + 1)),
      max_pending_(options.max_pending),
      now_(now != nullptr ? now : +[]() noexcept { return TimerWheel::Clock::now(); }),
      start_(now_()),
      tick_reciprocal_(UINT64_MAX / static_cast<std::uint64_t>(tick_ns_)) {
  buckets_.resize(2 * (mask_ + 1));
  for (TimerLink& b : buckets_) list_init(b);
  occupied_.assign((buckets_.size() + 63) / 64, 0);
  list_init(due_);
  {
    std::lock_guard lock(g_wheels_mutex);
    std::size_t id = 0;
    while (id < std::size(g_wheels) && g_wheels[id].load(std::memory_order_relaxed) != nullptr) ++id;
    if (id == std::size(g_wheels)) throw std::length_error("TimerWheel: too many wheels alive");
    id_tag_ = std::uint64_t{id} << kIdShift;
    g_wheels[id].store(this, std::memory_order_release);
  }
}

TimerWheelCore::~TimerWheelCore() {
  stop_locked_out();
  for (void* slab : slabs_) ::operator delete(slab);
  std::lock_guard lock(g_wheels_mutex);
  g_wheels[id_tag_ >> kIdShift].store(nullptr, std::memory_order_release);
}

void TimerWheelCore::throw_full() { throw std::length_error("TimerWheel: max_pending reached"); }

LOCKWATCH_HOT Timeout TimerWheelCore::schedule_after(std::uintptr_t task, std::chrono::nanoseconds delay) {
  const bool immediate = delay.count() <= 0;
  if (on_owner()) {
    // From the cached time, like uv_now(): no clock read on the fast path.
    const std::int64_t deadline = immediate ? now_ns_ : add_saturated(now_ns_, delay.count());
    return schedule_on_owner(task, deadline, immediate);
  }
  const std::int64_t now = clock_ns();
  return schedule_from_elsewhere(task, immediate ? now : add_saturated(now, delay.count()), immediate);
}

Timeout TimerWheelCore::schedule_at(std::uintptr_t task, TimerWheel::Clock::time_point deadline) {
  const std::int64_t rel = rel_ns(deadline);
  if (on_owner()) return schedule_on_owner(task, rel, false);
  return schedule_from_elsewhere(task, rel, false);
}

LOCKWATCH_HOT Timeout TimerWheelCore::schedule_on_owner(std::uintptr_t task, std::int64_t deadline, bool immediate) {
  if (stopped_) throw std::logic_error("TimerWheel: stopped");
  check_room();
  TimerNode* node = free_ != nullptr ? free_ : take_free_node();
  free_ = static_cast<TimerNode*>(node->next);
  const std::uint64_t tag = ((node->state.load(std::memory_order_relaxed) & ~kPhaseMask) + kGenerationStep);
  node->state.store(tag | kPending, std::memory_order_release);
  node->task = task;
  set_deadline(node, deadline, false);
  link(node, immediate);
  linked_.store(linked_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return Timeout(node, tag);
}

Timeout TimerWheelCore::schedule_from_elsewhere(std::uintptr_t task, std::int64_t deadline,
                                                bool immediate) {
  std::lock_guard lock(mutex_);
  if (mailbox_closed_) throw std::logic_error("TimerWheel: stopped");
  check_room();
  if (reserve_ == nullptr) reserve_count_ += add_slab_locked(reserve_);
  TimerNode* node = reserve_;
  reserve_ = static_cast<TimerNode*>(node->next);
  --reserve_count_;
  ++taken_since_drain_;
  const std::uint64_t tag = ((node->state.load(std::memory_order_relaxed) & ~kPhaseMask) + kGenerationStep);
  node->state.store(tag | kPending, std::memory_order_release);
  node->task = task | (immediate ? kImmediate : 0);
  set_deadline(node, deadline, false);
  node->prev = nullptr;  // not on a list yet: the owner must not unlink it
  node->next = inbox_;
  inbox_ = node;
  inbox_min_deadline_ = std::min(inbox_min_deadline_, deadline);
  inbox_count_.store(inbox_count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  has_mail_.store(true, std::memory_order_release);
  return Timeout(node, tag);
}

// Owner: the free list ran dry, so carve a new slab.
TimerNode* TimerWheelCore::take_free_node() {
  std::lock_guard lock(mutex_);
  add_slab_locked(free_);
  return free_;
}

std::size_t TimerWheelCore::add_slab_locked(TimerNode*& list) {
  slabs_.reserve(slabs_.size() + 1);  // so that push_back below cannot throw
  const std::size_t bytes = next_slab_bytes_;
  void* slab = ::operator new(bytes);
  slabs_.push_back(slab);
  next_slab_bytes_ = std::min(kMaxSlabBytes, (bytes + 16) * 2 - 16);
  const std::size_t n = bytes / sizeof(TimerNode);
  auto* nodes = static_cast<TimerNode*>(slab);
  for (std::size_t i = n; i-- > 0;) {
    TimerNode* node = ::new (static_cast<void*>(&nodes[i])) TimerNode;
    node->state.store(id_tag_ | kExpired, std::memory_order_relaxed);
    node->task = 0;
    node->when = 0;
    node->prev = nullptr;
    node->next = list;
    list = node;
  }
  return n;
}

LOCKWATCH_HOT void TimerWheelCore::link(TimerEntry* node, bool immediate) noexcept {
  const std::int64_t deadline = deadline_of(node);
  if (immediate || deadline <= processed_ns_) {
    list_push_back(due_, node);
    return;
  }
  // deadline > processed_ns_ >= 0.
  const std::uint64_t tick = ticks_ceil(static_cast<std::uint64_t>(deadline));
  const std::uint64_t epoch = tick >> shift_;
  // The near ring holds only the current epoch, so it never needs rounds; a
  // later epoch waits in the far ring (with rounds past size epochs) and is
  // moved once, instead of being revisited every revolution.
  const std::size_t b = epoch <= (static_cast<std::uint64_t>(processed_tick_) >> shift_)
                            ? (tick & mask_)
                            : (mask_ + 1) + (epoch & mask_);
  list_push_back(buckets_[b], node);
  set_occupied(b);
}

LOCKWATCH_HOT void TimerWheelCore::unlink(TimerLink* node) noexcept {
  TimerLink* prev = node->prev;
  list_unlink(node);
  node->prev = nullptr;
  // A bucket left empty must lose its bit, or next_expiry_in() would wake the
  // loop for nothing.
  if (prev == prev->next && is_bucket(prev)) clear_occupied(static_cast<std::size_t>(prev - buckets_.data()));
}

LOCKWATCH_HOT void TimerWheelCore::release(TimerNode* node) noexcept {
  const std::uintptr_t task = node->task;
  node->task = 0;
  if ((task & kOwnedFunction) != 0) {
    delete static_cast<FunctionTask*>(reinterpret_cast<TimerTask*>(task & ~kTaskFlags));
  }
  // Off every list already (unlink() or expiry cleared prev).
  node->next = free_;
  free_ = node;
}

LOCKWATCH_HOT void TimerWheelCore::cancelled(TimerNode* node) noexcept {
  if (on_owner() && node->prev != nullptr) {
    unlink(node);
    linked_.store(linked_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    release(node);
    return;
  }
  cancelled_elsewhere(node);
}

// Another thread, or a node still in the mailbox: the owner unlinks it at its
// next advance().
void TimerWheelCore::cancelled_elsewhere(TimerNode* node) noexcept {
  std::lock_guard lock(mutex_);
  if (mailbox_closed_) return;  // stop() already took care of every node
  // The two vectors swap at each drain and keep their capacity, so this only
  // allocates while the cancellation rate grows (and terminates if that fails).
  cancels_.push_back(node);
  cancel_count_.store(cancel_count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  has_mail_.store(true, std::memory_order_release);
}

void TimerWheelCore::drain_mailbox() {
  if (!has_mail_.load(std::memory_order_acquire)) return;
  TimerNode* inbox;
  {
    std::lock_guard lock(mutex_);
    inbox = std::exchange(inbox_, nullptr);
    inbox_min_deadline_ = kMaxDeadline;
    inbox_count_.store(0, std::memory_order_relaxed);
    cancels_taken_.swap(cancels_);
    cancel_count_.store(0, std::memory_order_relaxed);
    has_mail_.store(false, std::memory_order_relaxed);
    // Give back as many nodes as other threads took, so that in steady state
    // they recycle ours instead of growing new slabs.
    std::size_t want = std::max(kReserveLow, taken_since_drain_);
    taken_since_drain_ = 0;
    while (reserve_count_ < want && free_ != nullptr) {
      TimerNode* node = free_;
      free_ = static_cast<TimerNode*>(node->next);
      node->next = reserve_;
      reserve_ = node;
      ++reserve_count_;
    }
  }
  std::size_t added = 0;
  while (inbox != nullptr) {
    TimerNode* node = inbox;
    inbox = static_cast<TimerNode*>(node->next);
    const bool immediate = (node->task & kImmediate) != 0;
    node->task &= ~kImmediate;
    link(node, immediate);
    ++added;
  }
  std::size_t removed = 0;
  // Every cancelled node was linked by now: its mailbox entry, if any, was
  // posted before its handle existed, so before the cancellation.
  for (TimerNode* node : cancels_taken_) {
    assert(node->prev != nullptr);
    unlink(node);
    release(node);
    ++removed;
  }
  cancels_taken_.clear();
  linked_.store(linked_.load(std::memory_order_relaxed) + added - removed, std::memory_order_relaxed);
}

// Runs the nodes of `batch` that are due by `horizon`. The others go back to
// where they came from (the due list, or a near bucket: nodes of a later tick
// of this epoch) or, from a far bucket, to wherever link() places them now;
// nodes cancelled elsewhere and waiting for the mailbox go back to their
// bucket. The batch is a private list so that tasks may schedule and cancel,
// even nodes of this batch, while it is walked.
std::size_t TimerWheelCore::expire(TimerLink& batch, Batch kind, std::size_t bucket,
                                   std::int64_t horizon) {
  std::size_t ran = 0;
  active_ = &batch;
  while (!list_empty(batch) && !stopped_) {
    auto* entry = static_cast<TimerEntry*>(batch.next);
    // Lists are walked in the order nodes were added, not in memory order:
    // start fetching the next one while this one is handled.
    __builtin_prefetch(entry->next);
    list_unlink(entry);
    if (is_linked_task(entry)) {
      // Pending while on a list: only the owner cancels it, by unlinking.
      if (deadline_of(entry) > horizon) {
        put_back(entry, kind, bucket);
        continue;
      }
      entry->prev = nullptr;
      linked_.store(linked_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
      static_cast<LinkedTimerTask*>(entry)->run(Timeout());
      ++ran;
      continue;
    }
    auto* node = static_cast<TimerNode*>(entry);
    std::uint64_t state = node->state.load(std::memory_order_acquire);
    if ((state & kPhaseMask) != kPending || deadline_of(node) > horizon ||
        !node->state.compare_exchange_strong(state, (state & ~kPhaseMask) | kExpired,
                                             std::memory_order_acq_rel, std::memory_order_acquire)) {
      // A node cancelled elsewhere waits for the mailbox in its bucket.
      if ((state & kPhaseMask) != kPending && kind == Batch::kFar) {
        list_push_back(buckets_[bucket], node);
        set_occupied(bucket);
      } else {
        put_back(node, kind, bucket);
      }
      continue;
    }
    node->prev = nullptr;
    linked_.store(linked_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    auto* task = reinterpret_cast<TimerTask*>(node->task & ~kTaskFlags);
    task->run(Timeout(node, state & ~kPhaseMask));
    release(node);
    ++ran;
  }
  active_ = nullptr;
  return ran;
}

LOCKWATCH_HOT void TimerWheelCore::put_back(TimerEntry* entry, Batch kind, std::size_t bucket) noexcept {
  if (kind == Batch::kFar) {
    link(entry, false);
    return;
  }
  list_push_back(kind == Batch::kDue ? due_ : buckets_[bucket], entry);
  if (kind != Batch::kDue) set_occupied(bucket);
}

// Expires the occupied buckets among `span` consecutive ones of a ring,
// starting at ring index `first`, each once.
std::size_t TimerWheelCore::walk(Batch kind, std::size_t first, std::size_t span,
                                 std::int64_t horizon) {
  const std::size_t level = kind == Batch::kFar ? mask_ + 1 : 0;
  std::size_t ran = 0;
  std::size_t k = next_occupied(level, first, span);
  while (k < span && !stopped_) {
    const std::size_t b = level + ((first + k) & mask_);
    TimerLink batch;
    list_splice(buckets_[b], batch);
    clear_occupied(b);
    ran += expire(batch, kind, b, horizon);
    // On from the next bucket: this one may be occupied again by nodes of a
    // later tick.
    k += 1 + next_occupied(level, first + k + 1, span - k - 1);
  }
  return ran;
}

// The first k in [0, limit) whose bucket at ring index (from + k) of the ring
// starting at `level` is occupied, else limit.
std::size_t TimerWheelCore::next_occupied(std::size_t level, std::size_t from,
                                          std::size_t limit) const noexcept {
  const std::size_t size = mask_ + 1;
  std::size_t k = 0;
  while (k < limit) {
    const std::size_t index = (from + k) & mask_;
    const std::size_t bit = (level + index) & 63;
    // A word may hold both rings (size < 64) or run past the ring's end.
    const std::size_t avail = std::min<std::size_t>(64 - bit, size - index);
    std::uint64_t word = occupied_[(level + index) >> 6] >> bit;
    if (avail < 64) word &= (std::uint64_t{1} << avail) - 1;
    if (word != 0) return std::min(limit, k + static_cast<std::size_t>(std::countr_zero(word)));
    k += avail;
  }
  return limit;
}

std::size_t TimerWheelCore::advance(TimerWheel::Clock::time_point now_tp) {
  bind_if_unbound();
  assert(on_owner() && "TimerWheel::advance() called off the owner thread");
  if (stopped_ || in_advance_) return 0;
  in_advance_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{in_advance_};

  now_ns_ = std::max(now_ns_, rel_ns(now_tp));
  // Mail is linked against the old processed tick, so what it holds that is
  // due now runs in this advance().
  drain_mailbox();

  // Tasks only see the new time: what they schedule for a tick walked here
  // goes to the due list and runs at the next advance(), never in a loop.
  const std::int64_t from = processed_tick_;
  const std::int64_t target = std::max(from, now_ns_ / tick_ns_);
  processed_tick_ = target;
  processed_ns_ = target * tick_ns_;

  std::size_t ran = 0;
  if (!list_empty(due_)) {
    TimerLink batch;
    list_splice(due_, batch);
    ran += expire(batch, Batch::kDue, 0, now_ns_);
  }
  if (target > from) {
    // Each bucket is walked at most once, with the final horizon: past a whole
    // revolution every near bucket is walked, and the near ring holds nothing
    // beyond the current epoch. Then the far buckets of the epochs entered
    // hand their nodes down (or run them, when already due).
    const std::size_t size = mask_ + 1;
    const auto near_span = static_cast<std::size_t>(std::min<std::int64_t>(target - from, size));
    ran += walk(Batch::kNear, static_cast<std::size_t>(from + 1) & mask_, near_span, processed_ns_);
    const std::int64_t epochs = (target >> shift_) - (from >> shift_);
    if (epochs > 0) {
      const auto far_span = static_cast<std::size_t>(std::min<std::int64_t>(epochs, size));
      ran += walk(Batch::kFar, static_cast<std::size_t>((from >> shift_) + 1) & mask_, far_span,
                  processed_ns_);
    }
  }
  return ran;
}

std::optional<std::chrono::nanoseconds> TimerWheelCore::next_expiry_in() const {
  if (stopped_) return std::nullopt;
  std::int64_t earliest = kMaxDeadline;
  bool any = false;
  if (!list_empty(due_)) {
    earliest = 0;
    any = true;
  }
  if (has_mail_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mutex_);
    if (inbox_ != nullptr) {
      earliest = std::min(earliest, inbox_min_deadline_);
      any = true;
    }
    if (!cancels_.empty()) any = true;  // not work, but a drain is due
  }
  const std::size_t size = mask_ + 1;
  // A near bucket holds a single tick; a far one an epoch that cannot start
  // before its first tick.
  const std::size_t k = next_occupied(0, static_cast<std::size_t>(processed_tick_ + 1) & mask_, size);
  if (k < size) {
    earliest = std::min(earliest, (processed_tick_ + 1 + static_cast<std::int64_t>(k)) * tick_ns_);
    any = true;
  }
  const std::int64_t epoch = processed_tick_ >> shift_;
  const std::size_t e = next_occupied(size, static_cast<std::size_t>(epoch + 1) & mask_, size);
  if (e < size) {
    earliest = std::min(earliest, ((epoch + 1 + static_cast<std::int64_t>(e)) << shift_) * tick_ns_);
    any = true;
  }
  if (!any) return std::nullopt;
  return std::chrono::nanoseconds(std::max<std::int64_t>(0, earliest - clock_ns()));
}

std::size_t TimerWheelCore::pending() const noexcept {
  const std::size_t in = linked_.load(std::memory_order_relaxed) + inbox_count_.load(std::memory_order_relaxed);
  const std::size_t out = cancel_count_.load(std::memory_order_relaxed);
  return in > out ? in - out : 0;
}

void TimerWheelCore::schedule_linked(LinkedTimerTask& task, TimerWheel::Clock::time_point deadline) {
  bind_if_unbound();
  if (!on_owner()) throw std::logic_error("TimerWheel: a LinkedTimerTask is scheduled on the owner thread only");
  if (stopped_) throw std::logic_error("TimerWheel: stopped");
  TimerEntry* entry = &task;
  if (entry->prev != nullptr) {
    unlink(entry);  // moved: it stays counted
  } else {
    check_room();
    linked_.store(linked_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  set_deadline(entry, rel_ns(deadline), true);
  link(entry, false);
}

bool TimerWheelCore::cancel_linked(LinkedTimerTask& task) noexcept {
  assert(on_owner() && "TimerWheel::cancel(LinkedTimerTask&) called off the owner thread");
  TimerEntry* entry = &task;
  if (entry->prev == nullptr) return false;
  unlink(entry);
  linked_.store(linked_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  return true;
}

std::size_t TimerWheelCore::stop() {
  bind_if_unbound();
  return stop_locked_out();
}

// Closes the mailbox, then cancels every node on a list. Nodes are left where
// they are: after this no handle can win a CAS, so no one unlinks them again.
std::size_t TimerWheelCore::stop_locked_out() {
  TimerNode* inbox;
  {
    std::lock_guard lock(mutex_);
    if (mailbox_closed_) return 0;
    mailbox_closed_ = true;
    stopped_ = true;
    inbox = std::exchange(inbox_, nullptr);
    inbox_count_.store(0, std::memory_order_relaxed);
    cancels_.clear();
    cancel_count_.store(0, std::memory_order_relaxed);
  }
  std::size_t never_ran = 0;
  auto finish = [&](TimerNode* node) {
    std::uint64_t state = node->state.load(std::memory_order_acquire);
    while ((state & kPhaseMask) == kPending) {
      if (node->state.compare_exchange_weak(state, (state & ~kPhaseMask) | kCancelled,
                                            std::memory_order_acq_rel, std::memory_order_acquire)) {
        ++never_ran;
        break;
      }
    }
    const std::uintptr_t task = std::exchange(node->task, 0);
    if ((task & kOwnedFunction) != 0) {
      delete static_cast<FunctionTask*>(reinterpret_cast<TimerTask*>(task & ~kTaskFlags));
    }
  };
  auto finish_list = [&](TimerLink& list) {
    for (TimerLink* l = list.next; l != &list; l = l->next) {
      auto* entry = static_cast<TimerEntry*>(l);
      if (is_linked_task(entry)) {
        entry->prev = nullptr;  // no longer pending; `next` still leads on
        ++never_ran;
      } else {
        finish(static_cast<TimerNode*>(entry));
      }
    }
  };
  for (TimerLink& b : buckets_) {
    finish_list(b);
    list_init(b);
  }
  std::fill(occupied_.begin(), occupied_.end(), 0);
  finish_list(due_);
  list_init(due_);
  if (active_ != nullptr) finish_list(*active_);
  for (TimerNode* node = inbox; node != nullptr; node = static_cast<TimerNode*>(node->next)) finish(node);
  linked_.store(0, std::memory_order_relaxed);
  return never_ran;
}

}  // namespace detail

// --- Timeout ---------------------------------------------------------------

bool Timeout::cancel() noexcept {
  if (node_ == nullptr) return false;
  std::uint64_t expected = generation_ | detail::kPending;
  if (!node_->state.compare_exchange_strong(expected, generation_ | detail::kCancelled,
                                            std::memory_order_acq_rel, std::memory_order_relaxed)) {
    return false;
  }
  detail::TimerWheelCore::of(generation_)->cancelled(node_);
  return true;
}

bool Timeout::is_pending() const noexcept {
  return node_ != nullptr &&
         node_->state.load(std::memory_order_acquire) == (generation_ | detail::kPending);
}

bool Timeout::is_cancelled() const noexcept {
  return node_ != nullptr &&
         node_->state.load(std::memory_order_acquire) == (generation_ | detail::kCancelled);
}

bool Timeout::is_expired() const noexcept {
  return node_ != nullptr &&
         node_->state.load(std::memory_order_acquire) == (generation_ | detail::kExpired);
}

// --- TimerWheel ------------------------------------------------------------

TimerWheel::TimerWheel(TimerWheelOptions options, NowFn now)
    : core_(std::make_unique<detail::TimerWheelCore>(options, now)) {}

TimerWheel::~TimerWheel() = default;

Timeout TimerWheel::new_timeout(TimerTask& task, std::chrono::nanoseconds delay) {
  return core_->schedule_after(reinterpret_cast<std::uintptr_t>(&task), delay);
}

Timeout TimerWheel::new_timeout_at(TimerTask& task, Clock::time_point deadline) {
  return core_->schedule_at(reinterpret_cast<std::uintptr_t>(&task), deadline);
}

Timeout TimerWheel::new_timeout(std::function<void(Timeout)> fn, std::chrono::nanoseconds delay) {
  if (!fn) throw std::invalid_argument("TimerWheel: empty function");
  auto task = std::make_unique<detail::FunctionTask>(std::move(fn));
  Timeout timeout = core_->schedule_after(
      reinterpret_cast<std::uintptr_t>(static_cast<TimerTask*>(task.get())) | detail::kOwnedFunction,
      delay);
  task.release();
  return timeout;
}

void TimerWheel::schedule(LinkedTimerTask& task, Clock::time_point deadline) { core_->schedule_linked(task, deadline); }
bool TimerWheel::cancel(LinkedTimerTask& task) noexcept { return core_->cancel_linked(task); }

void TimerWheel::bind_to_current_thread() noexcept { core_->bind(); }
std::size_t TimerWheel::advance() { return core_->advance_to_clock(); }
std::size_t TimerWheel::advance(Clock::time_point now) { return core_->advance(now); }
std::optional<std::chrono::nanoseconds> TimerWheel::next_expiry_in() const { return core_->next_expiry_in(); }
TimerWheel::Clock::time_point TimerWheel::tick_time(Clock::time_point deadline) const noexcept {
  return core_->tick_time(deadline);
}
std::size_t TimerWheel::pending() const noexcept { return core_->pending(); }
std::chrono::nanoseconds TimerWheel::tick() const noexcept { return core_->tick(); }
std::size_t TimerWheel::stop() { return core_->stop(); }

}  // namespace lockwatch
