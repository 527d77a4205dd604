// lockwatch::mutex (lockwatch/mutex.hpp): a LockHandle behind the standard
// Lockable calls.
#include "lockwatch/mutex.hpp"

#include <algorithm>

namespace lockwatch {

using std::chrono::milliseconds;

mutex::mutex(Runtime& runtime, std::string key, milliseconds ttl, Retries retries)
    : runtime_(runtime), key_(std::move(key)), ttl_(ttl), retries_(retries) {
  if (key_.empty()) throw InvalidArgument("lockwatch::mutex: the key is empty");
  if (ttl_ <= milliseconds(0)) throw InvalidArgument("lockwatch::mutex: the ttl must be positive");
}

mutex::~mutex() { unlock(); }

bool mutex::try_lock_wait(milliseconds wait) {
  wait = std::clamp(wait, milliseconds(0), max_wait);
  LockHandle h;
  try {
    // The runtime answers within the wait (and the command timeout), or
    // fails it when it stops. try_lock() on one Redis node asks on this
    // thread (Runtime::lock).
    h = runtime_.lock({.key = key_, .ttl = ttl_, .retries = retries_, .wait = wait});
  } catch (const LockNotAcquired&) {
    return false;
  }
  std::lock_guard lk(mu_);
  // Another holder of this object is there only if its lease was lost
  // meanwhile (the store gave the key to us): its handle is dropped.
  held_ = std::move(h);
  return true;
}

void mutex::lock() {
  // A wait of max_wait (7 days) at a time, for as long as it takes.
  while (!try_lock_wait(max_wait)) {
  }
}

bool mutex::try_lock() { return try_lock_wait(milliseconds(0)); }

void mutex::unlock() noexcept {
  LockHandle h;
  {
    std::lock_guard lk(mu_);
    h = std::move(held_);
  }
  // Dropping the handle releases it without waiting.
}

const Lease& mutex::lease() const {
  std::lock_guard lk(mu_);
  if (!held_) throw NoActiveLease("lockwatch::mutex::lease(): '" + key_ + "' is not locked");
  return held_.lease();
}

bool mutex::locked() const noexcept {
  std::lock_guard lk(mu_);
  return static_cast<bool>(held_);
}

}  // namespace lockwatch
