// lib/core/turn_end.hpp: a task run once at the end of the I/O loop's
// current turn, however often it is asked for during the turn. Requests
// made in one turn (a set's keys, the callers served by one wake-up) are
// sent together by it.
//
// An idle handle: the loop runs it before it next polls, so nothing waits
// for a batch to fill. While not open (before open(), after close()) a
// request runs the task at once.
//
// Threading: the loop thread only. Costs: one idle handle.
#pragma once

#include <uv.h>

#include <functional>
#include <utility>

namespace lockwatch::detail {

class TurnEnd {
 public:
  explicit TurnEnd(std::function<void()> task) : task_(std::move(task)) {}
  TurnEnd(const TurnEnd&) = delete;
  TurnEnd& operator=(const TurnEnd&) = delete;

  void open(uv_loop_t* loop) {
    uv_idle_init(loop, &idle_);
    idle_.data = this;
    open_ = true;
  }
  // The task runs at the turn's end (at once while not open).
  void request() {
    if (armed_) return;
    if (!open_) {
      task_();
      return;
    }
    armed_ = true;
    uv_idle_start(&idle_, on_idle);
  }
  // A request pending is dropped: the owner sends what it queued itself.
  void close() {
    if (!open_) return;
    uv_idle_stop(&idle_);
    uv_close(reinterpret_cast<uv_handle_t*>(&idle_), nullptr);
    open_ = false;
    armed_ = false;
  }

 private:
  static void on_idle(uv_idle_t* idle) {
    auto* self = static_cast<TurnEnd*>(idle->data);
    uv_idle_stop(idle);
    self->armed_ = false;
    self->task_();
  }

  std::function<void()> task_;
  uv_idle_t idle_{};
  bool open_ = false;
  bool armed_ = false;
};

}  // namespace lockwatch::detail
