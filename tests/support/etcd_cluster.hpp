// tests/support/etcd_cluster.hpp: a real, throwaway etcd cluster for tests.
//
// EtcdCluster starts `members` etcd processes (Debian's etcd-server,
// /usr/bin/etcd, else the first on PATH; missing is an error, never a
// skip) on free 127.0.0.1 client and peer ports, each with a data
// directory in one temporary directory, as one new cluster. Raft runs
// fast (50 ms heartbeats, 500 ms elections): a leader lost is replaced
// within about a second, and etcd's shortest lease is one second.
//
// Faults act on one member: kill() (SIGKILL, as a crash), start() again on
// its ports and data, pause()/resume() (SIGSTOP/SIGCONT, a hung machine).
// leader() asks the members (etcdctl endpoint status) which one leads.
//
// With tls, clients must connect over TLS with a client certificate (see
// EtcdClusterOptions); url() is then etcds://.
// With auth, the cluster has the users root (kRootPassword) and kUser
// (kPassword, read-write on every key) and authentication enabled.
//
// Threading: drive one object from one thread. etcdctl() blocks (bounded).
//
// Costs: a cluster of three starts in about a second.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace lockwatch::testing {

class ChildProcess;

struct EtcdClusterOptions {
  int members = 3;
  bool auth = false;
  // Clients speak TLS (test_certificates()'s server certificate) and must
  // present a certificate its CA signed; the members speak to each other
  // in plain text.
  bool tls = false;
  // More etcd flags for every member (e.g. " --max-request-bytes 65536").
  std::string extra_flags = "";
};

class EtcdCluster {
 public:
  static constexpr const char* kUser = "lockwatch";
  static constexpr const char* kPassword = "lockwatch-pw";
  static constexpr const char* kRootPassword = "root-pw";

  // Starts the members and waits, at most 30 s, until a write through the
  // cluster succeeds. Throws std::runtime_error (with a member's log) when
  // it cannot.
  explicit EtcdCluster(EtcdClusterOptions options = {});
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  int client_port(int member) const;
  // "etcd://127.0.0.1:P1,127.0.0.1:P2,..." (with auth: kUser's credentials;
  // with tls: etcds://).
  std::string url() const;
  // The same naming only `member`.
  std::string member_url(int member) const;
  // "127.0.0.1:P1,127.0.0.1:P2,..." for etcdctl.
  std::string endpoints() const;

  void kill(int member);
  // Starts a killed member again (same ports and data); waits until it
  // answers. No-op if running.
  void start(int member);
  // Starts every killed member again and waits until a write through the
  // cluster succeeds (after all were killed: none answers alone).
  void start_all();
  // pause() returns once the process has stopped.
  void pause(int member);
  void resume(int member);
  bool running(int member) const;
  // The member that leads now (waits, at most 10 s, for one among those
  // running and not paused); throws std::runtime_error if none.
  int leader() const;

  // Runs etcdctl (API 3) against `endpoints` (all running members when
  // empty) with `args`, as root with auth, bounded by 10 s; returns its
  // output. Throws std::runtime_error when it fails.
  std::string etcdctl(const std::string& args, const std::string& endpoints = "") const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::unique_ptr<ChildProcess> process;
    bool paused = false;
  };
  void spawn(int member, bool fresh);
  std::string initial_cluster() const;
  std::string tls_flags() const;
  std::string log_tail(int member) const;
  void wait_ready(std::chrono::milliseconds bound) const;

  EtcdClusterOptions options_;
  std::string bin_;
  std::string etcdctl_;
  std::string dir_;
  std::vector<Member> members_;
  bool auth_enabled_ = false;
};

}  // namespace lockwatch::testing
