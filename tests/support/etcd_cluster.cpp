#include "etcd_cluster.hpp"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "redis_server.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string local(int port) { return "127.0.0.1:" + std::to_string(port); }

}  // namespace

EtcdCluster::EtcdCluster(EtcdClusterOptions options) : options_(options) {
  bin_ = find_program("etcd", "Debian's etcd-server and etcd-client packages");
  etcdctl_ = find_program("etcdctl", "Debian's etcd-server and etcd-client packages");
  dir_ = make_temp_dir("lockwatch-etcd");
  try {
    for (int attempt = 0;; ++attempt) {
      members_.clear();
      members_.resize(static_cast<std::size_t>(options_.members));
      for (int i = 0; i < options_.members; ++i) {
        members_[i].name = "m" + std::to_string(i);
        members_[i].client_port = free_loopback_port();
        members_[i].peer_port = free_loopback_port();
      }
      try {
        for (int i = 0; i < options_.members; ++i) spawn(i, /*fresh=*/true);
        wait_ready(30s);
        break;
      } catch (const std::exception&) {
        for (int i = 0; i < options_.members; ++i) kill(i);
        std::error_code ec;
        for (int i = 0; i < options_.members; ++i) fs::remove_all(dir_ + "/" + members_[i].name, ec);
        if (attempt >= 2) throw;
      }
    }
    if (options_.auth) {
      etcdctl(std::string("user add root:") + kRootPassword);
      etcdctl("role add lockwatch");
      etcdctl("role grant-permission lockwatch readwrite --prefix=true lockwatch");
      etcdctl(std::string("user add ") + kUser + ":" + kPassword);
      etcdctl(std::string("user grant-role ") + kUser + " lockwatch");
      etcdctl("auth enable");
      auth_enabled_ = true;
    }
  } catch (...) {
    for (int i = 0; i < static_cast<int>(members_.size()); ++i) kill(i);
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) kill(i);
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

int EtcdCluster::client_port(int member) const { return members_.at(member).client_port; }

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (const auto& m : members_) {
    if (!out.empty()) out += ',';
    out += local(m.client_port);
  }
  return out;
}

std::string EtcdCluster::url() const {
  std::string credentials = options_.auth ? std::string(kUser) + ":" + kPassword + "@" : "";
  return (options_.tls ? "etcds://" : "etcd://") + credentials + endpoints();
}

std::string EtcdCluster::member_url(int member) const {
  std::string credentials = options_.auth ? std::string(kUser) + ":" + kPassword + "@" : "";
  return (options_.tls ? "etcds://" : "etcd://") + credentials + local(client_port(member));
}

std::string EtcdCluster::tls_flags() const {
  if (!options_.tls) return "";
  const TestCertificates& c = test_certificates();
  return " --cert-file " + shell_quote(c.server_cert) + " --key-file " + shell_quote(c.server_key) + " --client-cert-auth" +
         " --trusted-ca-file " + shell_quote(c.ca_cert);
}

std::string EtcdCluster::initial_cluster() const {
  std::string out;
  for (const auto& m : members_) {
    if (!out.empty()) out += ',';
    out += m.name + "=http://" + local(m.peer_port);
  }
  return out;
}

void EtcdCluster::spawn(int member, bool fresh) {
  Member& m = members_.at(member);
  const std::string data = dir_ + "/" + m.name;
  const std::string client = (options_.tls ? "https://" : "http://") + local(m.client_port);
  const std::string peer = "http://" + local(m.peer_port);
  std::string command = "exec " + shell_quote(bin_) + " --name " + m.name + " --data-dir " + shell_quote(data) +
                        " --listen-client-urls " + client + " --advertise-client-urls " + client +
                        " --listen-peer-urls " + peer + " --initial-advertise-peer-urls " + peer +
                        " --initial-cluster " + initial_cluster() +
                        " --initial-cluster-state " + (fresh ? "new" : "existing") +
                        " --initial-cluster-token lockwatch-test --heartbeat-interval 50 --election-timeout 500"
                        " --logger zap --log-level warn" + tls_flags() + options_.extra_flags + " >>" +
                        shell_quote(dir_ + "/" + m.name + ".log") + " 2>&1";
  m.process = std::make_unique<ChildProcess>(std::vector<std::string>{"/bin/sh", "-c", command});
  m.paused = false;
}

void EtcdCluster::wait_ready(std::chrono::milliseconds bound) const {
  auto deadline = std::chrono::steady_clock::now() + bound;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      etcdctl("put lockwatch-test-ready 1");
      return;
    } catch (const std::exception& e) {
      last = e.what();
    }
    std::this_thread::sleep_for(100ms);  // polling a process that gives no event
  }
  throw std::runtime_error("etcd cluster not ready within " + std::to_string(bound.count()) + " ms: " + last +
                           "\nlog of m0:\n" + log_tail(0));
}

std::string EtcdCluster::log_tail(int member) const {
  std::ifstream log(dir_ + "/" + members_.at(member).name + ".log");
  std::stringstream s;
  s << log.rdbuf();
  std::string all = s.str();
  return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
}

std::string EtcdCluster::etcdctl(const std::string& args, const std::string& endpoints) const {
  std::string eps = endpoints;
  if (eps.empty()) {
    for (const auto& m : members_) {
      if (!m.process || m.paused) continue;
      if (!eps.empty()) eps += ',';
      eps += local(m.client_port);
    }
  }
  std::string auth;
  // Before auth is enabled root's password is not needed; after, it is.
  if (auth_enabled_) auth = std::string(" --user root:") + kRootPassword;
  if (options_.tls) {
    const TestCertificates& c = test_certificates();
    auth += " --cacert=" + shell_quote(c.ca_cert) + " --cert=" + shell_quote(c.client_cert) + " --key=" + shell_quote(c.client_key);
  }
  ChildProcess p({"/bin/sh", "-c",
                  "ETCDCTL_API=3 exec " + shell_quote(etcdctl_) + " --endpoints=" + eps +
                      " --dial-timeout=2s --command-timeout=5s" + auth + " " + args + " 2>&1"});
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto line = p.read_line(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
    if (!line) break;
    out += *line + "\n";
  }
  int rc = p.wait(2000ms);
  if (rc != 0) throw std::runtime_error("etcdctl " + args + " failed (" + std::to_string(rc) + "): " + out);
  return out;
}

void EtcdCluster::kill(int member) {
  Member& m = members_.at(member);
  if (!m.process) return;
  m.process->kill(SIGCONT);
  m.process->kill(SIGKILL);
  m.process->wait(10000ms);
  m.process.reset();
  m.paused = false;
}

void EtcdCluster::start(int member) {
  if (running(member)) return;
  spawn(member, /*fresh=*/false);
  // Answers once it has caught up with the others (or, alone, at once if
  // the cluster has no quorum: a serializable read of its own state).
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      etcdctl("get --consistency=s lockwatch-test-ready", local(members_[member].client_port));
      return;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(100ms);  // polling a process that gives no event
  }
  throw std::runtime_error("etcd member " + members_[member].name + " did not answer after a restart:\n" +
                           log_tail(member));
}

void EtcdCluster::start_all() {
  for (int i = 0; i < size(); ++i)
    if (!running(i)) spawn(i, /*fresh=*/false);
  wait_ready(30s);
}

void EtcdCluster::pause(int member) {
  Member& m = members_.at(member);
  if (!m.process || m.paused) return;
  m.process->kill(SIGSTOP);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (process_state(m.process->pid()) != 'T' && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  m.paused = true;
}

void EtcdCluster::resume(int member) {
  Member& m = members_.at(member);
  if (!m.process || !m.paused) return;
  m.process->kill(SIGCONT);
  m.paused = false;
}

bool EtcdCluster::running(int member) const { return members_.at(member).process != nullptr; }

int EtcdCluster::leader() const {
  static const std::regex member_id("\"member_id\":([0-9]+)");
  static const std::regex leader_id("\"leader\":([0-9]+)");
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < size(); ++i) {
      if (!members_[i].process || members_[i].paused) continue;
      try {
        std::string status = etcdctl("endpoint status -w json", local(members_[i].client_port));
        std::smatch me, lead;
        if (std::regex_search(status, me, member_id) && std::regex_search(status, lead, leader_id) &&
            me[1] == lead[1])
          return i;
      } catch (const std::exception&) {
      }
    }
    std::this_thread::sleep_for(100ms);  // an election under way
  }
  throw std::runtime_error("no etcd member leads");
}

}  // namespace lockwatch::testing
