#include "sentinel.hpp"

#include <charconv>

#include "lockwatch/errors.hpp"
#include "loop.hpp"

namespace lockwatch::detail {

SentinelWatcher::SentinelWatcher(Loop& loop, const Topology& topology, const Options& options,
                                 std::function<void(const Endpoint&)> on_master)
    : master_name_(topology.master_name), on_master_(std::move(on_master)) {
  for (const auto& s : topology.sentinels) {
    Endpoint ep = s;
    ep.db = 0;
    if (!options.sentinel_password.empty()) {
      ep.user = options.sentinel_user;
      ep.password = options.sentinel_password;
    }
    Sentinel sen;
    sen.query = std::make_unique<RedisConnection>(loop, ep, options, false);
    RedisConnection::Hooks hooks;
    hooks.on_connect_command = {"SUBSCRIBE", "+switch-master"};
    hooks.on_message = [this](std::string_view kind, std::string_view channel, std::string_view payload) {
      if (kind != "message" || channel != "+switch-master") return;
      // "<name> <old-ip> <old-port> <new-ip> <new-port>"
      std::vector<std::string_view> parts;
      std::size_t start = 0;
      while (start <= payload.size()) {
        auto sp = payload.find(' ', start);
        parts.push_back(payload.substr(start, sp == std::string_view::npos ? std::string_view::npos : sp - start));
        if (sp == std::string_view::npos) break;
        start = sp + 1;
      }
      if (parts.size() != 5 || parts[0] != master_name_) return;
      int port = 0;
      std::from_chars(parts[4].data(), parts[4].data() + parts[4].size(), port);
      learned(std::string(parts[3]), port);
    };
    sen.events = std::make_unique<RedisConnection>(loop, ep, options, true, std::move(hooks));
    sentinels_.push_back(std::move(sen));
  }
}

void SentinelWatcher::start() {
  for (auto& s : sentinels_) {
    s.query->start();
    s.events->start();
  }
  refresh();
}

void SentinelWatcher::refresh() {
  if (refreshing_) return;
  refreshing_ = true;
  auto pending = std::make_shared<std::size_t>(sentinels_.size());
  for (auto& s : sentinels_) {
    s.query->command({"SENTINEL", "get-master-addr-by-name", master_name_},
                     [this, pending](const redisReply* r, std::exception_ptr err) {
                       if (--*pending == 0) refreshing_ = false;
                       if (err || r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return;
                       const redisReply* host = r->element[0];
                       const redisReply* port = r->element[1];
                       if (host->type != REDIS_REPLY_STRING || port->type != REDIS_REPLY_STRING) return;
                       int p = 0;
                       std::from_chars(port->str, port->str + port->len, p);
                       learned(std::string(host->str, host->len), p);
                     });
  }
}

void SentinelWatcher::learned(const std::string& host, int port) {
  if (host.empty() || port <= 0 || port > 65535) return;
  Endpoint ep;
  ep.host = host;
  ep.port = port;
  on_master_(ep);
}

void SentinelWatcher::close() {
  for (auto& s : sentinels_) {
    s.query->close();
    s.events->close();
  }
}

bool SentinelWatcher::closed() const {
  for (const auto& s : sentinels_)
    if (!s.query->closed() || !s.events->closed()) return false;
  return true;
}

}  // namespace lockwatch::detail
