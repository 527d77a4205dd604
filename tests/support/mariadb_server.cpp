#include "mariadb_server.hpp"

#include <mysql.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "redis_server.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr auto kMariadbStartTimeout = 30s;
constexpr auto kMariadbStopTimeout = 10s;

// A data directory made once per process; each server copies it.
const std::string& template_datadir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    std::string root = make_temp_dir("lockwatch-mariadb-template");
    remove_at_exit(root);
    std::string data = root + "/data";
    ChildProcess install({"/bin/sh", "-c",
                          "exec mariadb-install-db --no-defaults --datadir='" + data +
                              "' --user=root --auth-root-authentication-method=normal --skip-test-db "
                              "--innodb-log-file-size=4M >'" + root + "/install.log' 2>&1"});
    int rc = install.wait(60000ms);
    if (rc != 0) {
      std::ifstream log(root + "/install.log");
      std::stringstream s;
      s << log.rdbuf();
      throw std::runtime_error("mariadb-install-db failed (" + std::to_string(rc) + "): " + s.str());
    }
    dir = data;
  });
  return dir;
}

struct MariadbConn {
  MYSQL* m = nullptr;
  ~MariadbConn() {
    if (m != nullptr) mysql_close(m);
  }
};

bool try_connect(const std::string& socket, MariadbConn& c) {
  c.m = mysql_init(nullptr);
  unsigned timeout = 2;
  mysql_options(c.m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
  unsigned rw = 10;
  mysql_options(c.m, MYSQL_OPT_READ_TIMEOUT, &rw);
  mysql_options(c.m, MYSQL_OPT_WRITE_TIMEOUT, &rw);
  return mysql_real_connect(c.m, "localhost", "root", "", nullptr, 0, socket.c_str(), CLIENT_MULTI_STATEMENTS) != nullptr;
}

}  // namespace

MariaDbServer::MariaDbServer() {
  static std::once_flag lib;
  std::call_once(lib, [] { mysql_library_init(0, nullptr, nullptr); });
  const std::string& tmpl = template_datadir();
  dir_ = make_temp_dir("lockwatch-mariadb");
  fs::copy(tmpl, dir_ + "/data", fs::copy_options::recursive);
  socket_ = dir_ + "/sock";
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
  query(std::string("CREATE DATABASE ") + kDatabase + ";" +
        "CREATE USER '" + kUser + "'@'127.0.0.1' IDENTIFIED BY '" + kPassword + "';" +
        "CREATE USER '" + kUser + "'@'localhost' IDENTIFIED BY '" + kPassword + "';" +
        "GRANT ALL ON " + kDatabase + ".* TO '" + kUser + "'@'127.0.0.1';" +
        "GRANT ALL ON " + kDatabase + ".* TO '" + kUser + "'@'localhost'");
}

MariaDbServer::~MariaDbServer() {
  try {
    kill();
  } catch (...) {
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void MariaDbServer::spawn() {
  process_ = std::make_unique<ChildProcess>(std::vector<std::string>{
      "mariadbd", "--no-defaults", "--datadir=" + dir_ + "/data", "--user=root", "--socket=" + socket_,
      "--port=" + std::to_string(port_), "--bind-address=127.0.0.1", "--skip-name-resolve",
      "--log-error=" + dir_ + "/error.log", "--pid-file=" + dir_ + "/mariadbd.pid", "--innodb-buffer-pool-size=128M",
      "--skip-log-bin", "--innodb-flush-log-at-trx-commit=2", "--max-connections=500",
      "--open-files-limit=4096", "--table-open-cache=400"});
  auto until = std::chrono::steady_clock::now() + kMariadbStartTimeout;
  while (true) {
    MariadbConn c;
    if (try_connect(socket_, c)) return;
    if (!running()) throw std::runtime_error("mariadbd exited at start: " + log_tail());
    if (std::chrono::steady_clock::now() > until)
      throw std::runtime_error("mariadbd did not answer within 30 s: " + log_tail());
    std::this_thread::sleep_for(20ms);  // polling a server that is starting: no event to wait on
  }
}

std::string MariaDbServer::url() const {
  return std::string("mysql://") + kUser + ":" + kPassword + "@127.0.0.1:" + std::to_string(port_) + "/" + kDatabase;
}

std::string MariaDbServer::socket_url() const {
  return std::string("mysql://") + kUser + ":" + kPassword + "@localhost/" + kDatabase + "?socket=" + socket_;
}

pid_t MariaDbServer::pid() const { return process_ ? process_->pid() : -1; }

bool MariaDbServer::running() const {
  if (!process_) return false;
  return ::kill(process_->pid(), 0) == 0 && [&] {
    // A zombie still answers kill(0): look at its state.
    std::ifstream stat("/proc/" + std::to_string(process_->pid()) + "/stat");
    std::string s;
    std::getline(stat, s);
    auto close = s.rfind(')');
    return close != std::string::npos && close + 2 < s.size() && s[close + 2] != 'Z';
  }();
}

void MariaDbServer::kill() {
  if (!process_) return;
  process_->kill(SIGKILL);
  process_->wait(kMariadbStopTimeout);
  process_.reset();
}

void MariaDbServer::stop() {
  if (!process_) return;
  process_->kill(SIGCONT);
  process_->kill(SIGTERM);
  try {
    process_->wait(std::chrono::duration_cast<std::chrono::milliseconds>(kMariadbStopTimeout));
  } catch (const std::exception&) {
  }
  process_.reset();
}

void MariaDbServer::start() {
  if (process_) return;
  spawn();
}

void MariaDbServer::pause() {
  if (!process_) return;
  process_->kill(SIGSTOP);
  // The stop reaches each of mariadbd's threads on its own: wait until
  // every one is stopped, so nothing is answered after pause() returns.
  auto until = std::chrono::steady_clock::now() + kMariadbStopTimeout;
  std::string tasks = "/proc/" + std::to_string(process_->pid()) + "/task";
  while (std::chrono::steady_clock::now() < until) {
    bool all_stopped = true;
    std::error_code ec;
    for (const auto& task : fs::directory_iterator(tasks, ec)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      auto close = line.rfind(')');
      if (close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'T' && line[close + 2] != 't')
        all_stopped = false;
    }
    if (all_stopped) return;
    std::this_thread::sleep_for(1ms);  // the kernel stops threads as they next run: no event to wait on
  }
  throw std::runtime_error("mariadbd's threads did not all stop");
}

void MariaDbServer::resume() {
  if (process_) process_->kill(SIGCONT);
}

std::vector<std::vector<std::string>> MariaDbServer::query(const std::string& sql) const {
  MariadbConn c;
  if (!try_connect(socket_, c)) throw std::runtime_error(std::string("cannot connect to mariadbd: ") + mysql_error(c.m));
  if (mysql_real_query(c.m, sql.data(), sql.size()) != 0)
    throw std::runtime_error("mariadbd refused '" + sql + "': " + mysql_error(c.m));
  std::vector<std::vector<std::string>> rows;
  do {
    MYSQL_RES* res = mysql_store_result(c.m);
    if (res != nullptr) {
      rows.clear();
      unsigned n = mysql_num_fields(res);
      while (MYSQL_ROW row = mysql_fetch_row(res)) {
        std::vector<std::string> cells;
        unsigned long* len = mysql_fetch_lengths(res);
        for (unsigned i = 0; i < n; ++i) cells.emplace_back(row[i] ? std::string(row[i], len[i]) : "NULL");
        rows.push_back(std::move(cells));
      }
      mysql_free_result(res);
    } else if (mysql_field_count(c.m) != 0) {
      throw std::runtime_error("mariadbd failed '" + sql + "': " + mysql_error(c.m));
    }
    int next = mysql_next_result(c.m);
    if (next > 0) throw std::runtime_error("mariadbd refused '" + sql + "': " + mysql_error(c.m));
    if (next < 0) break;
  } while (true);
  return rows;
}

std::string MariaDbServer::log_tail() const {
  std::ifstream log(dir_ + "/error.log");
  std::stringstream s;
  s << log.rdbuf();
  std::string all = s.str();
  return all.size() > 4096 ? all.substr(all.size() - 4096) : all;
}

}  // namespace lockwatch::testing
