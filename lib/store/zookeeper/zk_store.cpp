#include "store/zookeeper/zk_store.hpp"

#include <algorithm>

#include "core/loop.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

void ZkStore::check_options(const ZkTarget&, const Options& options) {
  if (options.runtime.key_prefix.size() >= kMaxNameBytes)
    throw InvalidArgument("Options::runtime.key_prefix leaves no room for a key in a ZooKeeper lock name (255 bytes)");
}

ZkStore::ZkStore(Loop& loop, ZkTarget target, const StoreSettings& settings)
    : StoreBase(StoreTraits{
          .keys = KeyRules{.prefix = settings.key_prefix,
                           .max_name = kMaxNameBytes,
                           .too_long = "the lock name (key_prefix + key) is longer than the 255 bytes a ZooKeeper "
                                       "lock name takes"},
          .release_events = true,
          .no_shared = nullptr,
          .no_permits = nullptr}),
      settings_(settings),
      sessions_(loop, target, settings_.connection, events_),
      release_(loop, sessions_, settings_, events_),
      recipe_(sessions_, release_, settings_.watchdog, settings_.owner_name),
      renewal_(sessions_, release_, settings_.watchdog),
      claims_(sessions_),
      tools_(sessions_, release_, settings_.key_prefix.size()),
      loop_(loop) {
  offer({.job_claims = this, .operator_tools = this, .lock_listing = this, .fair_queue = this});
}

ZkStore::~ZkStore() = default;

void ZkStore::started() {
  uv_timer_init(loop_.uv(), &sweep_);
  sweep_.data = this;
  auto every = std::clamp(std::min(settings_.connection.command_timeout, settings_.connection.connect_timeout) / 20,
                          milliseconds(5), milliseconds(50));
  uv_timer_start(&sweep_, on_sweep, every.count(), every.count());
  release_.start();
  started_ = true;
}

// The parts' timeouts, in this order: locks the store expires itself,
// releases due an answer, requests past their bound.
void ZkStore::on_sweep(uv_timer_t* t) {
  auto* self = static_cast<ZkStore*>(t->data);
  const auto now = std::chrono::steady_clock::now();
  self->renewal_.expire_held(now);
  self->release_.tick(now);
  self->sessions_.time_out(now);
}

void ZkStore::acquire(std::span<const LockRef> locks, AcquireDone done) { recipe_.acquire(locks, std::move(done)); }

std::size_t ZkStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) {
  return renewal_.renew(locks, std::move(keepalive), std::move(done));
}

// Every release wakes the holder's watchers (no quiet delete): `notify`
// changes nothing.
void ZkStore::release(std::span<const LockRef> locks, bool, ReleaseDone done) {
  release_.release(locks, std::move(done));
}

void ZkStore::withdraw(const LockRef& lock, WithdrawDone done) { release_.withdraw(lock, std::move(done)); }

void ZkStore::subscribe(std::string_view name) { sessions_.subscribe(name); }

void ZkStore::unsubscribe(std::string_view name) { sessions_.unsubscribe(name); }

void ZkStore::server_time(TimeDone done) { claims_.server_time(std::move(done)); }

void ZkStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                           std::chrono::system_clock::time_point start, ClaimDone done) {
  claims_.claim_period(name, token, period, start, std::move(done));
}

void ZkStore::inspect(std::string_view name, InspectDone done) { tools_.inspect(name, std::move(done)); }

void ZkStore::force_release(std::string_view name, ForceDone done) { tools_.force_release(name, std::move(done)); }

void ZkStore::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  tools_.list_locks(encode(prefix), limit, std::move(done));
}

// Every request still waiting is answered (unavailable), once; releases
// waiting out their sessions' expiry are answered; then the handles close
// (on the closer's thread) and the timers.
void ZkStore::close() {
  if (sessions_.closed()) return;
  sessions_.stop_requests();
  release_.close();
  sessions_.close();
  if (started_) {
    uv_timer_stop(&sweep_);
    uv_close(reinterpret_cast<uv_handle_t*>(&sweep_), nullptr);
    started_ = false;
  }
}

}  // namespace lockwatch::detail
