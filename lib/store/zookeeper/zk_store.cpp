#include "store/zookeeper/zk_store.hpp"

#include <algorithm>

#include "core/loop.hpp"
#include "store/zookeeper/zk_nodes.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

ZkStore::ZkStore(Loop& loop, ZkTarget target, const StoreSettings& settings)
    : StoreBase(every_kind(KeyRules{.prefix = settings.key_prefix,
                                    .max_name = zk::kMaxNameBytes,
                                    .too_long = "the lock name (key_prefix + key) is longer than the 255 bytes a "
                                                "ZooKeeper lock name takes"})),
      settings_(settings),
      sessions_(loop, target, settings_.connection, events_),
      release_(sessions_, settings_, events_),
      recipe_(sessions_, release_, settings_.watchdog, settings_.owner_name),
      renewal_(sessions_, release_, settings_.watchdog),
      claims_(sessions_),
      tools_(sessions_, release_, *this),
      loop_(loop) {
  offer({.job_claims = &claims_, .operator_tools = &tools_, .lock_listing = &tools_, .fair_queue = &release_});
}

void ZkStore::started() {
  uv_timer_init(loop_.uv(), &sweep_);
  sweep_.data = this;
  auto every = std::clamp(std::min(settings_.connection.command_timeout, settings_.connection.connect_timeout) / 20,
                          milliseconds(5), milliseconds(50));
  uv_timer_start(&sweep_, on_sweep, every.count(), every.count());
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

// Every request still waiting is answered (unavailable), once; releases
// waiting out their sessions' expiry are answered; then the handles close
// (on the closer's thread) and the timers.
void ZkStore::close() {
  if (sessions_.closed()) return;
  sessions_.stop_requests();
  release_.close();
  sessions_.close();
  // The sweep runs from start() on; closing a timer stops it.
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&sweep_)))
    uv_close(reinterpret_cast<uv_handle_t*>(&sweep_), nullptr);
}

}  // namespace lockwatch::detail
