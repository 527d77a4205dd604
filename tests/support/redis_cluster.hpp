// tests/support/redis_cluster.hpp: a real Redis Cluster for tests.
//
// Six redis-server processes on loopback (each a RedisServer with
// --cluster-enabled yes, node timeout 1 s, its own nodes.conf in its own
// directory, its cluster bus on a port of its own), joined by
// `redis-cli --cluster create ... --cluster-replicas 1`: three masters, one
// replica each. The constructor returns once the cluster is usable: every
// node says cluster_state:ok, every replica's link to its master is up, and
// every node's CLUSTER NODES lists all three replicas (gossip lags).
//
// Threading: drive it from one thread. Costs: about 2-4 s to start.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "support/redis_server.hpp"

namespace lockwatch::testing {

class RedisCluster {
 public:
  // Throws std::runtime_error (with what failed) when the cluster does not
  // form within `bound`.
  explicit RedisCluster(std::chrono::milliseconds bound = std::chrono::seconds(30));
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  static constexpr int kNodes = 6;

  // redis-cluster://127.0.0.1:P1,127.0.0.1:P2 (two of the nodes as seeds).
  std::string url() const;
  RedisServer& node(int i) { return *nodes_.at(static_cast<std::size_t>(i)); }
  const RedisServer& node(int i) const { return *nodes_.at(static_cast<std::size_t>(i)); }

  // Runs `args` on the master that serves `key`'s slot now (asked of the
  // cluster, following MOVED).
  Reply command_for(const std::string& key, const std::vector<std::string>& args) const;
  // The index of the node that is master of `slot` now, per node 0's view
  // (-1 if none).
  int master_of_slot(int slot) const;
  // Indexes of the nodes whose ROLE is master / slave now.
  std::vector<int> masters() const;
  std::vector<int> replicas() const;

  // Waits (bounded) until the cluster is healthy as described above; returns
  // what is still wrong, or empty.
  std::string wait_healthy(std::chrono::milliseconds bound) const;

 private:
  std::string problem() const;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace lockwatch::testing
