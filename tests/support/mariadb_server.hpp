// tests/support/mariadb_server.hpp: a real, throwaway mariadbd for tests.
//
// MariaDbServer makes a data directory with mariadb-install-db (once per
// test process, then copied), starts mariadbd on a free loopback port and
// a unix socket in its own temporary directory, and creates a user and a
// database for lockwatch. It can kill, stop, pause and restart the server
// to stage failures. A missing binary is an error, never a skip.
//
// Threading: drive one object from one thread; query() opens its own
// connection per call, so several threads may call it at once.
//
// Costs: the first server of a process takes about two seconds (the
// install), later ones well under one.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace lockwatch::testing {

class ChildProcess;

class MariaDbServer {
 public:
  static constexpr const char* kUser = "lockwatch";
  static constexpr const char* kPassword = "lockwatch-pw";
  static constexpr const char* kDatabase = "lockwatch_test";

  // Starts the server and waits, at most 30 s, until it answers; creates
  // kUser@127.0.0.1 and kUser@localhost with kPassword, and kDatabase.
  // Throws std::runtime_error (with the server's log) when it cannot.
  MariaDbServer();
  ~MariaDbServer();
  MariaDbServer(const MariaDbServer&) = delete;
  MariaDbServer& operator=(const MariaDbServer&) = delete;

  int port() const { return port_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& dir() const { return dir_; }
  // "mysql://lockwatch:lockwatch-pw@127.0.0.1:PORT/lockwatch_test"
  std::string url() const;
  // The same over the unix socket: ".../lockwatch_test?socket=PATH".
  std::string socket_url() const;
  pid_t pid() const;

  // SIGKILL and reap. Idempotent.
  void kill();
  // SIGTERM (SIGCONT first), bounded, then SIGKILL. Idempotent.
  void stop();
  // Starts it again on the same port and data directory. No-op if running.
  void start();
  // SIGSTOP / SIGCONT: a hung server. pause() returns once every thread
  // of the server has stopped.
  void pause();
  void resume();
  bool running() const;
  // The end of the server's error log (at most 4 KiB).
  std::string log_tail() const;

  // Runs statements as root over the unix socket (blocking; 10 s bound)
  // and returns the last result set's rows (NULL as "NULL"). Throws
  // std::runtime_error with the server's message on an error.
  std::vector<std::vector<std::string>> query(const std::string& sql) const;

 private:
  void spawn();

  std::string dir_;
  std::string socket_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace lockwatch::testing
