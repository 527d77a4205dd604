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
// It can also move a slot from one master to another as
// `redis-cli --cluster reshard` does (IMPORTING / MIGRATING, MIGRATE of
// the keys, SETSLOT NODE on every master), all at once or step by step, to
// stage MOVED, ASK and TRYAGAIN.
//
// Threading: drive it from one thread. Costs: about 2-4 s to start.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "support/redis_server.hpp"

namespace lockwatch::testing {

struct RedisClusterOptions {
  // Empty: no authentication. Otherwise every node's requirepass and
  // masterauth, and url() carries it.
  std::string password;
  // Every node's port speaks TLS (RedisServerOptions::tls, CA:
  // test_certificates().ca_cert), and so do the cluster bus and
  // replication (--tls-cluster, --tls-replication); url() is then
  // rediss-cluster://. Each node keeps its plaintext port on loopback for
  // command() only.
  bool tls = false;
};

class RedisCluster {
 public:
  // Throws std::runtime_error (with what failed) when the cluster does not
  // form within `bound`.
  explicit RedisCluster(RedisClusterOptions options = {}, std::chrono::milliseconds bound = std::chrono::seconds(30));
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  static constexpr int kNodes = 6;

  // redis-cluster://[:password@]127.0.0.1:P1,127.0.0.1:P2 (two of the
  // nodes as seeds); rediss-cluster:// with TLS.
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
  // Indexes of the replicas of master `m` (per `m`'s own CLUSTER NODES).
  std::vector<int> replicas_of(int m) const;
  // Node i's cluster id (CLUSTER MYID).
  std::string id_of(int i) const;

  // Moving a slot. Each throws std::runtime_error when a node refuses.
  // Marks `slot` importing on master `to` and migrating on its owner now,
  // and returns the owner's index: from then on the owner answers ASK for
  // keys it no longer has, and TRYAGAIN for a command whose keys are split.
  int begin_migration(int slot, int to);
  // MIGRATEs `keys` (all of one slot) from node `from` to node `to`.
  void migrate(int from, int to, const std::vector<std::string>& keys);
  // Migrates what keys of `slot` are left on `from`, then gives the slot to
  // `to` on `to`, on `from` and on every other master: from then on the
  // others answer MOVED.
  void finish_migration(int slot, int from, int to);
  // All of it: `slot` and its keys belong to master `to` (nothing happens
  // when it does already).
  void move_slot(int slot, int to);

  // Waits (bounded) until the cluster is healthy as described above; returns
  // what is still wrong, or empty.
  std::string wait_healthy(std::chrono::milliseconds bound) const;

 private:
  std::string problem() const;
  // The master of `slot` per node `asked`'s CLUSTER SLOTS (-1: none).
  int slot_owner(int slot, int asked) const;
  RedisClusterOptions options_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace lockwatch::testing
