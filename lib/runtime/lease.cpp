#include "lockwatch/lease.hpp"

#include "runtime/lease_record.hpp"

namespace lockwatch {

Lease::Lease(std::string key, std::uint64_t fencing_token, std::chrono::milliseconds ttl, Clock::time_point deadline)
    : key_(std::move(key)), fencing_token_(fencing_token), ttl_(ttl), deadline_ns_(deadline.time_since_epoch().count()) {}

std::chrono::milliseconds Lease::remaining() const noexcept {
  if (lost()) return std::chrono::milliseconds(0);
  auto left = Clock::duration(deadline_ns_.load(std::memory_order_acquire)) - Clock::now().time_since_epoch();
  if (left <= Clock::duration::zero()) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(left);
}

std::optional<LostReason> Lease::lost_reason() const noexcept {
  int r = lost_reason_.load(std::memory_order_acquire);
  if (r < 0) return std::nullopt;
  return static_cast<LostReason>(r);
}

bool Lease::mark_lost(LostReason reason) noexcept {
  int expected = -1;
  if (!lost_reason_.compare_exchange_strong(expected, static_cast<int>(reason), std::memory_order_acq_rel)) return false;
  lost_.store(true, std::memory_order_release);
  return true;
}

namespace detail {
std::vector<HeldOnThread>& leases_on_this_thread() noexcept {
  thread_local std::vector<HeldOnThread> held;
  return held;
}
}  // namespace detail

const Lease* current_lease() noexcept {
  auto& held = detail::leases_on_this_thread();
  return held.empty() ? nullptr : held.back().lease;
}

const Lease& this_lease() {
  const Lease* l = current_lease();
  if (l == nullptr) throw NoActiveLease("lockwatch::this_lease() called outside a locked call");
  return *l;
}

}  // namespace lockwatch
