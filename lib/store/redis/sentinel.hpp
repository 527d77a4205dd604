// lib/store/redis/sentinel.hpp: follows a master through Redis Sentinel.
//
// Asks every sentinel for the master's address (SENTINEL
// get-master-addr-by-name) at start and whenever refresh() is called (the
// node store calls it when its command connection drops), and listens on
// every sentinel for +switch-master. An address that a majority of the
// sentinels give is used at once; without a majority, the most given one
// once every sentinel answered. Either way the node store's connections
// confirm with ROLE that it is a master before they use it, so a lagging
// sentinel cannot point them back at a demoted node for long.
//
// Threading: loop thread only.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockwatch/options.hpp"
#include "store/redis/connection.hpp"
#include "store/redis/topology.hpp"

namespace lockwatch::detail {

class SentinelWatcher {
 public:
  // `user` and `password`: the sentinels' own credentials (the URL's
  // sentinel_user and sentinel_password); empty: none (no AUTH).
  SentinelWatcher(Loop& loop, const Topology& topology, const StoreSettings& settings, const std::string& user = {},
                  const std::string& password = {});
  // Where each address learned goes (set before start()).
  void on_master(std::function<void(const Endpoint&)> fn) { on_master_ = std::move(fn); }
  void start();
  void refresh();
  void close();

 private:
  void learned(const std::string& host, int port);
  void answered(std::string host, int port);

  struct Sentinel {
    std::unique_ptr<RedisConnection> query;
    std::unique_ptr<RedisConnection> events;
  };
  std::string master_name_;
  std::vector<Sentinel> sentinels_;
  std::function<void(const Endpoint&)> on_master_;
  // The refresh in flight (while answers are awaited): answers so far, by
  // address.
  std::size_t unanswered_ = 0;
  bool decided_ = false;
  std::map<std::pair<std::string, int>, std::size_t> votes_;
};

}  // namespace lockwatch::detail
