// lib/sentinel.hpp: follows a master through Redis Sentinel.
//
// Asks every sentinel for the master's address (SENTINEL
// get-master-addr-by-name) at start and whenever refresh() is called (the
// runtime calls it when its master connection drops), and listens on every
// sentinel for +switch-master. Each address learned is handed to
// `on_master`, which points the runtime's connections at it. Loop thread
// only.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockwatch/options.hpp"
#include "redis_connection.hpp"

namespace lockwatch::detail {

class Loop;

class SentinelWatcher {
 public:
  SentinelWatcher(Loop& loop, const Topology& topology, const Options& options,
                  std::function<void(const Endpoint&)> on_master);
  void start();
  void refresh();
  void close();
  bool closed() const;

 private:
  void learned(const std::string& host, int port);

  struct Sentinel {
    std::unique_ptr<RedisConnection> query;
    std::unique_ptr<RedisConnection> events;
  };
  std::string master_name_;
  std::vector<Sentinel> sentinels_;
  std::function<void(const Endpoint&)> on_master_;
  bool refreshing_ = false;
};

}  // namespace lockwatch::detail
