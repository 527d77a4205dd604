#include "loop.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>

#include "core/guarded.hpp"
#include "core/thread_name.hpp"

namespace lockwatch::detail {

Loop::Loop(std::chrono::microseconds busy_poll) : busy_poll_(busy_poll), adaptive_(busy_poll.count() < 0) {
  if (uv_loop_init(&loop_) != 0) std::abort();
  async_.data = this;
  uv_async_init(&loop_, &async_, &Loop::on_async);
  spin_.data = this;
  uv_idle_init(&loop_, &spin_);
  prepare_.data = this;
  uv_prepare_init(&loop_, &prepare_);
  check_.data = this;
  uv_check_init(&loop_, &check_);
  turn_end_.data = this;
  uv_idle_init(&loop_, &turn_end_);
  lazy_look_.data = this;
  uv_timer_init(&loop_, &lazy_look_);
  uv_unref(reinterpret_cast<uv_handle_t*>(&lazy_look_));
  if (adaptive_) {
    uv_prepare_start(&prepare_, &Loop::on_prepare);
    uv_check_start(&check_, &Loop::on_check);
    // Neither keeps the loop alive: the async handle does.
    uv_unref(reinterpret_cast<uv_handle_t*>(&prepare_));
    uv_unref(reinterpret_cast<uv_handle_t*>(&check_));
  }
  std::promise<void> started;
  auto ready = started.get_future();
  thread_ = std::thread([this, &started] {
    t_loop_ = this;
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
    queue_.push_back(std::move(task));
    wake = !std::exchange(wake_sent_, true);
    if (wake && adaptive_) posted_at_ = uv_hrtime();
  }
  // uv_async_send coalesces; one send until the next drain is enough
  // because drain() takes the whole queue.
  if (wake) uv_async_send(&async_);
  return true;
}

bool Loop::post_by(Task task, std::chrono::steady_clock::time_point by) {
  bool wake = false;
  {
    std::lock_guard lk(mu_);
    if (!accepting_) return false;
    queue_.push_back(std::move(task));
    lazy_queued_ = true;
    if (!wake_sent_ && (by < look_by_ || look_by_ == std::chrono::steady_clock::time_point::max())) {
      wake = wake_sent_ = true;
      if (adaptive_) posted_at_ = uv_hrtime();
    }
  }
  if (wake) uv_async_send(&async_);
  return true;
}

// The lazy look came: it looks again a period on if post_by()'s tasks came
// meanwhile, else it promises nothing more (they wake the loop again).
// Decided under the lock, so that a task posted after it is held to what
// it says.
void Loop::on_lazy_look(uv_timer_t* handle) {
  auto* self = static_cast<Loop*>(handle->data);
  bool again;
  {
    std::lock_guard lk(self->mu_);
    again = self->lazy_queued_ && !self->closing_;
    self->look_by_ = again ? std::chrono::steady_clock::now() + kLazyLook : std::chrono::steady_clock::time_point::max();
  }
  if (again) uv_timer_start(&self->lazy_look_, &Loop::on_lazy_look, kLazyLook.count(), 0);
  self->drain();
}

// A task runs inside uv_run: nothing may unwind through libuv's C frames.
void Loop::run_guarded(Task& task) noexcept { guarded("a loop task", task); }

void Loop::on_async(uv_async_t* handle) { static_cast<Loop*>(handle->data)->drain(); }

void Loop::at_turn_end(Task task) {
  Loop* self = t_loop_;
  if (self == nullptr || self->closing_) {
    run_guarded(task);
    return;
  }
  // An active idle handle also keeps the next poll from sleeping, so a
  // task asked for from a timer runs in this turn too.
  if (self->turn_tasks_.empty()) uv_idle_start(&self->turn_end_, &Loop::on_turn_end);
  self->turn_tasks_.push_back(std::move(task));
}

void Loop::on_turn_end(uv_idle_t* handle) { static_cast<Loop*>(handle->data)->run_turn_end(); }

void Loop::run_turn_end() noexcept {
  uv_idle_stop(&turn_end_);
  // A task may ask for more: they run in this call, after this round.
  while (!turn_tasks_.empty()) {
    turn_running_.swap(turn_tasks_);
    for (auto t = turn_running_.rbegin(); t != turn_running_.rend(); ++t) run_guarded(*t);
    turn_running_.clear();
  }
  // libuv read its clock before the idle handles ran, and times the next
  // poll from that reading: a slow task here would make every timer late
  // by as long as it took.
  uv_update_time(&loop_);
}

std::size_t Loop::add_demand(Demand count) {
  demands_.emplace_back(next_demand_, std::move(count));
  return next_demand_++;
}

void Loop::remove_demand(std::size_t id) noexcept {
  std::erase_if(demands_, [id](const auto& d) { return d.first == id; });
}

std::size_t Loop::outstanding() const {
  int expected = expected_.load(std::memory_order_relaxed);
  std::size_t n = expected > 0 ? static_cast<std::size_t>(expected) : 0;
  for (const auto& d : demands_) n += d.second();
  return n;
}

void Loop::start_spin(std::uint64_t now) {
  spin_until_ = now + static_cast<std::uint64_t>(adapt_.window());
  spin_activity_ = activity_;
  spin_outstanding_ = outstanding();
  spinning_ = true;
  uv_idle_start(&spin_, &Loop::on_spin);
}

void Loop::stop_spin() noexcept {
  uv_idle_stop(&spin_);
  spinning_ = false;
}

// While the idle handle is active, libuv polls with a zero timeout: the loop
// stays awake until the window after the last drain has passed. Adaptive:
// each event that comes during the window (a task, a reply) starts it
// again while something is still outstanding; a window that passes with
// none is wasted and makes the next one shorter.
void Loop::on_spin(uv_idle_t* handle) {
  auto* self = static_cast<Loop*>(handle->data);
  const std::uint64_t now = uv_hrtime();
  if (!self->adaptive_) {
    if (now < self->spin_until_) return;
    self->stop_spin();
    return;
  }
  const std::size_t n = self->outstanding();
  if (n == 0) {  // what it polled for came: no more reason to poll
    self->stop_spin();
    self->idle_since_ = 0;
    return;
  }
  if (self->activity_ != self->spin_activity_ || n < self->spin_outstanding_) {
    self->start_spin(now);  // paid: poll again for what is still outstanding
    self->idle_since_ = now;
    return;
  }
  if (now < self->spin_until_) return;
  self->adapt_.wasted();
  self->spun_out_ = true;
  self->stop_spin();
}

// Adaptive: before each poll. With something outstanding the loop polls
// for the current window, unless its last window was just wasted;
// otherwise the poll may sleep, and on_check learns how long it slept.
void Loop::on_prepare(uv_prepare_t* handle) {
  auto* self = static_cast<Loop*>(handle->data);
  if (self->spinning_ || self->closing_) return;
  const std::uint64_t now = uv_hrtime();
  if (self->outstanding() == 0) {
    self->idle_since_ = 0;
  } else {
    if (self->idle_since_ == 0) self->idle_since_ = now;
    // A wasted window is not tried again before the next event.
    if (!self->spun_out_ && self->adapt_.window() > 0) {
      self->start_spin(now);
      return;
    }
  }
  self->blocking_ = true;
  self->block_start_ = now;
}

void Loop::on_check(uv_check_t* handle) {
  auto* self = static_cast<Loop*>(handle->data);
  if (!self->blocking_) return;
  self->blocking_ = false;
  self->spun_out_ = false;
  if (self->idle_since_ != 0) {
    // Something was outstanding: had the loop polled this long it would
    // have saved the wake-up.
    self->adapt_.slept(static_cast<AdaptiveSpin::Nanos>(uv_hrtime() - self->idle_since_));
    self->idle_since_ = 0;
  }
}

void Loop::drain() {
  for (;;) {
    std::uint64_t posted_at = 0;
    bool look = false;
    {
      std::lock_guard lk(mu_);
      running_.swap(queue_);
      wake_sent_ = false;
      // post_by()'s tasks came while no look was armed: one is now.
      if (std::exchange(lazy_queued_, false) && look_by_ == std::chrono::steady_clock::time_point::max() &&
          !closing_) {
        look_by_ = std::chrono::steady_clock::now() + kLazyLook;
        look = true;
      }
      posted_at = posted_at_;
      posted_at_ = 0;
    }
    if (look) uv_timer_start(&lazy_look_, &Loop::on_lazy_look, kLazyLook.count(), 0);
    if (adaptive_) {
      ++activity_;
      // Posted while the loop was about to sleep: what waking it cost.
      if (blocking_ && posted_at >= block_start_) {
        adapt_.woke(static_cast<AdaptiveSpin::Nanos>(uv_hrtime() - posted_at));
      }
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
  run_turn_end();  // what the last turns asked for (at_turn_end runs at once from now on)
  uv_close(reinterpret_cast<uv_handle_t*>(&turn_end_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&lazy_look_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&spin_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&prepare_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&check_), nullptr);
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
