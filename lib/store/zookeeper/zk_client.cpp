#include "store/zookeeper/zk_client.hpp"

#include <utility>

#include "core/loop.hpp"
#include "store/zookeeper/zk_session.hpp"

namespace lockwatch::detail {

void ZkSink::post(std::function<void(ZkSessions&)> f) {
  if (sessions == nullptr) return;
  loop.post([self = shared_from_this(), f = std::move(f)] {
    if (ZkSessions* s = self->sessions; s != nullptr) f(*s);
  });
}

ZkCtx* ZkSink::new_ctx(std::uint64_t id, std::uint64_t session) {
  auto* ctx = new ZkCtx{shared_from_this(), id, session, {}, {}};
  std::lock_guard lk(ctx_mu);
  in_flight.emplace(ctx, session);
  return ctx;
}

void ZkSink::release_ctx(ZkCtx* ctx) {
  {
    std::lock_guard lk(ctx_mu);
    in_flight.erase(ctx);
  }
  delete ctx;
}

void ZkSink::forget_session(std::uint64_t serial) {
  std::lock_guard lk(ctx_mu);
  std::erase_if(in_flight, [&](const auto& entry) {
    if (entry.second == serial) delete entry.first;
    return entry.second == serial;
  });
}

ZkCloser::ZkCloser(std::shared_ptr<ZkSink> sink)
    : sink_(std::move(sink)), thread_([this](std::stop_token stop) { run(stop); }) {}

void ZkCloser::close_later(zhandle_t* zh, std::unique_ptr<ZkCtx> watch_ctx) {
  if (zh == nullptr) return;
  {
    std::lock_guard lk(mu_);
    to_close_.emplace_back(zh, std::move(watch_ctx));
  }
  cv_.notify_all();
}

void ZkCloser::run(std::stop_token stop) {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, stop, [this] { return !to_close_.empty(); });
    if (to_close_.empty()) return;  // stopped, and nothing is left to close
    auto batch = std::exchange(to_close_, {});
    lk.unlock();
    for (auto& [zh, w] : batch) {
      zookeeper_close(zh);
      if (w != nullptr) sink_->forget_session(w->session);
    }
    lk.lock();
  }
}

namespace zk {

void deliver(const void* data, ZkResult r) {
  auto* ctx = static_cast<ZkCtx*>(const_cast<void*>(data));
  for (const auto& res : ctx->results) r.op_errors.push_back(res.err);
  const std::uint64_t id = ctx->id;
  auto sink = std::move(ctx->sink);
  sink->release_ctx(ctx);
  sink->post([id, r = std::move(r)](ZkSessions& s) mutable { s.complete(id, std::move(r)); });
}

void fill(ZkResult& r, const Stat* stat) {
  if (stat != nullptr) r.stat = *stat;
}

void fill(ZkResult& r, const char* path, const Stat* stat) {
  if (path != nullptr) r.value = path;
  fill(r, stat);
}

void fill(ZkResult& r, const char* value, int len, const Stat* stat) {
  if (value != nullptr && len > 0) r.value.assign(value, static_cast<std::size_t>(len));
  fill(r, stat);
}

void fill(ZkResult& r, const String_vector* strings) {
  for (int i = 0; strings != nullptr && i < strings->count; ++i) r.children.emplace_back(strings->data[i]);
}

bool unreachable(int rc) {
  return rc == kNoHandle || rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONEXPIRED ||
         rc == ZSESSIONMOVED || rc == ZCLOSING || rc == ZINVALIDSTATE || rc == ZSYSTEMERROR ||
         rc == ZMARSHALLINGERROR || rc == ZNOTHING || rc == ZNEWCONFIGNOQUORUM;
}

void on_global_watch(zhandle_t*, int type, int state, const char* path, void* context) {
  auto* w = static_cast<ZkCtx*>(context);
  if (w == nullptr) return;
  const std::uint64_t serial = w->session;
  if (type == ZOO_SESSION_EVENT) {
    return w->sink->post([serial, state](ZkSessions& s) { s.on_session_state(serial, state); });
  }
  if (path == nullptr) return;
  w->sink->post([type, p = std::string(path)](ZkSessions& s) { s.on_watch(type, p); });
}

}  // namespace zk

}  // namespace lockwatch::detail
