// lib/core/turn_end.hpp: a task run once at the end of the I/O loop's
// current turn, however often it is asked for during the turn. Requests
// made in one turn (a set's keys, the callers served by one wake-up) are
// sent together by it.
//
// The loop's own turn end (Loop::at_turn_end): it runs before the loop
// next polls, so nothing waits for a batch to fill, and the loop reads its
// clock again after it, so a long task leaves no timer late. While not
// open (before open(), after close()), or off the loop's thread, a request
// runs the task at once.
//
// Threading: the loop thread only. Costs: one turn-end task per turn with
// a request.
#pragma once

#include <functional>
#include <utility>

#include "core/loop.hpp"

namespace lockwatch::detail {

class TurnEnd {
 public:
  explicit TurnEnd(std::function<void()> task) : task_(std::move(task)) {}
  TurnEnd(const TurnEnd&) = delete;
  TurnEnd& operator=(const TurnEnd&) = delete;

  // The owner is on its loop: requests wait for the turn's end from now.
  void open() noexcept { open_ = true; }
  // The task runs at the turn's end (at once while not open).
  void request() {
    if (armed_) return;
    if (!open_) {
      task_();
      return;
    }
    armed_ = true;
    Loop::at_turn_end([this] {
      if (!std::exchange(armed_, false)) return;  // closed meanwhile
      task_();
    });
  }
  // A request pending is dropped: the owner sends what it queued itself.
  // The owner outlives the loop's last turn (as every owner of a handle).
  void close() noexcept {
    open_ = false;
    armed_ = false;
  }

 private:
  std::function<void()> task_;
  bool open_ = false;
  bool armed_ = false;
};

}  // namespace lockwatch::detail
