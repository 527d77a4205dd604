#include "core/reconnector.hpp"

#include <algorithm>
#include <cstdint>

#include "core/guarded.hpp"
#include "core/loop.hpp"

namespace lockwatch::detail {

namespace {

std::uint64_t ms_of(std::chrono::milliseconds d) { return static_cast<std::uint64_t>(std::max<long long>(d.count(), 0)); }

bool active(const uv_timer_t& t) { return uv_is_active(reinterpret_cast<const uv_handle_t*>(&t)) != 0; }

}  // namespace

// ---- Reconnector

Reconnector::Reconnector(Loop& loop, Backoff backoff, std::chrono::milliseconds connect_timeout,
                         Attempts& attempts) noexcept
    : loop_(loop), backoff_(backoff), connect_timeout_(connect_timeout), attempts_(attempts) {}

void Reconnector::start() {
  if (started_ || closed()) return;
  started_ = true;
  uv_timer_init(loop_.uv(), &timer_);
  timer_.data = this;
  attempt_now();
}

void Reconnector::attempt_now() {
  if (!started_ || closed()) return;
  uv_timer_stop(&timer_);
  scheduled_ = false;
  state_ = State::kConnecting;
  uv_update_time(loop_.uv());  // the deadline from now (see want_attempt())
  uv_timer_start(&timer_, &Reconnector::on_timer, ms_of(connect_timeout_), 0);
  attempts_.attempt();
}

void Reconnector::connected() {
  if (closed()) return;
  if (started_) uv_timer_stop(&timer_);
  state_ = State::kUp;
  backoff_.reset();
}

void Reconnector::usable() {
  if (closed() || !reported_down_) return;
  reported_down_ = false;
  if (state_hook_) guarded("a connection's state hook", [&] { state_hook_(true, std::string()); });
}

void Reconnector::down(const std::string& why) {
  if (closed()) return;
  state_ = State::kDown;
  if (started_) uv_timer_stop(&timer_);
  scheduled_ = false;
  if (!reported_down_) {
    reported_down_ = true;
    if (state_hook_) guarded("a connection's state hook", [&] { state_hook_(false, why); });
  }
  want_attempt();
}

void Reconnector::want_attempt() {
  if (!started_ || closed() || state_ != State::kDown || scheduled_) return;
  scheduled_ = true;
  // From now, not from the loop's time cached at its turn's start: a turn
  // that ran long (a slow attempt, a preempted thread) would shorten the
  // back-off by as much.
  uv_update_time(loop_.uv());
  uv_timer_start(&timer_, &Reconnector::on_timer, ms_of(backoff_.next()), 0);
}

void Reconnector::retry_now() {
  backoff_.reset();
  if (scheduled_) attempt_now();
}

void Reconnector::close() {
  if (closed()) return;
  state_ = State::kClosed;
  scheduled_ = false;
  if (started_) uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

void Reconnector::on_timer(uv_timer_t* t) {
  auto* self = static_cast<Reconnector*>(t->data);
  if (self->closed()) return;
  if (self->scheduled_) {
    self->attempt_now();
  } else if (self->state_ == State::kConnecting) {
    self->attempts_.attempt_timed_out();
  }
}

// ---- RequestTimer

RequestTimer::RequestTimer(Loop& loop, std::chrono::milliseconds timeout, Requests& requests) noexcept
    : loop_(loop), timeout_(timeout), requests_(requests) {}

void RequestTimer::start() {
  if (started_ || closed_) return;
  started_ = true;
  uv_timer_init(loop_.uv(), &timer_);
  timer_.data = this;
}

void RequestTimer::watch() {
  if (!started_ || closed_ || active(timer_)) return;
  arm(requests_.unanswered_since());
}

void RequestTimer::stop() {
  second_look_ = false;
  if (started_ && !closed_) uv_timer_stop(&timer_);
}

void RequestTimer::close() {
  if (closed_) return;
  closed_ = true;
  if (started_) uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

bool RequestTimer::is_overdue() const {
  const auto since = requests_.unanswered_since();
  return since != kNone && since != kUnwritten && Clock::now() - since >= timeout_;
}

void RequestTimer::arm(Clock::time_point since) {
  if (since == kNone) return;
  // Not written yet (the loop is busy): a look a quarter timeout later.
  std::chrono::milliseconds delay = timeout_ / 4;
  if (since != kUnwritten) delay = std::chrono::ceil<std::chrono::milliseconds>(since + timeout_ - Clock::now());
  uv_timer_start(&timer_, &RequestTimer::on_timer, ms_of(std::max(delay, std::chrono::milliseconds(1))), 0);
}

// Overdue at a first look, the requests get one more turn of the loop,
// which reads after its timers: an answer that came while the process was
// starved (the timer late) is taken in before the server is blamed.
void RequestTimer::on_timer(uv_timer_t* t) {
  auto* self = static_cast<RequestTimer*>(t->data);
  if (self->closed_) return;
  const bool overdue = self->is_overdue();
  if (overdue && !self->second_look_) {
    self->second_look_ = true;
    uv_timer_start(&self->timer_, &RequestTimer::on_timer, 1, 0);
    return;
  }
  self->second_look_ = false;
  if (overdue) self->requests_.overdue();
  if (!self->closed_ && !active(self->timer_)) self->arm(self->requests_.unanswered_since());
}

}  // namespace lockwatch::detail
