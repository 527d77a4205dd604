// lib/core/reconnector.hpp: what every store connection does around its
// connection attempts and its requests, written once.
//
// A Reconnector owns a connection's life between attempts: its state
// (down, connecting, up, closed), the connect deadline of an attempt, the
// doubling back-off between attempts (reconnect_min .. reconnect_max), and
// the state changes, told once per transition ("down, because..." and
// "usable again"), never once per attempt. The connection does the
// attempt itself (Attempts::attempt) and says how it went: connected(),
// usable(), down(why).
//
// A RequestTimer is the command timeout of requests answered in order:
// armed from the oldest unanswered request's send time (or the last
// answer, if later: a reply still coming for an earlier request is a
// server at work), it tells the connection once the server has answered
// nothing for the timeout (Requests::overdue), and the connection drops
// the link. It looks twice, a loop turn apart, before it tells: the loop
// reads its sockets after its timers, and a process starved past the
// timeout finds the answers waiting there.
//
// Threading: the loop thread only, but construction. Both are members of
// their connection, which outlives them; their timers close with close(),
// and the loop drains them before the connection may be destroyed.
// Costs: two uv timers a connection; nothing per request but a timer
// start when the first request goes out after an idle spell.
#pragma once

#include <uv.h>

#include <chrono>
#include <functional>
#include <string>

#include "core/backoff.hpp"

namespace lockwatch::detail {

class Loop;

class Reconnector {
 public:
  // The connection's side: make one attempt now (the reconnector counts
  // its deadline), and give up the attempt in progress at its deadline
  // (the connection drops it and calls down()).
  class Attempts {
   public:
    virtual void attempt() = 0;
    virtual void attempt_timed_out() = 0;

   protected:
    ~Attempts() = default;
  };

  enum class State : unsigned char { kDown, kConnecting, kUp, kClosed };

  Reconnector(Loop& loop, Backoff backoff, std::chrono::milliseconds connect_timeout, Attempts& attempts) noexcept;
  Reconnector(const Reconnector&) = delete;
  Reconnector& operator=(const Reconnector&) = delete;

  // Told when the connection goes down (with why) and when it is usable
  // again: once per transition (set before start()).
  void set_state_hook(std::function<void(bool up, const std::string& why)> hook) { state_hook_ = std::move(hook); }

  // Makes the timers and the first attempt.
  void start();
  // An attempt now: a scheduled one is made at once; the deadline starts.
  void attempt_now();
  // The attempt connected: its deadline stops, the back-off starts over.
  void connected();
  // The connection can take requests: told "up" once after a "down".
  void usable();
  // The attempt or the connection failed: told "down" once, the next
  // attempt after the back-off. Nothing after close().
  void down(const std::string& why);
  // Down, with no attempt scheduled (requests wait for one): schedules it.
  void want_attempt();
  // The next attempt is worth making at once (a new address): the
  // back-off starts over, and a scheduled attempt is made now.
  void retry_now();
  // No more attempts; the timers close. Idempotent.
  void close();

  State state() const noexcept { return state_; }
  bool closed() const noexcept { return state_ == State::kClosed; }
  bool scheduled() const noexcept { return scheduled_; }
  std::chrono::milliseconds connect_timeout() const noexcept { return connect_timeout_; }

 private:
  static void on_timer(uv_timer_t* t);

  Loop& loop_;
  Backoff backoff_;
  std::chrono::milliseconds connect_timeout_;
  Attempts& attempts_;
  std::function<void(bool, const std::string&)> state_hook_;
  State state_ = State::kDown;
  bool started_ = false;
  bool scheduled_ = false;      // the timer runs the back-off before an attempt
  bool reported_down_ = false;  // "down" told, "up" not since
  uv_timer_t timer_{};          // the back-off, then the attempt's deadline
};

class RequestTimer {
 public:
  using Clock = std::chrono::steady_clock;
  // The connection's side. unanswered_since(): since when the oldest
  // unanswered request has waited (its send time, or the last answer if
  // later); kUnwritten while it is not written yet, kNone with nothing in
  // flight. overdue(): the server answered nothing for the timeout.
  class Requests {
   public:
    virtual Clock::time_point unanswered_since() const = 0;
    virtual void overdue() = 0;

   protected:
    ~Requests() = default;
  };
  static constexpr Clock::time_point kNone = Clock::time_point::min();
  static constexpr Clock::time_point kUnwritten = Clock::time_point::max();

  RequestTimer(Loop& loop, std::chrono::milliseconds timeout, Requests& requests) noexcept;
  RequestTimer(const RequestTimer&) = delete;
  RequestTimer& operator=(const RequestTimer&) = delete;

  void start();
  // Requests are in flight: the timer runs (a no-op when it does already).
  void watch();
  // Nothing in flight any more (the link dropped): the timer stops.
  void stop();
  void close();
  // True when the oldest unanswered request is past the timeout now.
  bool is_overdue() const;
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  static void on_timer(uv_timer_t* t);
  void arm(Clock::time_point since);

  Loop& loop_;
  std::chrono::milliseconds timeout_;
  Requests& requests_;
  bool started_ = false;
  bool closed_ = false;
  bool second_look_ = false;  // overdue at the last look: one loop turn more
  uv_timer_t timer_{};
};

}  // namespace lockwatch::detail
