#include "support/redis_cluster.hpp"

#include <stdexcept>
#include <thread>

namespace lockwatch::testing {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

std::string field_of(const std::string& info, const std::string& name) {
  auto at = info.find(name + ":");
  if (at == std::string::npos) return {};
  auto end = info.find_first_of("\r\n", at);
  return info.substr(at + name.size() + 1, end == std::string::npos ? std::string::npos : end - at - name.size() - 1);
}

}  // namespace

RedisCluster::RedisCluster(std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  for (int i = 0; i < kNodes; ++i) {
    RedisServerOptions o;
    o.extra_args = {"--cluster-enabled", "yes", "--cluster-node-timeout", "1000", "--cluster-config-file",
                    "nodes.conf", "--cluster-port", std::to_string(free_loopback_port()),
                    "--repl-diskless-sync-delay", "0"};
    nodes_.push_back(std::make_unique<RedisServer>(o));
  }
  std::vector<std::string> argv{"redis-cli", "--cluster", "create"};
  for (const auto& n : nodes_) argv.push_back(n->host() + ":" + std::to_string(n->port()));
  argv.insert(argv.end(), {"--cluster-replicas", "1", "--cluster-yes"});
  ChildProcess create(argv);
  std::string output;
  while (auto line = create.read_line(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())))
    output += *line + "\n";
  int status = create.wait(std::chrono::duration_cast<std::chrono::milliseconds>(
      std::max<Clock::duration>(deadline - Clock::now(), 1s)));
  if (status != 0) throw std::runtime_error("redis-cli --cluster create failed (" + std::to_string(status) + "):\n" + output);
  std::string wrong =
      wait_healthy(std::chrono::duration_cast<std::chrono::milliseconds>(std::max<Clock::duration>(deadline - Clock::now(), 0s)));
  if (!wrong.empty()) throw std::runtime_error("the cluster did not become healthy: " + wrong);
}

RedisCluster::~RedisCluster() = default;

std::string RedisCluster::url() const {
  return "redis-cluster://127.0.0.1:" + std::to_string(nodes_[0]->port()) + ",127.0.0.1:" +
         std::to_string(nodes_[1]->port());
}

std::string RedisCluster::problem() const {
  int replicas = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = *nodes_[i];
    if (!n.running()) continue;
    const std::string who = "node " + std::to_string(i) + " (" + std::to_string(n.port()) + ")";
    auto info = n.command({"CLUSTER", "INFO"});
    if (field_of(info.str, "cluster_state") != "ok") return who + ": cluster_state is not ok";
    auto repl = n.command({"INFO", "replication"});
    if (field_of(repl.str, "role") == "slave") {
      replicas++;
      if (field_of(repl.str, "master_link_status") != "up") return who + ": master_link_status is not up";
    }
    auto nodes = n.command({"CLUSTER", "NODES"});
    int listed = 0;
    for (std::size_t at = 0; (at = nodes.str.find(" slave ", at)) != std::string::npos; ++at) listed++;
    for (std::size_t at = 0; (at = nodes.str.find(",slave ", at)) != std::string::npos; ++at) listed++;
    if (listed < 3) return who + ": CLUSTER NODES lists " + std::to_string(listed) + " replicas";
  }
  if (replicas < 3) return std::to_string(replicas) + " replicas running";
  return {};
}

std::string RedisCluster::wait_healthy(std::chrono::milliseconds bound) const {
  const auto deadline = Clock::now() + bound;
  for (;;) {
    std::string wrong;
    try {
      wrong = problem();
    } catch (const std::exception& e) {
      wrong = e.what();
    }
    if (wrong.empty() || Clock::now() >= deadline) return wrong;
    // Nothing signals "the cluster is healthy": polling its state is the only way.
    std::this_thread::sleep_for(50ms);
  }
}

int RedisCluster::master_of_slot(int slot) const {
  auto slots = nodes_[0]->command({"CLUSTER", "SLOTS"});
  for (const auto& range : slots.elements) {
    if (range.elements.size() < 3) continue;
    if (slot < range.elements[0].integer || slot > range.elements[1].integer) continue;
    long long port = range.elements[2].elements.at(1).integer;
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i]->port() == port) return static_cast<int>(i);
  }
  return -1;
}

Reply RedisCluster::command_for(const std::string& key, const std::vector<std::string>& args) const {
  auto slot = nodes_[0]->command({"CLUSTER", "KEYSLOT", key});
  int m = master_of_slot(static_cast<int>(slot.integer));
  if (m < 0) throw std::runtime_error("no master serves the slot of " + key);
  return nodes_[static_cast<std::size_t>(m)]->command(args);
}

std::vector<int> RedisCluster::masters() const {
  std::vector<int> out;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i]->running()) continue;
    auto role = nodes_[i]->command({"ROLE"});
    if (!role.elements.empty() && role.elements[0].str == "master") out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<int> RedisCluster::replicas() const {
  std::vector<int> out;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i]->running()) continue;
    auto role = nodes_[i]->command({"ROLE"});
    if (!role.elements.empty() && role.elements[0].str == "slave") out.push_back(static_cast<int>(i));
  }
  return out;
}

}  // namespace lockwatch::testing
