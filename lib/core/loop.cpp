#include "loop.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>

#include "core/thread_name.hpp"

namespace lockwatch::detail {

Loop::Loop(std::chrono::microseconds busy_poll) : busy_poll_(busy_poll) {
  if (uv_loop_init(&loop_) != 0) std::abort();
  async_.data = this;
  uv_async_init(&loop_, &async_, &Loop::on_async);
  spin_.data = this;
  uv_idle_init(&loop_, &spin_);
  std::promise<void> started;
  auto ready = started.get_future();
  thread_ = std::thread([this, &started] {
    started.set_value();
    uv_run(&loop_, UV_RUN_DEFAULT);
  });
  name_thread(thread_, "lw-loop");
  ready.wait();
}

Loop::~Loop() {
  if (thread_.joinable()) shutdown([] {});
}

bool Loop::post(Task task) {
  bool wake;
  {
    std::lock_guard lk(mu_);
    if (!accepting_) return false;
    wake = queue_.empty();
    queue_.push_back(std::move(task));
  }
  // uv_async_send coalesces; one send per non-empty transition is enough
  // because drain() takes the whole queue.
  if (wake) uv_async_send(&async_);
  return true;
}

// A task runs inside uv_run: nothing may unwind through libuv's C frames.
void Loop::run_guarded(Task& task) noexcept {
  try {
    task();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockwatch: unexpected exception in a loop task: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "lockwatch: unexpected exception in a loop task\n");
  }
}

void Loop::on_async(uv_async_t* handle) { static_cast<Loop*>(handle->data)->drain(); }

// While the idle handle is active, libuv polls with a zero timeout: the loop
// stays awake until the window after the last drain has passed.
void Loop::on_spin(uv_idle_t* handle) {
  auto* self = static_cast<Loop*>(handle->data);
  if (uv_hrtime() < self->spin_until_) return;
  uv_idle_stop(handle);
  self->spinning_ = false;
}

void Loop::drain() {
  for (;;) {
    {
      std::lock_guard lk(mu_);
      running_.swap(queue_);
    }
    for (auto& t : running_) run_guarded(t);
    running_.clear();
    if (!closing_) {
      if (busy_poll_.count() > 0) {
        spin_until_ = uv_hrtime() + static_cast<std::uint64_t>(busy_poll_.count()) * 1000;
        if (!spinning_) {
          spinning_ = true;
          uv_idle_start(&spin_, &Loop::on_spin);
        }
      }
      return;
    }
    // Shutting down: whatever was posted before post() stopped accepting
    // still runs, in order, and then the wake-up handle goes.
    std::lock_guard lk(mu_);
    if (queue_.empty()) break;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&spin_), nullptr);
}

int Loop::shutdown(Task close_all) {
  if (!thread_.joinable()) return close_result_;
  post([this, close_all = std::move(close_all)]() mutable {
    close_all();
    {
      std::lock_guard lk(mu_);
      accepting_ = false;
    }
    closing_ = true;  // the drain() running this finishes the queue
  });
  thread_.join();
  close_result_ = uv_loop_close(&loop_);
  if (close_result_ != 0) {
    std::fprintf(stderr, "lockwatch: uv_loop_close failed: a handle was left open\n");
  }
  return close_result_;
}

}  // namespace lockwatch::detail
