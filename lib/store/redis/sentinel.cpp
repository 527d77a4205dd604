#include "store/redis/sentinel.hpp"

#include <algorithm>
#include <charconv>
#include <ranges>

namespace lockwatch::detail {

SentinelWatcher::SentinelWatcher(Loop& loop, const Topology& topology, const StoreSettings& settings,
                                 const std::string& user, const std::string& password)
    : master_name_(topology.master_name) {
  for (const auto& s : topology.sentinels) {
    // The URL's sentinels have no credentials and no db (Topology::parse).
    Endpoint ep = s;
    ep.user = user;
    ep.password = password;
    Sentinel& sen = sentinels_.emplace_back();
    RedisConnection::Hooks hooks;
    hooks.named = false;
    sen.query = std::make_unique<RedisConnection>(loop, ep, settings, RedisConnection::Mode::kCommands, hooks);
    hooks.on_connect_command = {"SUBSCRIBE", "+switch-master"};
    hooks.on_message = [this](std::string_view kind, std::string_view channel, std::string_view payload) {
      if (kind != "message" || channel != "+switch-master") return;
      // "<name> <old-ip> <old-port> <new-ip> <new-port>"
      std::vector<std::string_view> parts;
      for (const auto part : std::views::split(payload, ' ')) parts.emplace_back(part.begin(), part.end());
      if (parts.size() != 5 || parts[0] != master_name_) return;
      int port = 0;
      std::from_chars(parts[4].data(), parts[4].data() + parts[4].size(), port);
      learned(std::string(parts[3]), port);
    };
    sen.events =
        std::make_unique<RedisConnection>(loop, ep, settings, RedisConnection::Mode::kPubSub, std::move(hooks));
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
  if (unanswered_ > 0) return;
  unanswered_ = sentinels_.size();
  decided_ = false;
  votes_.clear();
  for (auto& s : sentinels_) {
    s.query->command({"SENTINEL", "get-master-addr-by-name", master_name_},
                     [this](const redisReply* r, const StoreError* err) {
                       const bool named = !err && is_array_of(r, 2) && is_string(r->element[0]) &&
                                          is_string(r->element[1]);
                       answered(named ? std::string(text_of(r->element[0])) : std::string(),
                                named ? static_cast<int>(number_of(r->element[1])) : 0);
                     });
  }
}

void SentinelWatcher::answered(std::string host, int port) {
  unanswered_--;
  if (!host.empty() && port > 0) votes_[{std::move(host), port}]++;
  if (!decided_) {
    // A majority's answer at once; otherwise the most given one when all
    // have answered (ROLE on the node has the last word).
    auto best = std::max_element(votes_.begin(), votes_.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    if (best != votes_.end() && (best->second > sentinels_.size() / 2 || unanswered_ == 0)) {
      decided_ = true;
      learned(best->first.first, best->first.second);
    }
  }
}

void SentinelWatcher::learned(const std::string& host, int port) {
  if (host.empty() || port <= 0 || port > 65535) return;
  Endpoint ep;
  ep.host = host;
  ep.port = port;
  if (on_master_) on_master_(ep);
}

void SentinelWatcher::close() {
  for (auto& s : sentinels_) {
    s.query->close();
    s.events->close();
  }
}

}  // namespace lockwatch::detail
