// tests/support/zookeeper_ensemble.hpp: a real, throwaway ZooKeeper
// ensemble for tests.
//
// ZooKeeperEnsemble starts `members` ZooKeeper servers (Debian's
// zookeeper package: java and /usr/share/java/zookeeper.jar, whose
// manifest names its dependencies) on free loopback ports, each with a
// zoo.cfg and a data directory in one temporary directory, and waits until
// every member serves (the `srvr` four-letter word answers with a Mode).
// The tick is 100 ms (sessions of 200 ms to 60 s), the admin server is
// off, the transaction log is not synced (a test needs no durability
// against a machine's crash, only against a member's).
// A missing java or jar is an error, never a skip. The servers die with
// the test (a parent-death signal).
//
// kill(i) is a crash (SIGKILL), start(i) brings member i back on its data
// directory; pause(i) stops it answering (SIGSTOP; it returns once the
// process has stopped), resume(i) lets it go on. mode(i) asks member i
// whether it leads ("leader", "follower"; empty when it does not answer
// within 500 ms or serves no quorum).
//
// Threading: drive one object from one thread.
// Costs: about two seconds to start (three JVMs), a member's restart
// about one.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace lockwatch::testing {

class ChildProcess;

class ZooKeeperEnsemble {
 public:
  explicit ZooKeeperEnsemble(int members = 3);
  ~ZooKeeperEnsemble();
  ZooKeeperEnsemble(const ZooKeeperEnsemble&) = delete;
  ZooKeeperEnsemble& operator=(const ZooKeeperEnsemble&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  int client_port(int i) const;
  // "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
  std::string hosts() const;

  void kill(int i);
  void start(int i);
  void pause(int i);
  void resume(int i);
  bool running(int i) const;

  // The member's answer to `srvr`: "leader", "follower", "standalone", or
  // empty (no answer, or no quorum).
  std::string mode(int i) const;
  // The leader's index, waiting at most `bound` for one (-1: none).
  int leader(std::chrono::milliseconds bound = std::chrono::seconds(20)) const;
  // Waits at most `bound` until every running, unpaused member serves.
  bool wait_serving(std::chrono::milliseconds bound = std::chrono::seconds(60)) const;

 private:
  struct Member;
  void spawn(int i);
  std::string log_tail(int i) const;

  std::string dir_;
  std::string run_as_;
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace lockwatch::testing
