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

RedisCluster::RedisCluster(RedisClusterOptions options, std::chrono::milliseconds bound)
    : options_(std::move(options)) {
  const auto deadline = Clock::now() + bound;
  for (int i = 0; i < kNodes; ++i) {
    RedisServerOptions o;
    o.password = options_.password;
    o.extra_args = {"--cluster-enabled", "yes", "--cluster-node-timeout", "1000", "--cluster-config-file",
                    "nodes.conf", "--cluster-port", std::to_string(free_loopback_port()),
                    "--repl-diskless-sync-delay", "0"};
    if (!options_.password.empty()) o.extra_args.insert(o.extra_args.end(), {"--masterauth", options_.password});
    if (options_.tls) {
      o.tls = RedisTls{};
      o.extra_args.insert(o.extra_args.end(), {"--tls-cluster", "yes", "--tls-replication", "yes"});
    }
    nodes_.push_back(std::make_unique<RedisServer>(o));
  }
  std::vector<std::string> argv{"redis-cli"};
  if (options_.tls) argv.insert(argv.end(), {"--tls", "--cacert", test_certificates().ca_cert});
  argv.insert(argv.end(), {"--cluster", "create"});
  for (const auto& n : nodes_) argv.push_back(n->host() + ":" + std::to_string(n->port()));
  argv.insert(argv.end(), {"--cluster-replicas", "1", "--cluster-yes"});
  std::vector<std::string> env;
  // REDISCLI_AUTH rather than -a: no password on a command line.
  if (!options_.password.empty()) env.push_back("REDISCLI_AUTH=" + options_.password);
  ChildProcess create(argv, env);
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
  std::string cred = options_.password.empty() ? "" : ":" + options_.password + "@";
  return std::string(options_.tls ? "rediss-cluster://" : "redis-cluster://") + cred + "127.0.0.1:" + std::to_string(nodes_[0]->port()) + ",127.0.0.1:" +
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

int RedisCluster::master_of_slot(int slot) const { return slot_owner(slot, 0); }

int RedisCluster::slot_owner(int slot, int asked) const {
  auto slots = nodes_.at(static_cast<std::size_t>(asked))->command({"CLUSTER", "SLOTS"});
  for (const auto& range : slots.elements) {
    if (range.elements.size() < 3) continue;
    if (slot < range.elements[0].integer || slot > range.elements[1].integer) continue;
    // Asked through command(), a TLS node names the plaintext ports.
    long long port = range.elements[2].elements.at(1).integer;
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i]->command_port() == port) return static_cast<int>(i);
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

std::vector<int> RedisCluster::replicas_of(int m) const {
  // CLUSTER NODES lines: <id> <ip:port@cport> <flags> <master id> ...
  const std::string id = id_of(m);
  auto nodes = node(m).command({"CLUSTER", "NODES"});
  std::vector<int> out;
  std::size_t at = 0;
  while (at < nodes.str.size()) {
    std::size_t end = nodes.str.find('\n', at);
    std::string line = nodes.str.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? nodes.str.size() : end + 1;
    std::vector<std::string> f;
    for (std::size_t b = 0, e; b < line.size(); b = e + 1) {
      e = line.find(' ', b);
      if (e == std::string::npos) e = line.size();
      f.push_back(line.substr(b, e - b));
    }
    if (f.size() < 4 || f[3] != id || f[2].find("slave") == std::string::npos) continue;
    std::string port = f[1].substr(f[1].rfind(':') + 1);
    port = port.substr(0, port.find('@'));
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (std::to_string(nodes_[i]->command_port()) == port) out.push_back(static_cast<int>(i));
  }
  return out;
}

std::string RedisCluster::id_of(int i) const {
  auto r = node(i).command({"CLUSTER", "MYID"});
  if (r.type != Reply::Type::kString) throw std::runtime_error("CLUSTER MYID on node " + std::to_string(i) + ": " + r.str);
  return r.str;
}

namespace {

void expect_ok(const Reply& r, const std::string& what) {
  if (r.type != Reply::Type::kStatus) throw std::runtime_error(what + ": " + r.str);
}

}  // namespace

int RedisCluster::begin_migration(int slot, int to) {
  auto ms = masters();
  if (ms.empty()) throw std::runtime_error("no master runs");
  const int from = slot_owner(slot, ms.front());
  if (from < 0) throw std::runtime_error("no master serves slot " + std::to_string(slot));
  const std::string s = std::to_string(slot);
  // The importing side first, so that no ASK points at a node that would refuse it.
  expect_ok(node(to).command({"CLUSTER", "SETSLOT", s, "IMPORTING", id_of(from)}), "SETSLOT IMPORTING");
  expect_ok(node(from).command({"CLUSTER", "SETSLOT", s, "MIGRATING", id_of(to)}), "SETSLOT MIGRATING");
  return from;
}

void RedisCluster::migrate(int from, int to, const std::vector<std::string>& keys) {
  if (keys.empty()) return;
  std::vector<std::string> args{"MIGRATE", node(to).host(), std::to_string(node(to).port()), "", "0", "5000"};
  if (!options_.password.empty()) args.insert(args.end(), {"AUTH", options_.password});
  args.emplace_back("KEYS");
  args.insert(args.end(), keys.begin(), keys.end());
  auto r = node(from).command(args);
  // NOKEY: none of them was there (they moved already, or never existed).
  if (r.type != Reply::Type::kStatus) throw std::runtime_error("MIGRATE: " + r.str);
}

void RedisCluster::finish_migration(int slot, int from, int to) {
  const std::string s = std::to_string(slot);
  for (;;) {
    auto keys = node(from).command({"CLUSTER", "GETKEYSINSLOT", s, "100"});
    if (keys.type != Reply::Type::kArray) throw std::runtime_error("CLUSTER GETKEYSINSLOT: " + keys.str);
    if (keys.elements.empty()) break;
    std::vector<std::string> names;
    for (const auto& k : keys.elements) names.push_back(k.str);
    migrate(from, to, names);
  }
  const std::string id = id_of(to);
  // The new owner first, then the old one, then the other masters (as
  // redis-cli --cluster reshard does), so that no master points elsewhere.
  expect_ok(node(to).command({"CLUSTER", "SETSLOT", s, "NODE", id}), "SETSLOT NODE on the target");
  expect_ok(node(from).command({"CLUSTER", "SETSLOT", s, "NODE", id}), "SETSLOT NODE on the source");
  for (int m : masters())
    if (m != to && m != from) expect_ok(node(m).command({"CLUSTER", "SETSLOT", s, "NODE", id}), "SETSLOT NODE");
}

void RedisCluster::move_slot(int slot, int to) {
  auto ms = masters();
  if (ms.empty()) throw std::runtime_error("no master runs");
  if (slot_owner(slot, ms.front()) == to) return;
  const int from = begin_migration(slot, to);
  finish_migration(slot, from, to);
}

}  // namespace lockwatch::testing
