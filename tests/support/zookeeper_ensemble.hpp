// tests/support/zookeeper_ensemble.hpp: a real, throwaway ZooKeeper
// ensemble for tests.
//
// ZooKeeperEnsemble starts `members` ZooKeeper servers (Debian's
// zookeeper package: java and /usr/share/java/zookeeper.jar, whose
// manifest names its dependencies) on free loopback ports, each with a
// zoo.cfg and a data directory in one temporary directory, and waits until
// every member serves (the `srvr` four-letter word answers with a Mode).
// The tick is 100 ms (sessions of 200 ms to 60 s), the admin server is
// off, the log lines carry the time of day, the transaction log is not synced (a test needs no durability
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
#include <optional>
#include <string>
#include <vector>

typedef struct _zhandle zhandle_t;

namespace lockwatch::testing {

class ChildProcess;

class ZooKeeperEnsemble {
 public:
  // How long a member may go unheard before the others count it gone
  // (syncLimit): kQuickFailover half a second, for tests that kill or
  // pause members and bound how soon the rest go on; kSteady three
  // seconds, for tests that never fault it, so that a member starved on a
  // loaded machine does not make the leader give up its quorum and stall
  // every request for an election.
  enum class Timing { kQuickFailover, kSteady };

  explicit ZooKeeperEnsemble(int members = 3, Timing timing = Timing::kQuickFailover);
  ~ZooKeeperEnsemble();
  ZooKeeperEnsemble(const ZooKeeperEnsemble&) = delete;
  ZooKeeperEnsemble& operator=(const ZooKeeperEnsemble&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  int client_port(int i) const;
  // "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3", without member `except`
  // when one is given.
  std::string hosts(int except = -1) const;
  // Where the members keep their configuration, data and logs.
  const std::string& dir() const { return dir_; }

  void kill(int i);
  void start(int i);
  void pause(int i);
  void resume(int i);
  bool running(int i) const;

  // The member's answer to `srvr`: "leader", "follower", "standalone", or
  // empty (no answer, or no quorum).
  std::string mode(int i) const;
  // The last lines of member i's log that are not a stack trace's.
  std::string log_tail(int i) const;
  // The leader's index, waiting at most `bound` for one (-1: none).
  int leader(std::chrono::milliseconds bound = std::chrono::seconds(20)) const;
  // Waits at most `bound` until a client of some member watches the node
  // `path` (`wchp`): a waiter set its watch, and was told the lock is busy.
  bool wait_watched(const std::string& path, std::chrono::milliseconds bound = std::chrono::seconds(10)) const;
  // Waits at most `bound` until every running, unpaused member serves.
  bool wait_serving(std::chrono::milliseconds bound = std::chrono::seconds(60)) const;

 private:
  struct Member;
  void spawn(int i);

  std::string dir_;
  std::string run_as_;
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace lockwatch::testing

namespace lockwatch::testing {

// A blocking client of an ensemble for tests (the C client's synchronous
// calls): what a test reads or tampers with behind lockwatch's back. With
// `digest` ("user:password") it authenticates as that identity.
// Throws std::runtime_error when it cannot connect within 10 s.
class ZooKeeperClient {
 public:
  explicit ZooKeeperClient(const std::string& hosts, const std::string& digest = "");
  ~ZooKeeperClient();
  ZooKeeperClient(const ZooKeeperClient&) = delete;
  ZooKeeperClient& operator=(const ZooKeeperClient&) = delete;

  // The children of `path` (empty when it does not exist).
  std::vector<std::string> children(const std::string& path);
  // The data of `path`, or nullopt when it does not exist.
  std::optional<std::string> get(const std::string& path);
  void remove(const std::string& path);  // gone already: nothing
  // Creates an ephemeral sequential node (of this client's session).
  std::string create_ephemeral_sequential(const std::string& prefix, const std::string& data);
  // The ensemble's clock: the mtime a write to `path` gets, in ms.
  long long touch(const std::string& path);

 private:
  zhandle_t* zh_ = nullptr;
};

}  // namespace lockwatch::testing
