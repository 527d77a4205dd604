// tests/support/redis_server.hpp: real redis-server processes and other child
// processes for tests.
//
// RedisServer starts its own redis-server on a free loopback port, in a
// private temporary directory, so that tests never share state with each
// other or with a developer's Redis, and never skip because Redis is missing:
// a missing binary is an error. It can kill, stop, pause and restart the
// server to stage failures. ChildProcess runs a helper program (a sample, a
// second "node") and reads its standard output line by line.
//
// Threading: neither class is thread-safe; drive each from one thread.
// RedisServer::command() is the exception: it opens its own connection, so
// several threads may call it at once while the server is not being
// restarted.
//
// Costs: starting a server takes a fork/exec and a few milliseconds until it
// answers PING; command() opens a new connection per call, which is fine for
// assertions and wrong for load.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockwatch::testing {

// TLS material for the tests, made once per test program with the `openssl`
// command in a private temporary directory (removed at exit): a CA, and
// certificates it signed for 127.0.0.1 and localhost (a server's, a
// client's), plus the bad ones: one from another CA, one for another name,
// one that expired in 2020. Throws std::runtime_error when openssl fails.
struct TestCertificates {
  std::string dir;
  std::string ca_cert;
  std::string server_cert, server_key;
  std::string client_cert, client_key;
  std::string untrusted_cert, untrusted_key;    // signed by a CA nobody trusts
  std::string wrong_name_cert, wrong_name_key;  // for wrong.example only
  std::string expired_cert, expired_key;        // valid in January 2020 only
};
const TestCertificates& test_certificates();

// A redis-server that speaks TLS on its port (see RedisServerOptions::tls).
struct RedisTls {
  std::string cert_file;  // empty: test_certificates()'s server certificate
  std::string key_file;
  bool auth_clients = false;  // --tls-auth-clients: require a client certificate
};

struct RedisServerOptions {
  // Empty means no authentication; otherwise passed as requirepass.
  std::string password;
  // Keeps data across restart(): appendonly yes with appendfsync always, so
  // that every acknowledged write survives even a SIGKILL. Without it the
  // server runs with --save '' and forgets everything when it stops.
  bool appendonly = false;
  // Appended after the options above, so they can override them, e.g.
  // {"--maxmemory", "1mb"}.
  std::vector<std::string> extra_args;
  // Set: port() is a TLS port (CA: test_certificates().ca_cert) and url()
  // is rediss://. command() then uses a second, plaintext port on loopback
  // kept for the test's own checks (hiredis 0.14 has no TLS); lockwatch
  // under test is only ever given the TLS port.
  std::optional<RedisTls> tls;
};

// An owned copy of a hiredis reply: valid after the connection is gone.
struct Reply {
  enum class Type { kString, kArray, kInteger, kNil, kStatus, kError };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus and kError
  long long integer = 0;
  std::vector<Reply> elements;  // kArray
};

// A TCP port on 127.0.0.1 that was free a moment ago: the kernel picks it for
// a socket bound to port 0, which is then closed. Someone else may take it
// before it is used, which is why RedisServer retries with a fresh port.
// Throws std::runtime_error if no socket can be bound.
int free_loopback_port();

// What the servers' fixtures share. A fresh directory $TMPDIR/<name>-XXXXXX
// (std::runtime_error if it cannot be made).
std::string make_temp_dir(std::string_view name);
// Removes `dir` when the program exits: for what lives as long as the
// program (a server shared by every case, a template copied by each), which
// no destructor removes.
void remove_at_exit(std::string dir);
// `s` in single quotes for /bin/sh.
std::string shell_quote(const std::string& s);
// The state letter of /proc/<pid>/stat ('T' stopped, 'Z' a zombie; '\0'
// when the process is gone).
char process_state(pid_t pid);
// /usr/bin/<name>, else <name> on PATH; std::runtime_error naming `needs`
// (the Debian packages the tests need) when it is in neither.
std::string find_program(const char* name, const char* needs);

// One redis-server process bound to 127.0.0.1, owned by the test.
//
// The process is started with fork/exec. When started from the main thread,
// it is also told to die with its parent (PR_SET_PDEATHSIG), so a crashed test
// leaves no server behind; from another thread that is not done, because the
// kernel sends that signal when the starting *thread* exits.
class RedisServer {
 public:
  // Starts redis-server (/usr/bin/redis-server, else the first on PATH) and
  // waits, at most 10 s, until it answers PING. Throws std::runtime_error,
  // with the tail of the server's log, if it cannot be found, does not start
  // or does not answer in time.
  explicit RedisServer(RedisServerOptions options = {});

  // Kills the server if it still runs and removes its directory. Never throws.
  ~RedisServer();

  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  // The port command() uses: port(), but for a TLS server its plaintext one.
  int command_port() const { return options_.tls ? command_port_ : port_; }
  const std::string& host() const { return host_; }
  // "redis://127.0.0.1:PORT", or "redis://:PASSWORD@127.0.0.1:PORT" with a
  // password (inserted as is: keep test passwords URL-safe); rediss:// for
  // a TLS server.
  std::string url() const;
  // The server's pid, or -1 when it is not running.
  pid_t pid() const { return pid_; }
  // The server's private directory (log, append-only files).
  const std::string& dir() const { return dir_; }
  bool tls() const { return options_.tls.has_value(); }

  // SIGKILL and reap; a crash as far as clients can tell. Idempotent.
  void kill();
  // SIGTERM (and SIGCONT, in case it is paused) and reap, waiting at most
  // 10 s before falling back to SIGKILL. Idempotent.
  void stop();
  // Starts the server again on the same port, directory and options, and
  // waits until it answers PING; retries for a few seconds while the port is
  // still held by someone else. Does nothing if it is running. Throws
  // std::runtime_error like the constructor.
  void start();
  // SIGSTOP: the server keeps its connections but answers nothing, as a
  // hung or partitioned node would. resume() sends SIGCONT.
  void pause();
  void resume();
  // True while the process exists and has not exited (a paused server runs).
  bool running() const;

  // Runs one command, given as separate binary-safe arguments, on a fresh
  // synchronous connection (connect timeout 2 s, reply timeout 10 s), after
  // AUTH when the server has a password. Redis errors come back as
  // Reply::Type::kError; a connection or protocol failure throws
  // std::runtime_error.
  Reply command(const std::vector<std::string>& args) const;

 private:
  // Spawns the process and waits until it answers; returns false (with the
  // server reaped) when it failed because the port was taken.
  bool try_start();
  std::string log_tail() const;

  RedisServerOptions options_;
  std::string host_ = "127.0.0.1";
  std::string binary_;
  std::string dir_;
  int port_ = 0;
  int command_port_ = 0;  // TLS servers: the plaintext port command() uses
  pid_t pid_ = -1;
};

// A child process whose standard output is captured through a pipe. Its
// standard input is /dev/null and its standard error is the test's own, so
// that diagnostics show up in the test log.
class ChildProcess {
 public:
  // Starts argv[0] (looked up on PATH when it has no slash) with the given
  // arguments and this process's environment plus `extra_env` entries of the
  // form "NAME=value", which replace variables of the same name. Throws
  // std::runtime_error when the program cannot be started.
  // With `piped_stdin`, the child reads what write_line() sends (else
  // /dev/null).
  explicit ChildProcess(std::vector<std::string> argv, std::vector<std::string> extra_env = {},
                        bool piped_stdin = false);

  // SIGKILL and reap if still running. Never throws.
  ~ChildProcess();

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The next line of standard output without its '\n'; a last line without
  // '\n' is returned once the child closes its output. std::nullopt when no
  // full line arrived within `timeout` or the output ended.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);

  // Waits at most `timeout` for the child to exit and returns its exit code,
  // or 128 + the signal number when a signal ended it (as shells report it).
  // On timeout kills the child, reaps it and throws std::runtime_error.
  // Calling it again returns the same status.
  int wait(std::chrono::milliseconds timeout);

  // Writes `line` and '\n' to the child's standard input (piped_stdin);
  // false when the child no longer reads it.
  bool write_line(const std::string& line);
  // Closes the child's standard input: it reads end of file.
  void close_stdin();

  // Sends `sig` to the child; does nothing once it has been reaped.
  void kill(int sig);

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  int stdout_fd_ = -1;
  int stdin_fd_ = -1;
  bool stdout_closed_ = false;
  std::string buffer_;
};

}  // namespace lockwatch::testing
