// lib/core/loop.hpp: the I/O thread. One libuv loop on its own thread; the only
// thread that touches uv handles, the stores' connections and the timer wheel.
// Other threads hand it work with post(), which is one mutex-guarded append
// and, unless a wake-up is on its way already, one uv_async_send; or with
// post_by(), for work that may wait a little, which wakes it only when it
// would not look in time by itself.
#pragma once

#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/adaptive_spin.hpp"
#include "lockwatch/thread_pool.hpp"

namespace lockwatch::detail {

class Loop {
 public:
  using Task = UniqueFunction;
  // How many replies (or other events) an owner of the loop still awaits.
  using Demand = std::function<std::size_t()>;

  // busy_poll > 0: after running posted tasks the loop keeps polling
  // (epoll with a zero timeout) for this long before it sleeps, so that a
  // task posted soon after finds it awake (Options::runtime.busy_poll).
  // busy_poll < 0: adaptive. The loop polls only while something is
  // outstanding (a demand below, or expect()), and only as long as
  // AdaptiveSpin allows. 0: never polls.
  explicit Loop(std::chrono::microseconds busy_poll = {});
  // Joins the thread; the owner must have closed its handles through
  // shutdown() first.
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Any thread. Runs `task` on the loop thread, in posting order. Returns
  // false (and drops the task) once shutdown() has begun. A task should not
  // throw; one that does is reported on stderr and the loop goes on.
  bool post(Task task);
  // Any thread. As post(), for a task that may wait until `by`: it keeps
  // its place among the others, and the loop is woken for it only if it
  // would not look at its tasks by then. A loop that finds such tasks
  // looks again kLazyLook later, for as long as they come: while they
  // flow, they cost it one wake-up each kLazyLook, not one each.
  bool post_by(Task task, std::chrono::steady_clock::time_point by);
  static constexpr std::chrono::milliseconds kLazyLook{20};
  uv_loop_t* uv() noexcept { return &loop_; }
  // Loop thread only: whether the loop is in a busy-poll window.
  bool polling() const noexcept { return spinning_; }

  // Loop thread only. Adaptive polling asks `count` how many replies its
  // owner awaits (a connection: its requests in flight); remove it with the
  // id returned before the owner goes. Cheap to call with no polling.
  std::size_t add_demand(Demand count);
  void remove_demand(std::size_t id) noexcept;
  // Loop thread: requests made while a Background lives are work no caller
  // waits for (the watchdog's renewals); their owners leave them out of
  // their demand, so that adaptive polling never spins for them.
  class Background {
   public:
    Background() noexcept : outer_(std::exchange(t_background_, true)) {}
    ~Background() { t_background_ = outer_; }
    Background(const Background&) = delete;
    Background& operator=(const Background&) = delete;

   private:
    bool outer_;
  };
  static bool background() noexcept { return t_background_; }
  // Loop thread only: something it polled for came (a reply read), for
  // adaptive polling to count the poll as paid.
  void note_event() noexcept { ++activity_; }
  // Any thread: `n` more (or, negative, fewer) posts are on their way to
  // the loop from work running elsewhere (a locked call on the pool), which
  // adaptive polling waits for like a reply.
  void expect(int n) noexcept { expected_.fetch_add(n, std::memory_order_relaxed); }

  // Loop thread: runs `task` once this turn's events are handled, before
  // the loop next polls; the tasks of one turn run newest first. For what
  // wakes another thread (a future made ready): a caller that awaits
  // several calls in the order it made them wakes once, to find every one
  // of the turn ready, and the loop is not preempted by each wake-up while
  // it still has replies to read. On any other thread, or once shutdown()
  // has begun: at once.
  static void at_turn_end(Task task);

  // Any thread but the loop's. Runs `close_all` on the loop thread (it must
  // close every handle the owner made), then drains the loop, closes it
  // and joins. Returns uv_loop_close()'s result (0 when all was closed).
  int shutdown(Task close_all);

 private:
  static void on_async(uv_async_t* handle);
  static void on_spin(uv_idle_t* handle);
  static void on_prepare(uv_prepare_t* handle);
  static void on_check(uv_check_t* handle);
  static void on_turn_end(uv_idle_t* handle);
  static void on_lazy_look(uv_timer_t* handle);
  void run_turn_end() noexcept;
  static void run_guarded(Task& task) noexcept;
  void drain();
  // Adaptive: what is outstanding, summed.
  std::size_t outstanding() const;
  void start_spin(std::uint64_t now);
  void stop_spin() noexcept;

  static inline thread_local bool t_background_ = false;
  static inline thread_local Loop* t_loop_ = nullptr;  // the loop this thread runs
  uv_loop_t loop_{};
  uv_async_t async_{};
  uv_idle_t spin_{};                       // loop thread: active while polling
  uv_prepare_t prepare_{};                 // adaptive only: before each poll
  uv_check_t check_{};                     // adaptive only: after each poll
  std::chrono::microseconds busy_poll_{};  // 0: never polls; < 0: adaptive
  bool adaptive_ = false;
  std::uint64_t spin_until_ = 0;           // loop thread: uv_hrtime() ns
  bool spinning_ = false;                  // loop thread
  // Adaptive, loop thread only.
  AdaptiveSpin adapt_;
  std::vector<std::pair<std::size_t, Demand>> demands_;
  std::size_t next_demand_ = 1;
  std::atomic<int> expected_{0};
  std::uint64_t idle_since_ = 0;      // when the loop last ran out of work with something outstanding (0: nothing)
  bool blocking_ = false;             // between prepare and check, the poll may sleep
  std::uint64_t block_start_ = 0;     // when it began to
  bool spun_out_ = false;             // the last window was wasted: sleep until an event
  std::uint64_t activity_ = 0;        // drains, and replies seen by outstanding()
  std::uint64_t spin_activity_ = 0;   // activity_ when the spin last checked
  std::size_t spin_outstanding_ = 0;  // outstanding() then
  std::uint64_t posted_at_ = 0;       // guarded by mu_: when a post woke the loop (adaptive)
  std::thread thread_;
  std::mutex mu_;
  std::vector<Task> queue_;  // guarded by mu_
  bool wake_sent_ = false;   // guarded by mu_: a uv_async_send is on its way (drain() takes it)
  bool lazy_queued_ = false;  // guarded by mu_: queue_ holds a task of post_by()
  // Guarded by mu_: the loop looks at queue_ by then (its lazy look is
  // armed); max: it promises nothing.
  std::chrono::steady_clock::time_point look_by_ = std::chrono::steady_clock::time_point::max();
  uv_timer_t lazy_look_{};  // loop thread: armed while post_by()'s tasks come
  bool accepting_ = true;    // guarded by mu_
  std::vector<Task> running_;  // loop thread only: swapped with queue_
  uv_idle_t turn_end_{};            // loop thread: active while turn_tasks_ has any
  std::vector<Task> turn_tasks_;    // loop thread only (at_turn_end)
  std::vector<Task> turn_running_;  // loop thread only: swapped with turn_tasks_
  bool closing_ = false;       // loop thread only: shutdown() has begun
  int close_result_ = 0;
};

}  // namespace lockwatch::detail
