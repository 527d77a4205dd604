// tests/support/postgres_server.hpp: a real, throwaway PostgreSQL server for
// tests.
//
// PostgresServer makes a cluster with initdb in its own temporary
// directory, starts `postgres` on a free loopback port and a unix socket in
// that directory, and creates a role and a database for lockwatch. The
// binaries are Debian's (/usr/lib/postgresql/<version>/bin, the newest),
// else the first on PATH; a missing binary is an error, never a skip.
// PostgreSQL refuses to run as root: when the tests do, initdb and the
// server run as the `postgres` user (else `nobody`) through setpriv, which
// also makes the server die with the test (a parent-death signal).
//
// A server is a process tree (the postmaster and a process per connection
// and per helper): kill(), pause() and resume() act on all of it, as a
// machine's crash or a hang would.
//
// pg_stat_statements is loaded, and created in kDatabase: tests count the
// statements a store sent. Client authentication: scram-sha-256 over TCP
// and the socket for every role but the superuser `postgres`, which
// query() uses over the socket.
// With `tls`, the server speaks TLS too (test_certificates()'s server
// certificate; clients' certificates checked against its CA), and
// kCertUser must present a client certificate (hostssl ... clientcert).
//
// Threading: drive one object from one thread; query() opens its own
// connection per call, so several threads may call it at once.
//
// Costs: initdb about a second, a start well under one.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace lockwatch::testing {

class ChildProcess;

struct PostgresServerOptions {
  bool tls = false;
};

class PostgresServer {
 public:
  static constexpr const char* kUser = "lockwatch";
  static constexpr const char* kPassword = "lockwatch-pw";
  static constexpr const char* kDatabase = "lockwatch_test";
  // With tls: a role that must log in over TLS with a client certificate
  // (and kPassword), allowed to create tables in kDatabase.
  static constexpr const char* kCertUser = "lockwatch_cert";

  // Makes the cluster, starts the server and waits, at most 30 s, until it
  // answers; creates kUser with kPassword, and kDatabase owned by it.
  // Throws std::runtime_error (with the server's log) when it cannot.
  explicit PostgresServer(PostgresServerOptions options = {});
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  int port() const { return port_; }
  const std::string& dir() const { return dir_; }  // also the unix socket's directory
  // "postgresql://lockwatch:lockwatch-pw@127.0.0.1:PORT/lockwatch_test"
  std::string url() const;
  // The same over the unix socket: "...@localhost/lockwatch_test?host=DIR".
  std::string socket_url() const;
  // The postmaster's pid (-1 when it is not running), and with it every
  // process of the server (the benchmarks sum their CPU).
  pid_t pid() const;
  std::vector<pid_t> pids() const;

  // SIGKILL to every process of the server, and reap. Idempotent.
  void kill();
  // A fast shutdown (SIGINT; SIGCONT first), bounded, then kill().
  void stop();
  // Starts it again on the same port and data directory (crash recovery
  // first, after a kill()). No-op if running.
  void start();
  // SIGSTOP / SIGCONT to every process of the server: a hung server.
  // pause() returns once every one of them has stopped.
  void pause();
  void resume();
  bool running() const;

  // Runs `sql` (one or more statements) as the superuser over the unix
  // socket, in `database` (kDatabase by default), blocking, 10 s bound;
  // returns the last result's rows (NULL as "NULL"). Throws
  // std::runtime_error with the server's message on an error.
  std::vector<std::vector<std::string>> query(const std::string& sql, const std::string& database = kDatabase) const;

 private:
  void spawn();
  std::string log_tail() const;

  PostgresServerOptions options_;
  std::string bin_;
  std::string dir_;
  std::string run_as_;  // "setpriv ... " when running as root, else empty
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace lockwatch::testing
