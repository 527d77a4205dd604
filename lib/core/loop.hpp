// lib/core/loop.hpp: the I/O thread. One libuv loop on its own thread; the only
// thread that touches uv handles, the stores' connections and the timer wheel.
// Other threads hand it work with post(), which is one mutex-guarded append
// and, when the queue was empty, one uv_async_send.
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "lockwatch/thread_pool.hpp"

namespace lockwatch::detail {

class Loop {
 public:
  using Task = UniqueFunction;

  // busy_poll > 0: after running posted tasks the loop keeps polling
  // (epoll with a zero timeout) for this long before it sleeps, so that a
  // task posted soon after finds it awake (Options::busy_poll).
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
  uv_loop_t* uv() noexcept { return &loop_; }
  // Loop thread only: whether the loop is in a busy-poll window.
  bool polling() const noexcept { return spinning_; }

  // Any thread but the loop's. Runs `close_all` on the loop thread (it must
  // close every handle the owner made), then drains the loop, closes it
  // and joins. Returns uv_loop_close()'s result (0 when all was closed).
  int shutdown(Task close_all);

 private:
  static void on_async(uv_async_t* handle);
  static void on_spin(uv_idle_t* handle);
  static void run_guarded(Task& task) noexcept;
  void drain();

  uv_loop_t loop_{};
  uv_async_t async_{};
  uv_idle_t spin_{};                       // loop thread: active while polling
  std::chrono::microseconds busy_poll_{};  // 0: never polls
  std::uint64_t spin_until_ = 0;           // loop thread: uv_hrtime() ns
  bool spinning_ = false;                  // loop thread
  std::thread thread_;
  std::mutex mu_;
  std::vector<Task> queue_;  // guarded by mu_
  bool accepting_ = true;    // guarded by mu_
  std::vector<Task> running_;  // loop thread only: swapped with queue_
  bool closing_ = false;       // loop thread only: shutdown() has begun
  int close_result_ = 0;
};

}  // namespace lockwatch::detail
