#include "postgres_server.hpp"

#include <dirent.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "redis_server.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr auto kPostgresStartTimeout = 30s;
constexpr auto kPostgresStopTimeout = 10s;

// Debian's newest /usr/lib/postgresql/<version>/bin, else the directory
// of `postgres` on PATH.
std::string find_bin() {
  std::string best;
  int best_version = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const std::string version = entry.path().filename().string();
    int v = std::atoi(version.c_str());
    if (v > best_version && ::access((entry.path() / "bin" / "postgres").c_str(), X_OK) == 0) {
      best_version = v;
      best = (entry.path() / "bin").string();
    }
  }
  if (!best.empty()) return best;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((d + "/postgres").c_str(), X_OK) == 0 && ::access((d + "/initdb").c_str(), X_OK) == 0)
      return d;
  throw std::runtime_error(
      "postgres and initdb not found (looked in /usr/lib/postgresql/*/bin and PATH); the PostgreSQL tests need "
      "Debian's postgresql package and do not skip without it");
}

// The processes whose parent is `parent` (the postmaster's are all its
// direct children).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string s;
    std::getline(stat, s);
    auto close = s.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(s.substr(close + 2));
    char state = 0;
    long ppid = 0;
    if (rest >> state >> ppid && ppid == parent && state != 'Z') out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return out;
}

struct PgConn {
  PGconn* c = nullptr;
  ~PgConn() {
    if (c != nullptr) PQfinish(c);
  }
};

bool try_connect(const std::string& socket_dir, int port, const std::string& database, PgConn& conn, std::string* why) {
  std::string info = "host=" + socket_dir + " port=" + std::to_string(port) + " dbname=" + database +
                     " user=postgres connect_timeout=2 options='-c statement_timeout=10000'";
  conn.c = PQconnectdb(info.c_str());
  if (PQstatus(conn.c) == CONNECTION_OK) return true;
  if (why != nullptr) *why = PQerrorMessage(conn.c);
  return false;
}

}  // namespace

PostgresServer::PostgresServer(PostgresServerOptions options) : options_(options) {
  bin_ = find_bin();
  dir_ = make_temp_dir("lockwatch-pg");
  try {
    uid_t uid = ::geteuid();
    gid_t gid = ::getegid();
    if (uid == 0) {
      const passwd* pw = ::getpwnam("postgres");
      if (pw == nullptr) pw = ::getpwnam("nobody");
      if (pw == nullptr) throw std::runtime_error("running as root, and neither a postgres nor a nobody user exists");
      uid = pw->pw_uid;
      gid = pw->pw_gid;
      run_as_ = "setpriv --reuid=" + std::to_string(uid) + " --regid=" + std::to_string(gid) +
                " --clear-groups --pdeathsig KILL ";
      if (::chown(dir_.c_str(), uid, gid) != 0) throw std::runtime_error("chown " + dir_);
    }
    ChildProcess initdb({"/bin/sh", "-c",
                         "exec " + run_as_ + shell_quote(bin_ + "/initdb") + " -D " + shell_quote(dir_ + "/data") +
                             " -U postgres --auth=trust --encoding=UTF8 --no-locale --no-sync --no-instructions >" +
                             shell_quote(dir_ + "/initdb.log") + " 2>&1"});
    if (int rc = initdb.wait(60000ms); rc != 0) {
      std::ifstream log(dir_ + "/initdb.log");
      std::stringstream s;
      s << log.rdbuf();
      throw std::runtime_error("initdb failed (" + std::to_string(rc) + "): " + s.str());
    }
    const std::string data = dir_ + "/data";
    auto write_owned = [&](const std::string& path, const std::string& text, fs::perms mode) {
      {
        std::ofstream out(path, std::ios::trunc);
        out << text;
        if (!out) throw std::runtime_error("cannot write " + path);
      }
      fs::permissions(path, mode);
      if (::geteuid() == 0 && ::chown(path.c_str(), uid, gid) != 0) throw std::runtime_error("chown " + path);
    };
    std::string hba = "local all postgres trust\nlocal all all scram-sha-256\n";
    if (options_.tls) {
      const TestCertificates& certs = test_certificates();
      auto copy = [&](const std::string& from, const char* to, fs::perms mode) {
        std::ifstream in(from);
        std::stringstream s;
        s << in.rdbuf();
        write_owned(data + "/" + to, s.str(), mode);
      };
      copy(certs.server_cert, "server.crt", fs::perms::owner_read | fs::perms::owner_write);
      copy(certs.server_key, "server.key", fs::perms::owner_read | fs::perms::owner_write);
      copy(certs.ca_cert, "root.crt", fs::perms::owner_read | fs::perms::owner_write);
      hba += std::string("hostssl all ") + kCertUser + " 127.0.0.1/32 scram-sha-256 clientcert=verify-ca\n" +
             "hostnossl all " + kCertUser + " 127.0.0.1/32 reject\n";
    }
    hba += "host all all 127.0.0.1/32 scram-sha-256\nhost all all ::1/128 scram-sha-256\n";
    write_owned(data + "/pg_hba.conf", hba, fs::perms::owner_read | fs::perms::owner_write);

    for (int attempt = 0;; ++attempt) {
      port_ = free_loopback_port();
      try {
        spawn();
        break;
      } catch (const std::exception&) {
        kill();
        if (attempt >= 3) throw;
      }
    }
    query(std::string("CREATE ROLE ") + kUser + " LOGIN PASSWORD '" + kPassword + "'", "postgres");
    query(std::string("CREATE DATABASE ") + kDatabase + " OWNER " + kUser, "postgres");
    query("CREATE EXTENSION pg_stat_statements");
    if (options_.tls) {
      query(std::string("CREATE ROLE ") + kCertUser + " LOGIN PASSWORD '" + kPassword + "'", "postgres");
      query(std::string("GRANT USAGE, CREATE ON SCHEMA public TO ") + kCertUser);
    }
  } catch (...) {
    kill();
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

PostgresServer::~PostgresServer() {
  try {
    kill();
  } catch (...) {
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void PostgresServer::spawn() {
  std::string args = " -D " + shell_quote(dir_ + "/data") + " -p " + std::to_string(port_) + " -k " + shell_quote(dir_) +
                     " -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
                     " -c full_page_writes=off -c log_min_messages=warning"
                     " -c shared_preload_libraries=pg_stat_statements";
  if (options_.tls)
    args += " -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c ssl_ca_file=root.crt";
  process_ = std::make_unique<ChildProcess>(std::vector<std::string>{
      "/bin/sh", "-c", "exec " + run_as_ + shell_quote(bin_ + "/postgres") + args + " >>" + shell_quote(dir_ + "/server.log") + " 2>&1"});
  auto until = std::chrono::steady_clock::now() + kPostgresStartTimeout;
  while (true) {
    PgConn c;
    if (try_connect(dir_, port_, "postgres", c, nullptr)) return;
    if (!running()) throw std::runtime_error("postgres exited at start: " + log_tail());
    if (std::chrono::steady_clock::now() > until)
      throw std::runtime_error("postgres did not answer within 30 s: " + log_tail());
    std::this_thread::sleep_for(20ms);  // polling a server that is starting: no event to wait on
  }
}

std::string PostgresServer::url() const {
  return std::string("postgresql://") + kUser + ":" + kPassword + "@127.0.0.1:" + std::to_string(port_) + "/" +
         kDatabase;
}

std::string PostgresServer::socket_url() const {
  return std::string("postgresql://") + kUser + ":" + kPassword + "@localhost:" + std::to_string(port_) + "/" +
         kDatabase + "?host=" + dir_;
}

pid_t PostgresServer::pid() const { return process_ ? process_->pid() : -1; }

std::vector<pid_t> PostgresServer::pids() const {
  if (!process_) return {};
  std::vector<pid_t> all = children_of(process_->pid());
  all.insert(all.begin(), process_->pid());
  return all;
}

bool PostgresServer::running() const {
  if (!process_) return false;
  char state = process_state(process_->pid());
  return state != '\0' && state != 'Z';
}

void PostgresServer::kill() {
  if (!process_) return;
  // Stopped first, the postmaster starts no process while its children
  // are found and killed.
  const pid_t pm = process_->pid();
  process_->kill(SIGSTOP);
  std::vector<pid_t> children = children_of(pm);
  for (pid_t c : children) ::kill(c, SIGKILL);
  process_->kill(SIGKILL);
  process_->wait(std::chrono::duration_cast<std::chrono::milliseconds>(kPostgresStopTimeout));
  process_.reset();
  // The children are gone (or zombies) before a restart may look at
  // their shared memory.
  auto until = std::chrono::steady_clock::now() + kPostgresStopTimeout;
  for (pid_t c : children)
    while (process_state(c) != '\0' && process_state(c) != 'Z' && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);  // the kernel ends a killed process as it next runs
}

void PostgresServer::stop() {
  if (!process_) return;
  for (pid_t p : pids()) ::kill(p, SIGCONT);
  process_->kill(SIGINT);
  try {
    process_->wait(std::chrono::duration_cast<std::chrono::milliseconds>(kPostgresStopTimeout));
    process_.reset();
  } catch (const std::exception&) {
    kill();
  }
}

void PostgresServer::start() {
  if (process_) return;
  spawn();
}

void PostgresServer::pause() {
  if (!process_) return;
  const pid_t pm = process_->pid();
  process_->kill(SIGSTOP);
  std::vector<pid_t> all = children_of(pm);
  for (pid_t c : all) ::kill(c, SIGSTOP);
  all.push_back(pm);
  // Each process stops as it next runs: wait until every one has, so that
  // nothing is answered after pause() returns.
  auto until = std::chrono::steady_clock::now() + kPostgresStopTimeout;
  while (std::chrono::steady_clock::now() < until) {
    bool all_stopped = std::all_of(all.begin(), all.end(), [](pid_t p) {
      char s = process_state(p);
      return s == 'T' || s == 't' || s == '\0' || s == 'Z';
    });
    if (all_stopped) return;
    std::this_thread::sleep_for(1ms);  // no event to wait on
  }
  throw std::runtime_error("postgres's processes did not all stop");
}

void PostgresServer::resume() {
  if (!process_) return;
  for (pid_t c : children_of(process_->pid())) ::kill(c, SIGCONT);
  process_->kill(SIGCONT);
}

std::vector<std::vector<std::string>> PostgresServer::query(const std::string& sql, const std::string& database) const {
  PgConn c;
  std::string why;
  if (!try_connect(dir_, port_, database, c, &why)) throw std::runtime_error("cannot connect to postgres: " + why);
  PGresult* r = PQexec(c.c, sql.c_str());
  std::vector<std::vector<std::string>> rows;
  // PQexec returns the last result of a multi-statement string.
  ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    std::string msg = PQresultErrorMessage(r);
    PQclear(r);
    throw std::runtime_error("postgres refused '" + sql + "': " + msg);
  }
  for (int i = 0; i < PQntuples(r); ++i) {
    std::vector<std::string> cells;
    for (int j = 0; j < PQnfields(r); ++j)
      cells.emplace_back(PQgetisnull(r, i, j) ? std::string("NULL") : std::string(PQgetvalue(r, i, j), PQgetlength(r, i, j)));
    rows.push_back(std::move(cells));
  }
  PQclear(r);
  return rows;
}

std::string PostgresServer::log_tail() const {
  std::ifstream log(dir_ + "/server.log");
  std::stringstream s;
  s << log.rdbuf();
  std::string all = s.str();
  return all.size() > 4096 ? all.substr(all.size() - 4096) : all;
}

}  // namespace lockwatch::testing
