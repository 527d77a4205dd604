// The pool's state lives in a shared_ptr held by the pool and by every worker,
// so that a worker detached by a destructor running on that very worker can
// still finish safely after the ThreadPool object is gone.
#include "lockwatch/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/adaptive_spin.hpp"
#include "core/thread_name.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch {

struct ThreadPool::State {
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<UniqueFunction> queue_;  // guarded by mutex_
  bool stopping_ = false;                     // guarded by mutex_
  // Written under mutex_, read without it by a polling worker.
  std::atomic<std::size_t> queued_{0};
  std::chrono::nanoseconds busy_poll_{};
  std::atomic<bool> polling_{false};  // one worker polls at a time

  // Busy-polls for a task before the worker sleeps (Options::runtime.busy_poll).
  // Only one worker polls, so that idle workers do not take the cores the
  // loop and the server need. Adaptive (busy_poll < 0): for the window
  // AdaptiveSpin allows, which is 0 unless tasks have been coming sooner
  // than a wake-up costs.
  void poll_for_work() {
    if (busy_poll_.count() == 0) return;
    const bool adaptive = busy_poll_.count() < 0;
    const auto window = adaptive ? std::chrono::nanoseconds(adapt_.window()) : busy_poll_;
    if (window.count() <= 0 || polling_.exchange(true, std::memory_order_acquire)) return;
    auto until = std::chrono::steady_clock::now() + window;
    for (unsigned i = 1;; ++i) {
      if (queued_.load(std::memory_order_relaxed) != 0) break;
      if (i % 64 == 0) {
        if (std::chrono::steady_clock::now() >= until) {
          if (adaptive) adapt_.wasted();
          break;
        }
        std::this_thread::yield();  // the cores are few: let a runnable thread go first
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    polling_.store(false, std::memory_order_release);
  }
  detail::AdaptiveSpin adapt_;
  // Adaptive: workers waiting on wake_, and when post() last woke one.
  std::size_t sleepers_ = 0;                          // guarded by mutex_
  std::chrono::steady_clock::time_point notified_at_;  // guarded by mutex_

  // Serialises joining, so that concurrent shutdown() calls do not join the
  // same std::thread twice. Pool threads never take it while they could be
  // waited for (see shutdown()), which keeps joins free of cycles.
  std::mutex join_mutex_;
  std::vector<std::thread> threads_;  // guarded by join_mutex_

  // No new work; idle workers wake up and leave.
  void request_stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
  }
  // Joins every worker; the caller, if it is one of them, is detached
  // instead (it finishes on the shared state once its task returns). The
  // caller holds join_mutex_.
  void join_all_but_self() {
    for (std::thread& t : threads_) {
      if (!t.joinable()) continue;
      if (t.get_id() == std::this_thread::get_id()) {
        t.detach();
      } else {
        t.join();
      }
    }
  }
};

namespace {

// The pool the current thread works for, or null. A pointer rather than a
// bool so that shutdown() can tell its own workers from another pool's.
thread_local const void* t_current_pool = nullptr;

// The pattern with its first "{}" replaced by the worker's index.
std::string worker_name(std::string name, std::size_t index) {
  if (auto at = name.find("{}"); at != std::string::npos) name.replace(at, 2, std::to_string(index));
  return name;
}

}  // namespace

ThreadPool::ThreadPool(std::size_t threads, std::chrono::microseconds busy_poll, std::string name_pattern)
    : state_(std::make_shared<State>()),
      size_(threads != 0 ? threads
                         : std::max<std::size_t>(1, std::thread::hardware_concurrency())) {
  state_->busy_poll_ = busy_poll;
  std::lock_guard join_lock(state_->join_mutex_);
  state_->threads_.reserve(size_);
  try {
    for (std::size_t i = 0; i < size_; ++i) {
      state_->threads_.emplace_back([state = state_] { run_worker(state); });
      detail::name_thread(state_->threads_.back(), worker_name(name_pattern, i));
    }
  } catch (...) {
    // Stop the workers that did start before reporting the failure.
    state_->request_stop();
    state_->join_all_but_self();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  if (t_current_pool != state_.get()) {
    shutdown();
    return;
  }
  // Destroyed from one of our own tasks: join every other worker, detach
  // this one.
  state_->request_stop();
  std::lock_guard join_lock(state_->join_mutex_);
  state_->join_all_but_self();
}

void ThreadPool::post(UniqueFunction task) {
  if (!task) throw InvalidArgument("ThreadPool::post: empty task");
  {
    std::lock_guard lock(state_->mutex_);
    if (state_->stopping_) throw RuntimeStopped("ThreadPool: shut down, no new work accepted");
    state_->queue_.push_back(std::move(task));
    state_->queued_.store(state_->queue_.size(), std::memory_order_relaxed);
    if (state_->sleepers_ != 0 && state_->notified_at_ == std::chrono::steady_clock::time_point{})
      state_->notified_at_ = std::chrono::steady_clock::now();
  }
  state_->wake_.notify_one();
}

void ThreadPool::post_all(std::span<UniqueFunction> tasks) {
  for (const auto& task : tasks)
    if (!task) throw InvalidArgument("ThreadPool::post_all: empty task");
  std::size_t sleepers = 0;
  {
    std::lock_guard lock(state_->mutex_);
    if (state_->stopping_) throw RuntimeStopped("ThreadPool: shut down, no new work accepted");
    for (auto& task : tasks) state_->queue_.push_back(std::move(task));
    state_->queued_.store(state_->queue_.size(), std::memory_order_relaxed);
    sleepers = state_->sleepers_;
    if (sleepers != 0 && state_->notified_at_ == std::chrono::steady_clock::time_point{})
      state_->notified_at_ = std::chrono::steady_clock::now();
  }
  // Adaptive pools count their sleepers: no more are woken than the tasks
  // need. Others wake one a task (a notify with nobody waiting is free).
  if (sleepers != 0 && tasks.size() >= sleepers) {
    state_->wake_.notify_all();
    return;
  }
  for (std::size_t i = 0; i < tasks.size(); ++i) state_->wake_.notify_one();
}

void ThreadPool::shutdown() noexcept {
  state_->request_stop();
  // A worker of this pool must not wait for the pool: it would wait for
  // itself. The destructor joins later.
  if (t_current_pool == state_.get()) return;
  std::lock_guard join_lock(state_->join_mutex_);
  state_->join_all_but_self();  // not a worker: joins them all
}

std::size_t ThreadPool::size() const noexcept { return size_; }

bool ThreadPool::on_pool_thread() noexcept { return t_current_pool != nullptr; }

void ThreadPool::run_worker(std::shared_ptr<State> state) {
  t_current_pool = state.get();
  for (;;) {
    UniqueFunction task;
    const bool adaptive = state->busy_poll_.count() < 0;
    const auto idle_since = adaptive ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (state->queued_.load(std::memory_order_relaxed) == 0) state->poll_for_work();
    {
      std::unique_lock lock(state->mutex_);
      if (adaptive && !state->stopping_ && state->queue_.empty()) {
        // Adaptive: learn how long the worker slept before its next task,
        // and what waking it cost.
        ++state->sleepers_;
        state->wake_.wait(lock, [&] { return state->stopping_ || !state->queue_.empty(); });
        --state->sleepers_;
        const auto now = std::chrono::steady_clock::now();
        if (!state->queue_.empty()) {
          state->adapt_.slept(std::chrono::duration_cast<std::chrono::nanoseconds>(now - idle_since).count());
          if (state->notified_at_ != std::chrono::steady_clock::time_point{}) {
            state->adapt_.woke(
                std::chrono::duration_cast<std::chrono::nanoseconds>(now - state->notified_at_).count());
            state->notified_at_ = {};
          }
        }
      }
      state->wake_.wait(lock, [&] { return state->stopping_ || !state->queue_.empty(); });
      // Stopping only ends the loop once the queue is drained.
      if (state->queue_.empty()) break;
      task = std::move(state->queue_.front());
      state->queue_.pop_front();
      state->queued_.store(state->queue_.size(), std::memory_order_relaxed);
    }
    try {
      task();
    } catch (...) {
      // Documented: a posted task's exception is dropped; submit() keeps it
      // in the future instead.
    }
  }
}

}  // namespace lockwatch
