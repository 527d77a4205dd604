// Benchmarks of lockwatch::TimerWheel against the structures a timer is
// usually built on, all in this one binary and run:
//   Wheel      lockwatch::TimerWheel, driven on its owner thread
//   LazyHeap   std::priority_queue, cancel leaves a tombstone (purged when
//              tombstones outnumber live entries)
//   IndexHeap  binary heap with a position index per timer, real removal
//   Uv         libuv's uv_timer_start / uv_timer_stop on a uv_loop_t
//   Multimap   std::multimap keyed by deadline, erase by iterator
//
// N = 1K, 100K, 1M pending timeouts, deadlines uniform over 30 s.
//   BM_*_ScheduleCancel/N    one pair: cancel a random pending timeout and
//                            schedule a new one in its place (N stays
//                            pending). Counter bytes_per_timeout: what the
//                            structure allocated for N pending, allocator
//                            headers included, divided by N.
//   BM_*_ScheduleCancelNewest/N  schedule one and cancel that one, with N
//                            pending: work that ends before its deadline.
//   BM_*_ScheduleCancelContended/N  the same from two producer threads while
//                            an owner thread advances every tick (the wheel,
//                            and an IndexHeap behind a mutex).
//   BM_*_Expire/N            cost per fired timeout (counter s_per_fire),
//                            time advanced to each next expiry as an idle
//                            loop would.
//   BM_*_Renew/N             the watchdog pattern: each expiry re-arms itself
//                            at 9/10 of its ttl (3..30 s), 15 s simulated.
//   BM_Wheel_EmptySize       bytes of a default wheel with nothing pending.
//   BM_Wheel_TickLateness    a loop sleeping to each 1 ms tick with producers
//                            running: how late ticks and timeouts run, next to
//                            how late clock_nanosleep itself wakes.
//
// libuv reads its own clock in uv_run(), so its Expire and Renew runs start
// the timers with the loop time moved back by the window and fire them in one
// uv_run(); the renewing callback re-arms from its own due time by moving
// loop->time for the duration of uv_timer_start(). libuv 1.44 compares each
// timer with loop->time as it goes, so that simulates the window.
#include "lockwatch/timer_wheel.hpp"

#include <benchmark/benchmark.h>
#include <malloc.h>
#include <time.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <queue>
#include <random>
#include <thread>
#include <vector>

// --- allocation accounting -------------------------------------------------
// Every operator new/delete is counted while g_counting is set, with glibc's
// real block size (usable size plus its 8-byte header), so that the figures
// include the allocator's rounding and overhead.

namespace {

std::atomic<bool> g_counting{false};
std::atomic<std::int64_t> g_live_bytes{0};

std::int64_t block_bytes(void* p) noexcept {
  return static_cast<std::int64_t>(malloc_usable_size(p) + sizeof(std::size_t));
}

void* counted_alloc(std::size_t n) {
  void* p = std::malloc(n != 0 ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  if (g_counting.load(std::memory_order_relaxed)) {
    g_live_bytes.fetch_add(block_bytes(p), std::memory_order_relaxed);
  }
  return p;
}

void* counted_aligned_alloc(std::size_t n, std::align_val_t align) {
  const auto a = static_cast<std::size_t>(align);
  void* p = std::aligned_alloc(a, (std::max<std::size_t>(n, 1) + a - 1) / a * a);
  if (p == nullptr) throw std::bad_alloc();
  if (g_counting.load(std::memory_order_relaxed)) {
    g_live_bytes.fetch_add(block_bytes(p), std::memory_order_relaxed);
  }
  return p;
}

void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  if (g_counting.load(std::memory_order_relaxed)) {
    g_live_bytes.fetch_sub(block_bytes(p), std::memory_order_relaxed);
  }
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_aligned_alloc(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_aligned_alloc(n, a); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }

namespace {

using namespace std::chrono_literals;
using lockwatch::Timeout;
using lockwatch::TimerTask;
using lockwatch::TimerWheel;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kSpreadNs = 30'000'000'000;  // deadlines over 30 s
constexpr std::int64_t kWindowNs = 15'000'000'000;  // simulated time of Renew
constexpr std::size_t kTable = std::size_t{1} << 16;

// Random inputs drawn once, so that every structure sees the same sequence
// and the loops do not pay for a generator.
struct Tables {
  std::vector<std::uint32_t> victims;  // scaled to [0, N) by pick()
  std::vector<std::int64_t> delays;    // [0, kSpreadNs)
  std::vector<std::int64_t> ttls;      // [3 s, 30 s]
  std::vector<std::uint32_t> phases;   // initial fraction of 0.9 ttl, / 2^32
};

const Tables& tables() {
  static const Tables t = [] {
    Tables r;
    std::mt19937_64 rng(20240611);
    for (std::size_t i = 0; i < kTable; ++i) {
      r.victims.push_back(static_cast<std::uint32_t>(rng()));
      r.delays.push_back(static_cast<std::int64_t>(rng() % kSpreadNs));
      r.ttls.push_back(3'000'000'000 + static_cast<std::int64_t>(rng() % 27'000'000'001));
      r.phases.push_back(static_cast<std::uint32_t>(rng()));
    }
    return r;
  }();
  return t;
}

std::uint32_t pick(std::uint32_t r, std::size_t n) {
  return static_cast<std::uint32_t>((std::uint64_t{r} * n) >> 32);
}
std::int64_t renew_delay(std::int64_t ttl) { return ttl * 9 / 10; }
std::int64_t first_delay(std::size_t i) {
  const auto& t = tables();
  // ttl < 2^35 ns, so the product fits in 64 bits.
  return static_cast<std::int64_t>((static_cast<std::uint64_t>(renew_delay(t.ttls[i % kTable])) >> 3) *
                                   t.phases[i % kTable] >> 29);
}

// The fake clock of the wheels driven in simulated time.
std::atomic<std::int64_t> g_fake_ns{1'000'000'000};
Clock::time_point fake_now() noexcept {
  return Clock::time_point(std::chrono::nanoseconds(g_fake_ns.load(std::memory_order_relaxed)));
}

// --- the structures ----------------------------------------------------------
// Each keeps slots 0..N-1 (the caller's handles) with schedule(slot, delay),
// cancel(slot), fire_all() and renew_for(window).

class WheelSet {
 public:
  WheelSet(std::size_t n, TimerWheel::NowFn now = nullptr) : handles_(n), renewers_(n) {
    for (std::size_t i = 0; i < n; ++i) {
      renewers_[i].set = this;
      renewers_[i].slot = i;
      renewers_[i].ttl = tables().ttls[i % kTable];
    }
    const bool counting = g_counting.exchange(true);
    const std::int64_t before = g_live_bytes.load();
    wheel_ = std::make_unique<TimerWheel>(lockwatch::TimerWheelOptions{}, now);
    wheel_->bind_to_current_thread();
    extra_bytes_ = g_live_bytes.load() - before;
    g_counting = counting;
  }
  ~WheelSet() {
    for (Timeout& h : handles_) h.cancel();
  }
  void schedule(std::uint32_t slot, std::int64_t delay) {
    handles_[slot] = wheel_->new_timeout(task_, std::chrono::nanoseconds(delay));
  }
  void cancel(std::uint32_t slot) { handles_[slot].cancel(); }
  std::size_t fire_all() {
    const std::uint64_t before = task_.fired;
    while (auto next = wheel_->next_expiry_in()) {
      g_fake_ns += std::max<std::int64_t>(next->count(), 1);
      wheel_->advance();
    }
    return static_cast<std::size_t>(task_.fired - before);
  }
  void arm_renewals() {
    for (std::size_t i = 0; i < handles_.size(); ++i) {
      handles_[i] = wheel_->new_timeout(renewers_[i], std::chrono::nanoseconds(first_delay(i)));
    }
  }
  std::size_t renew_for(std::int64_t window) {
    const std::int64_t end = g_fake_ns.load() + window;
    std::size_t fired = 0;
    while (auto next = wheel_->next_expiry_in()) {
      const std::int64_t at = g_fake_ns.load() + std::max<std::int64_t>(next->count(), 1);
      if (at > end) break;
      g_fake_ns = at;
      fired += wheel_->advance();
    }
    return fired;
  }
  void cancel_all() {
    for (Timeout& h : handles_) h.cancel();
  }
  // The empty wheel, counted apart from the caller's handles.
  std::int64_t extra_bytes() const { return extra_bytes_; }

 private:
  struct Count final : TimerTask {
    void run(Timeout) noexcept override { ++fired; }
    std::uint64_t fired = 0;
  };
  struct Renewer final : TimerTask {
    void run(Timeout) noexcept override {
      set->handles_[slot] = set->wheel_->new_timeout(*this, std::chrono::nanoseconds(renew_delay(ttl)));
    }
    WheelSet* set = nullptr;
    std::size_t slot = 0;
    std::int64_t ttl = 0;
  };
  std::vector<Timeout> handles_;
  std::vector<Renewer> renewers_;
  Count task_;
  std::unique_ptr<TimerWheel> wheel_;
  std::int64_t extra_bytes_ = 0;
};

class LazyHeapSet {
 public:
  std::int64_t extra_bytes() const { return 0; }
  explicit LazyHeapSet(std::size_t n) : gen_(n, 0), ttl_(n) {
    for (std::size_t i = 0; i < n; ++i) ttl_[i] = tables().ttls[i % kTable];
  }
  void schedule(std::uint32_t slot, std::int64_t delay) {
    const std::uint32_t gen = ++gen_[slot] | 1;  // odd: armed
    gen_[slot] = gen;
    heap_.push({now_ + delay, slot, gen});
    ++live_;
  }
  void cancel(std::uint32_t slot) {
    if ((gen_[slot] & 1) == 0) return;
    ++gen_[slot];
    --live_;
    if (heap_.size() > 2 * live_ + 1024) purge();
  }
  std::size_t fire_all() {
    std::size_t fired = 0;
    while (!heap_.empty()) fired += pop_one();
    return fired;
  }
  void arm_renewals() {
    for (std::uint32_t i = 0; i < gen_.size(); ++i) schedule(i, first_delay(i));
  }
  std::size_t renew_for(std::int64_t window) {
    const std::int64_t end = now_ + window;
    std::size_t fired = 0;
    while (!heap_.empty() && heap_.top().deadline <= end) {
      const Entry e = heap_.top();
      heap_.pop();
      if (e.gen != gen_[e.slot]) continue;
      now_ = e.deadline;
      ++fired;
      ++gen_[e.slot];
      --live_;
      schedule(e.slot, renew_delay(ttl_[e.slot]));
    }
    now_ = end;
    return fired;
  }
  void cancel_all() {
    for (std::uint32_t i = 0; i < gen_.size(); ++i) cancel(i);
    purge();
  }

 private:
  struct Entry {
    std::int64_t deadline;
    std::uint32_t slot;
    std::uint32_t gen;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const { return a.deadline > b.deadline; }
  };
  // The protected container is reachable from a derived class: needed to purge.
  struct Queue : std::priority_queue<Entry, std::vector<Entry>, Later> {
    using priority_queue::c;
    using priority_queue::comp;
  };
  std::size_t pop_one() {
    const Entry e = heap_.top();
    heap_.pop();
    if (e.gen != gen_[e.slot]) return 0;
    now_ = std::max(now_, e.deadline);
    ++gen_[e.slot];
    --live_;
    return 1;
  }
  void purge() {
    std::erase_if(heap_.c, [this](const Entry& e) { return e.gen != gen_[e.slot]; });
    std::make_heap(heap_.c.begin(), heap_.c.end(), heap_.comp);
  }
  Queue heap_;
  std::vector<std::uint32_t> gen_;
  std::vector<std::int64_t> ttl_;
  std::size_t live_ = 0;
  std::int64_t now_ = 0;
};

class IndexHeapSet {
 public:
  std::int64_t extra_bytes() const { return 0; }
  explicit IndexHeapSet(std::size_t n) : pos_(n, kNone), ttl_(n) {
    for (std::size_t i = 0; i < n; ++i) ttl_[i] = tables().ttls[i % kTable];
  }
  void schedule(std::uint32_t slot, std::int64_t delay) {
    if (pos_[slot] != kNone) remove_at(pos_[slot]);
    heap_.push_back({now_ + delay, slot});
    pos_[slot] = static_cast<std::uint32_t>(heap_.size() - 1);
    sift_up(heap_.size() - 1);
  }
  void cancel(std::uint32_t slot) {
    if (pos_[slot] != kNone) remove_at(pos_[slot]);
  }
  std::size_t fire_all() {
    std::size_t fired = 0;
    while (!heap_.empty()) {
      now_ = std::max(now_, heap_[0].deadline);
      remove_at(0);
      ++fired;
    }
    return fired;
  }
  void arm_renewals() {
    for (std::uint32_t i = 0; i < pos_.size(); ++i) schedule(i, first_delay(i));
  }
  std::size_t renew_for(std::int64_t window) {
    const std::int64_t end = now_ + window;
    std::size_t fired = 0;
    while (!heap_.empty() && heap_[0].deadline <= end) {
      const Entry e = heap_[0];
      now_ = e.deadline;
      remove_at(0);
      ++fired;
      schedule(e.slot, renew_delay(ttl_[e.slot]));
    }
    now_ = end;
    return fired;
  }
  void cancel_all() {
    for (std::uint32_t i = 0; i < pos_.size(); ++i) cancel(i);
  }
  // For the contended run: fires what is due by `now`.
  std::size_t fire_due(std::int64_t now) {
    std::size_t fired = 0;
    while (!heap_.empty() && heap_[0].deadline <= now) {
      remove_at(0);
      ++fired;
    }
    return fired;
  }
  void set_now(std::int64_t now) { now_ = now; }

 private:
  static constexpr std::uint32_t kNone = UINT32_MAX;
  struct Entry {
    std::int64_t deadline;
    std::uint32_t slot;
  };
  void place(std::size_t i, const Entry& e) {
    heap_[i] = e;
    pos_[e.slot] = static_cast<std::uint32_t>(i);
  }
  void sift_up(std::size_t i) {
    const Entry e = heap_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (heap_[parent].deadline <= e.deadline) break;
      place(i, heap_[parent]);
      i = parent;
    }
    place(i, e);
  }
  void sift_down(std::size_t i) {
    const Entry e = heap_[i];
    const std::size_t n = heap_.size();
    for (;;) {
      std::size_t child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && heap_[child + 1].deadline < heap_[child].deadline) ++child;
      if (e.deadline <= heap_[child].deadline) break;
      place(i, heap_[child]);
      i = child;
    }
    place(i, e);
  }
  void remove_at(std::size_t i) {
    pos_[heap_[i].slot] = kNone;
    const Entry last = heap_.back();
    heap_.pop_back();
    if (i == heap_.size()) return;
    place(i, last);
    if (i > 0 && heap_[(i - 1) / 2].deadline > last.deadline) {
      sift_up(i);
    } else {
      sift_down(i);
    }
  }
  std::vector<Entry> heap_;
  std::vector<std::uint32_t> pos_;
  std::vector<std::int64_t> ttl_;
  std::int64_t now_ = 0;
};

class MultimapSet {
 public:
  std::int64_t extra_bytes() const { return 0; }
  explicit MultimapSet(std::size_t n) : its_(n), armed_(n, false), ttl_(n) {
    for (std::size_t i = 0; i < n; ++i) ttl_[i] = tables().ttls[i % kTable];
  }
  void schedule(std::uint32_t slot, std::int64_t delay) {
    if (armed_[slot]) map_.erase(its_[slot]);
    its_[slot] = map_.emplace(now_ + delay, slot);
    armed_[slot] = true;
  }
  void cancel(std::uint32_t slot) {
    if (!armed_[slot]) return;
    map_.erase(its_[slot]);
    armed_[slot] = false;
  }
  std::size_t fire_all() {
    std::size_t fired = 0;
    while (!map_.empty()) {
      auto it = map_.begin();
      now_ = std::max(now_, it->first);
      armed_[it->second] = false;
      map_.erase(it);
      ++fired;
    }
    return fired;
  }
  void arm_renewals() {
    for (std::uint32_t i = 0; i < its_.size(); ++i) schedule(i, first_delay(i));
  }
  std::size_t renew_for(std::int64_t window) {
    const std::int64_t end = now_ + window;
    std::size_t fired = 0;
    while (!map_.empty() && map_.begin()->first <= end) {
      auto it = map_.begin();
      now_ = it->first;
      const std::uint32_t slot = it->second;
      map_.erase(it);
      armed_[slot] = false;
      ++fired;
      schedule(slot, renew_delay(ttl_[slot]));
    }
    now_ = end;
    return fired;
  }
  void cancel_all() {
    for (std::uint32_t i = 0; i < its_.size(); ++i) cancel(i);
  }

 private:
  std::multimap<std::int64_t, std::uint32_t> map_;
  std::vector<std::multimap<std::int64_t, std::uint32_t>::iterator> its_;
  std::vector<bool> armed_;
  std::vector<std::int64_t> ttl_;
  std::int64_t now_ = 0;
};

class UvSet {
 public:
  explicit UvSet(std::size_t n) : n_(n), ttl_ms_(n) {
    for (std::size_t i = 0; i < n; ++i) ttl_ms_[i] = tables().ttls[i % kTable] / 1'000'000;
    if (uv_loop_init(&loop_) != 0) std::abort();
    loop_.data = this;
    const bool counting = g_counting.exchange(true);
    const std::int64_t before = g_live_bytes.load();
    timers_ = std::make_unique<uv_timer_t[]>(n);
    extra_bytes_ = g_live_bytes.load() - before;
    g_counting = counting;
    for (std::size_t i = 0; i < n; ++i) {
      uv_timer_init(&loop_, &timers_[i]);
      timers_[i].data = this;
    }
  }
  ~UvSet() {
    for (std::size_t i = 0; i < n_; ++i) uv_close(reinterpret_cast<uv_handle_t*>(&timers_[i]), nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop_) != 0) {
      std::fprintf(stderr, "uv_loop_close failed: handles left open\n");
      std::abort();
    }
  }
  void schedule(std::uint32_t slot, std::int64_t delay) {
    uv_timer_start(&timers_[slot], &UvSet::on_fire, static_cast<std::uint64_t>(delay / 1'000'000), 0);
  }
  void cancel(std::uint32_t slot) { uv_timer_stop(&timers_[slot]); }
  // libuv keeps nothing but the handles: they are the structure.
  std::int64_t extra_bytes() const { return extra_bytes_; }
  // Moves the loop time back by `ns` so that one uv_run() fires what is due
  // within that window.
  void rewind(std::int64_t ns) {
    uv_update_time(&loop_);
    loop_.time -= static_cast<std::uint64_t>(ns / 1'000'000) + 1;
  }
  std::size_t fire_all() {
    fired_ = 0;
    renewing_ = false;
    uv_run(&loop_, UV_RUN_NOWAIT);
    return fired_;
  }
  void arm_renewals() {
    rewind(kWindowNs);
    for (std::uint32_t i = 0; i < n_; ++i) {
      uv_timer_start(&timers_[i], &UvSet::on_fire, static_cast<std::uint64_t>(first_delay(i) / 1'000'000), 0);
    }
  }
  std::size_t renew_for(std::int64_t) {
    fired_ = 0;
    renewing_ = true;
    uv_run(&loop_, UV_RUN_NOWAIT);
    return fired_;
  }
  void cancel_all() {
    for (std::size_t i = 0; i < n_; ++i) uv_timer_stop(&timers_[i]);
  }

 private:
  static void on_fire(uv_timer_t* t) {
    auto* self = static_cast<UvSet*>(t->data);
    ++self->fired_;
    if (!self->renewing_) return;
    // Re-arm from this timer's own due time, then give uv_run its time back.
    const std::uint64_t loop_time = self->loop_.time;
    self->loop_.time = t->timeout;
    const auto slot = static_cast<std::size_t>(t - self->timers_.get());
    uv_timer_start(t, &UvSet::on_fire, static_cast<std::uint64_t>(self->ttl_ms_[slot] * 9 / 10), 0);
    self->loop_.time = loop_time;
  }
  std::size_t n_;
  std::vector<std::int64_t> ttl_ms_;
  uv_loop_t loop_;
  std::unique_ptr<uv_timer_t[]> timers_;
  std::size_t fired_ = 0;
  bool renewing_ = false;
  std::int64_t extra_bytes_ = 0;
};

// --- ScheduleCancel ----------------------------------------------------------

// A filled structure survives between the calls benchmark makes for one
// family and size (it calls again with more iterations), and is dropped when
// another starts, so at most one large set lives at a time.
struct Cached {
  std::function<void()> drop;
  const void* key = nullptr;
  std::size_t n = 0;
  double bytes_per_timeout = 0;
};
Cached g_cached;

void drop_cached() {
  if (g_cached.drop) g_cached.drop();
  g_cached = {};
}

// bytes_per_timeout counts what filling N allocated plus the structure's
// fixed part (the empty wheel, libuv's uv_timer_t array), not the caller's
// per-slot handles: 16 B Timeout for the wheel, a 4 B generation or position
// for the heaps, an 8 B iterator for the multimap.
template <class Set>
Set& filled(std::size_t n) {
  static std::unique_ptr<Set> set;
  static const int tag = 0;
  if (g_cached.key != &tag || g_cached.n != n) {
    drop_cached();
    set = std::make_unique<Set>(n + 1);  // one spare slot for the Newest runs
    g_counting = true;
    const std::int64_t before = g_live_bytes.load();
    const auto& t = tables();
    for (std::uint32_t i = 0; i < n; ++i) set->schedule(i, t.delays[(i * 7919u) % kTable]);
    const std::int64_t used = g_live_bytes.load() - before + set->extra_bytes();
    g_counting = false;
    g_cached.drop = [] { set.reset(); };
    g_cached.key = &tag;
    g_cached.n = n;
    g_cached.bytes_per_timeout = static_cast<double>(used) / static_cast<double>(n);
  }
  return *set;
}

template <class Set>
void schedule_cancel(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Set& set = filled<Set>(n);
  const auto& t = tables();
  std::size_t k = 0;
  for (auto _ : state) {
    const std::uint32_t slot = pick(t.victims[k & (kTable - 1)], n);
    set.cancel(slot);
    set.schedule(slot, t.delays[k & (kTable - 1)]);
    ++k;
  }
  state.counters["bytes_per_timeout"] = g_cached.bytes_per_timeout;
}

// Cancels what it just scheduled, as when work finishes before its deadline.
template <class Set>
void schedule_cancel_newest(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Set& set = filled<Set>(n);
  const auto& t = tables();
  const auto spare = static_cast<std::uint32_t>(n);
  std::size_t k = 0;
  for (auto _ : state) {
    set.schedule(spare, t.delays[k & (kTable - 1)]);
    set.cancel(spare);
    ++k;
  }
}

void BM_Wheel_ScheduleCancel(benchmark::State& s) { schedule_cancel<WheelSet>(s); }
void BM_LazyHeap_ScheduleCancel(benchmark::State& s) { schedule_cancel<LazyHeapSet>(s); }
void BM_IndexHeap_ScheduleCancel(benchmark::State& s) { schedule_cancel<IndexHeapSet>(s); }
void BM_Uv_ScheduleCancel(benchmark::State& s) { schedule_cancel<UvSet>(s); }
void BM_Multimap_ScheduleCancel(benchmark::State& s) { schedule_cancel<MultimapSet>(s); }
void BM_Wheel_ScheduleCancelNewest(benchmark::State& s) { schedule_cancel_newest<WheelSet>(s); }
void BM_LazyHeap_ScheduleCancelNewest(benchmark::State& s) { schedule_cancel_newest<LazyHeapSet>(s); }
void BM_IndexHeap_ScheduleCancelNewest(benchmark::State& s) { schedule_cancel_newest<IndexHeapSet>(s); }
void BM_Uv_ScheduleCancelNewest(benchmark::State& s) { schedule_cancel_newest<UvSet>(s); }
void BM_Multimap_ScheduleCancelNewest(benchmark::State& s) { schedule_cancel_newest<MultimapSet>(s); }

// --- Expire and Renew --------------------------------------------------------

template <class Set>
std::unique_ptr<Set> make_set(std::size_t n) {
  if constexpr (std::is_same_v<Set, WheelSet>) {
    return std::make_unique<WheelSet>(n, fake_now);
  } else {
    return std::make_unique<Set>(n);
  }
}

template <class Set>
void expire(benchmark::State& state) {
  drop_cached();
  const auto n = static_cast<std::size_t>(state.range(0));
  auto set = make_set<Set>(n);
  const auto& t = tables();
  std::size_t fired = 0, k = 0;
  for (auto _ : state) {
    state.PauseTiming();
    if constexpr (std::is_same_v<Set, UvSet>) set->rewind(kSpreadNs);
    for (std::uint32_t i = 0; i < n; ++i) set->schedule(i, t.delays[(k++) & (kTable - 1)]);
    state.ResumeTiming();
    fired += set->fire_all();
  }
  if (fired != n * state.iterations()) state.SkipWithError("not every timeout fired");
  state.counters["s_per_fire"] =
      benchmark::Counter(static_cast<double>(fired), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

template <class Set>
void renew(benchmark::State& state) {
  drop_cached();
  const auto n = static_cast<std::size_t>(state.range(0));
  auto set = make_set<Set>(n);
  std::size_t fired = 0;
  for (auto _ : state) {
    state.PauseTiming();
    set->arm_renewals();
    state.ResumeTiming();
    fired += set->renew_for(kWindowNs);
    state.PauseTiming();
    set->cancel_all();
    state.ResumeTiming();
  }
  if (fired < n * state.iterations()) state.SkipWithError("renewals did not fire");
  state.counters["s_per_fire"] =
      benchmark::Counter(static_cast<double>(fired), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["fires_per_timeout"] =
      static_cast<double>(fired) / static_cast<double>(n * state.iterations());
}

void BM_Wheel_Expire(benchmark::State& s) { expire<WheelSet>(s); }
void BM_LazyHeap_Expire(benchmark::State& s) { expire<LazyHeapSet>(s); }
void BM_IndexHeap_Expire(benchmark::State& s) { expire<IndexHeapSet>(s); }
void BM_Uv_Expire(benchmark::State& s) { expire<UvSet>(s); }
void BM_Multimap_Expire(benchmark::State& s) { expire<MultimapSet>(s); }
void BM_Wheel_Renew(benchmark::State& s) { renew<WheelSet>(s); }
void BM_LazyHeap_Renew(benchmark::State& s) { renew<LazyHeapSet>(s); }
void BM_IndexHeap_Renew(benchmark::State& s) { renew<IndexHeapSet>(s); }
void BM_Uv_Renew(benchmark::State& s) { renew<UvSet>(s); }
void BM_Multimap_Renew(benchmark::State& s) { renew<MultimapSet>(s); }

// --- contended ---------------------------------------------------------------

// Sleeps to absolute deadlines, as an I/O loop's poll timeout would.
void sleep_until(Clock::time_point t) {
  const auto ns = t.time_since_epoch().count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

struct NoopTask final : TimerTask {
  void run(Timeout) noexcept override { fired.fetch_add(1, std::memory_order_relaxed); }
  std::atomic<std::uint64_t> fired{0};
};

// Two producers (this thread, measured, and one more) schedule and cancel
// from their own threads while an owner thread advances the wheel each tick.
void BM_Wheel_ScheduleCancelContended(benchmark::State& state) {
  drop_cached();
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::size_t per = n / 2;
  TimerWheel wheel;
  NoopTask task;
  std::atomic<bool> stop{false};
  std::thread owner([&] {
    wheel.bind_to_current_thread();
    auto next = Clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
      wheel.advance();
      next += wheel.tick();
      sleep_until(next);
    }
  });
  auto producer = [&](std::vector<Timeout>& handles, std::size_t offset, auto&& running) {
    const auto& t = tables();
    std::size_t k = offset;
    while (running()) {
      const std::uint32_t slot = pick(t.victims[k & (kTable - 1)], per);
      handles[slot].cancel();
      handles[slot] = wheel.new_timeout(task, std::chrono::nanoseconds(t.delays[k & (kTable - 1)]));
      ++k;
    }
  };
  std::vector<Timeout> mine(per), theirs(per);
  for (std::size_t i = 0; i < per; ++i) {
    mine[i] = wheel.new_timeout(task, std::chrono::nanoseconds(tables().delays[i % kTable]));
    theirs[i] = wheel.new_timeout(task, std::chrono::nanoseconds(tables().delays[(i + 1) % kTable]));
  }
  std::thread other([&] { producer(theirs, 12345, [&] { return !stop.load(std::memory_order_relaxed); }); });
  producer(mine, 0, [&] { return state.KeepRunning(); });
  stop = true;
  other.join();
  owner.join();
}

void BM_MutexHeap_ScheduleCancelContended(benchmark::State& state) {
  drop_cached();
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::size_t per = n / 2;
  IndexHeapSet heap(n);
  std::mutex mutex;
  const auto start = Clock::now();
  auto now_ns = [&] { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(); };
  std::atomic<bool> stop{false};
  std::thread owner([&] {
    auto next = Clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
      {
        std::lock_guard lock(mutex);
        heap.fire_due(now_ns());
      }
      next += 5ms;
      sleep_until(next);
    }
  });
  auto producer = [&](std::uint32_t offset, std::size_t k, auto&& running) {
    const auto& t = tables();
    while (running()) {
      const std::uint32_t slot = offset + pick(t.victims[k & (kTable - 1)], per);
      const std::int64_t now = now_ns();  // a shared heap has no cached time
      std::lock_guard lock(mutex);
      heap.cancel(slot);
      heap.set_now(now);
      heap.schedule(slot, t.delays[k & (kTable - 1)]);
      ++k;
    }
  };
  {
    std::lock_guard lock(mutex);
    for (std::uint32_t i = 0; i < 2 * per; ++i) heap.schedule(i, tables().delays[i % kTable]);
  }
  std::thread other([&] { producer(static_cast<std::uint32_t>(per), 12345, [&] { return !stop.load(); }); });
  producer(0, 0, [&] { return state.KeepRunning(); });
  stop = true;
  other.join();
  owner.join();
}

// --- memory of an empty wheel ------------------------------------------------

void BM_Wheel_EmptySize(benchmark::State& state) {
  std::int64_t bytes = 0;
  for (auto _ : state) {
    g_counting = true;
    const std::int64_t before = g_live_bytes.load();
    {
      auto wheel = std::make_unique<TimerWheel>();
      bytes = g_live_bytes.load() - before;
      benchmark::DoNotOptimize(wheel.get());
    }
    g_counting = false;
  }
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["buckets"] = 512;
}

// --- lateness ----------------------------------------------------------------

// The first reading of the clock is the wheel's start, so that the loop can
// wake exactly on the wheel's tick boundaries.
std::atomic<std::int64_t> g_lateness_start{0};
Clock::time_point recording_now() noexcept {
  const Clock::time_point t = Clock::now();
  std::int64_t expected = 0;
  g_lateness_start.compare_exchange_strong(expected, t.time_since_epoch().count());
  return t;
}

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
};
Percentiles percentiles(std::vector<std::int64_t>& v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return static_cast<double>(v[static_cast<std::size_t>(q * (v.size() - 1))]) / 1000.0; };
  return {at(0.5), at(0.99), static_cast<double>(v.back()) / 1000.0};
}

// One loop thread wakes at each 1 ms tick boundary with clock_nanosleep and
// advances the wheel; two producers schedule (1..20 ms) and cancel about
// 100K timeouts a second each. Microseconds:
//   sleep_*   how late clock_nanosleep returned (the floor for any loop)
//   tick_*    how late a fired task ran after its tick's boundary
//   fire_*    how late it ran after its own deadline (adds the rounding up
//             to the tick, 0..1 ms)
void BM_Wheel_TickLateness(benchmark::State& state) {
  drop_cached();
  constexpr auto kTick = 1ms;
  constexpr auto kRun = 1s;
  struct Task final : TimerTask {
    void run(Timeout) noexcept override {
      const auto now = Clock::now();
      tick_late->push_back((now - *boundary).count());
      fire_late->push_back((now - deadline).count());
      busy.store(false, std::memory_order_release);  // the producer may reuse it
    }
    Clock::time_point deadline;
    const Clock::time_point* boundary = nullptr;
    std::vector<std::int64_t>* tick_late = nullptr;
    std::vector<std::int64_t>* fire_late = nullptr;
    std::atomic<bool> busy{false};
  };
  for (auto _ : state) {
    g_lateness_start = 0;
    lockwatch::TimerWheelOptions options;
    options.tick = kTick;
    TimerWheel wheel(options, recording_now);
    const Clock::time_point start{std::chrono::nanoseconds(g_lateness_start.load())};
    std::vector<std::int64_t> sleep_late, tick_late, fire_late;
    sleep_late.reserve(2000);
    tick_late.reserve(1 << 20);
    fire_late.reserve(1 << 20);
    Clock::time_point boundary = start;
    constexpr std::size_t kSlots = 4096;
    std::vector<std::vector<Task>> tasks(2);
    for (auto& per : tasks) {
      per = std::vector<Task>(kSlots);
      for (Task& t : per) {
        t.boundary = &boundary;
        t.tick_late = &tick_late;
        t.fire_late = &fire_late;
      }
    }
    std::atomic<bool> stop{false};
    auto produce = [&](int p) {
      std::mt19937 rng(static_cast<unsigned>(p));
      std::vector<Timeout> handles(kSlots);
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 64; ++i) {
          const std::size_t slot = rng() % kSlots;
          Task& task = tasks[p][slot];
          // A task object is reused only once its timeout is cancelled or
          // has finished running.
          if (task.busy.load(std::memory_order_acquire)) {
            if (!handles[slot].cancel()) continue;
          }
          const auto delay = std::chrono::microseconds(1000 + rng() % 19'000);
          task.deadline = Clock::now() + delay;
          task.busy.store(true, std::memory_order_relaxed);
          handles[slot] = wheel.new_timeout(task, delay);
        }
        std::this_thread::sleep_for(500us);  // pacing, about 100K operations a second
      }
      for (Timeout& h : handles) h.cancel();
    };
    std::thread loop([&] {
      wheel.bind_to_current_thread();
      const auto end = start + kRun;
      for (Clock::time_point next = start + kTick; next < end; next += kTick) {
        sleep_until(next);
        sleep_late.push_back((Clock::now() - next).count());
        boundary = next;
        wheel.advance();
      }
    });
    std::thread a(produce, 0), b(produce, 1);
    loop.join();
    stop = true;
    a.join();
    b.join();
    const Percentiles s = percentiles(sleep_late), t = percentiles(tick_late), f = percentiles(fire_late);
    state.counters["sleep_p50_us"] = s.p50;
    state.counters["sleep_p99_us"] = s.p99;
    state.counters["sleep_max_us"] = s.max;
    state.counters["tick_p50_us"] = t.p50;
    state.counters["tick_p99_us"] = t.p99;
    state.counters["tick_max_us"] = t.max;
    state.counters["fire_p50_us"] = f.p50;
    state.counters["fire_p99_us"] = f.p99;
    state.counters["fire_max_us"] = f.max;
    state.counters["fired"] = static_cast<double>(tick_late.size());
  }
}

void sizes(benchmark::internal::Benchmark* b) {
  b->Arg(1'000)->Arg(100'000)->Arg(1'000'000);
}

BENCHMARK(BM_Wheel_ScheduleCancel)->Apply(sizes);
BENCHMARK(BM_LazyHeap_ScheduleCancel)->Apply(sizes);
BENCHMARK(BM_IndexHeap_ScheduleCancel)->Apply(sizes);
BENCHMARK(BM_Uv_ScheduleCancel)->Apply(sizes);
BENCHMARK(BM_Multimap_ScheduleCancel)->Apply(sizes);
BENCHMARK(BM_Wheel_ScheduleCancelNewest)->Apply(sizes);
BENCHMARK(BM_LazyHeap_ScheduleCancelNewest)->Apply(sizes);
BENCHMARK(BM_IndexHeap_ScheduleCancelNewest)->Apply(sizes);
BENCHMARK(BM_Uv_ScheduleCancelNewest)->Apply(sizes);
BENCHMARK(BM_Multimap_ScheduleCancelNewest)->Apply(sizes);
BENCHMARK(BM_Wheel_ScheduleCancelContended)->Apply(sizes)->UseRealTime();
BENCHMARK(BM_MutexHeap_ScheduleCancelContended)->Apply(sizes)->UseRealTime();
BENCHMARK(BM_Wheel_Expire)->Apply(sizes);
BENCHMARK(BM_LazyHeap_Expire)->Apply(sizes);
BENCHMARK(BM_IndexHeap_Expire)->Apply(sizes);
BENCHMARK(BM_Uv_Expire)->Apply(sizes);
BENCHMARK(BM_Multimap_Expire)->Apply(sizes);
BENCHMARK(BM_Wheel_Renew)->Apply(sizes);
BENCHMARK(BM_LazyHeap_Renew)->Apply(sizes);
BENCHMARK(BM_IndexHeap_Renew)->Apply(sizes);
BENCHMARK(BM_Uv_Renew)->Apply(sizes);
BENCHMARK(BM_Multimap_Renew)->Apply(sizes);
BENCHMARK(BM_Wheel_EmptySize);
BENCHMARK(BM_Wheel_TickLateness)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
