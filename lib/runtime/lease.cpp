#include "lockwatch/lease.hpp"

#include <array>
#include <cstdint>
#include <mutex>

#include <fmt/format.h>

#include "runtime/lease_record.hpp"
#include "runtime/lock_set.hpp"

namespace lockwatch {

Lease::Lease(std::string key, std::uint64_t fencing_token, std::chrono::milliseconds ttl, Clock::time_point deadline)
    : key_(std::move(key)), fencing_token_(fencing_token), ttl_(ttl), deadline_ns_(deadline.time_since_epoch().count()) {}

std::chrono::milliseconds Lease::remaining() const noexcept {
  if (set_) return static_cast<const detail::SetRecord*>(this)->least_remaining();
  if (lost()) return std::chrono::milliseconds(0);
  auto left = Clock::duration(deadline_ns_.load(std::memory_order_acquire)) - Clock::now().time_since_epoch();
  if (left <= Clock::duration::zero()) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(left);
}

std::span<const std::string> Lease::keys() const noexcept {
  if (set_) return static_cast<const detail::SetRecord*>(this)->set_keys();
  return {&key_, 1};
}

std::uint64_t Lease::fencing_token(std::string_view key) const {
  if (set_) return static_cast<const detail::SetRecord*>(this)->token_of(key);
  if (key != key_) throw InvalidArgument(fmt::format("the lease of '{}' does not hold '{}'", key_, key));
  return fencing_token_;
}

std::uint64_t Lease::renewals() const noexcept {
  if (set_) return static_cast<const detail::SetRecord*>(this)->least_renewals();
  return renewals_.load(std::memory_order_acquire);  // bump_renewals(): the deadline is set before
}

std::optional<LostReason> Lease::lost_reason() const noexcept {
  int r = lost_reason_.load(std::memory_order_acquire);
  if (r < 0) return std::nullopt;
  return static_cast<LostReason>(r);
}

namespace {
// Guards the lazily made stop state of the leases that hash here.
std::mutex& stop_lock(const void* lease) noexcept {
  static std::array<std::mutex, 64> locks;
  return locks[(reinterpret_cast<std::uintptr_t>(lease) >> 6) % locks.size()];
}
}  // namespace

std::stop_token Lease::stop_token() const noexcept {
  std::lock_guard lk(stop_lock(this));
  if (!stop_.stop_possible()) {
    stop_ = std::stop_source();
    if (stop_requested_) stop_.request_stop();  // no callbacks yet: none run under the lock
  }
  return stop_.get_token();
}

void Lease::request_stop() noexcept {
  std::stop_source source{std::nostopstate};
  {
    std::lock_guard lk(stop_lock(this));
    stop_requested_ = true;
    source = stop_;
  }
  source.request_stop();  // callbacks run outside the lock: they may ask for a token
}

bool Lease::mark_lost(LostReason reason) noexcept {
  std::int8_t expected = -1;
  return lost_reason_.compare_exchange_strong(expected, static_cast<std::int8_t>(reason), std::memory_order_acq_rel);
}

bool LeaseWatch::cancel() noexcept {
  if (!watcher_ || !watcher_->claim()) return false;
  // Never called now: what it keeps goes at once (it may keep its owner,
  // which keeps this watch).
  watcher_->handler = nullptr;
  return true;
}

LeaseWatch Lease::on_lost(std::function<void(std::optional<LostReason>)> handler) const {
  if (!handler) throw InvalidArgument("Lease::on_lost() needs a handler");
  auto w = std::make_shared<detail::LeaseWatcher>(std::move(handler));
  if (set_) {
    const_cast<detail::SetRecord*>(static_cast<const detail::SetRecord*>(this))->watch(w);
    return LeaseWatch(w);
  }
  // Every Lease is a lease record (its constructor is protected, and the
  // record is the one class made from it).
  const_cast<detail::LeaseRecord*>(static_cast<const detail::LeaseRecord*>(this))->watch(w);
  return LeaseWatch(w);
}

namespace detail {

namespace {
void tell(const std::weak_ptr<ThreadPool>& notifier, const std::shared_ptr<LeaseWatcher>& w,
          std::optional<LostReason> reason) noexcept {
  if (!w->claim()) return;  // cancelled
  post_completion(notifier, [w, reason] { w->handler(reason); });
}
}  // namespace

void LeaseRecord::watch(const std::shared_ptr<LeaseWatcher>& w) {
  {
    std::lock_guard lk(stop_lock(this));
    // lost() is published before the watchers are taken (end_watchers), so
    // a lease lost meanwhile is seen here or tells this watcher there.
    if (!watch_ended_ && !lost()) {
      auto& watchers = rare().watchers;
      std::erase_if(watchers, [](const auto& x) { return x->done.load(std::memory_order_relaxed); });
      watchers.push_back(w);
      return;
    }
  }
  tell(notifier(), w, lost_reason());
}

void LeaseRecord::end_watchers(std::optional<LostReason> reason) noexcept {
  std::vector<std::shared_ptr<LeaseWatcher>> ws;
  {
    std::lock_guard lk(stop_lock(this));
    watch_ended_ = true;
    if (Rare* r = rare_.load(std::memory_order_acquire)) ws = std::move(r->watchers);
  }
  for (auto& w : ws) tell(notifier(), w, reason);
}

void LeaseRecord::complete_call() noexcept {
  if (call_completed) return;
  call_completed = true;
  end_watchers(std::nullopt);  // ended held (a lost lease told them already)
  std::exception_ptr err;
  if (auto reason = lost_reason(); reason && (*reason != LostReason::kRuntimeStopped || is_handle()))
    err = std::make_exception_ptr(LeaseLost(key(), *reason, lost_detail()));
  else if (reason)
    err = std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped before the work could run"));
  if (is_handle())
    finish(err);
  else
    call->finish(err);
  if (const auto* r = rare_if(); r && r->finished) r->finished->set_value();
}

std::vector<HeldOnThread>& leases_on_this_thread() noexcept {
  thread_local std::vector<HeldOnThread> held;
  return held;
}
}  // namespace detail

const Lease* current_lease() noexcept {
  auto& held = detail::leases_on_this_thread();
  return held.empty() ? nullptr : held.back().shown;
}

const Lease& this_lease() {
  const Lease* l = current_lease();
  if (l == nullptr) throw NoActiveLease("lockwatch::this_lease() called outside a locked call");
  return *l;
}

}  // namespace lockwatch
