#include "zookeeper_ensemble.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

// The client's blocking calls are declared for its threaded library only.
#define THREADED 1
#include <zookeeper/zookeeper.h>

#include "redis_server.hpp"

namespace lockwatch::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct ZooKeeperEnsemble::Member {
  int client_port = 0;
  int peer_port = 0;
  int election_port = 0;
  bool paused = false;
  std::unique_ptr<ChildProcess> process;
};

namespace {

constexpr const char* kJava = "/usr/bin/java";
constexpr const char* kJar = "/usr/share/java/zookeeper.jar";

// A four-letter word's answer, or empty after `bound` (a paused member
// accepts the connection in the kernel and never answers).
std::string four_letters(int port, const char* word, std::chrono::milliseconds bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto until = std::chrono::steady_clock::now() + bound;
  auto left = [&] {
    return static_cast<int>(std::max<long long>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count()));
  };
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return {};
  }
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, left()) != 1 || (p.revents & POLLOUT) == 0) {
    ::close(fd);
    return {};
  }
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0 || ::send(fd, word, 4, MSG_NOSIGNAL) != 4) {
    ::close(fd);
    return {};
  }
  for (;;) {
    pollfd q{fd, POLLIN, 0};
    if (::poll(&q, 1, left()) != 1) break;
    char buf[1024];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      ::close(fd);
      return out;  // the server closes after its answer
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return {};
}

}  // namespace

ZooKeeperEnsemble::ZooKeeperEnsemble(int members, Timing timing) {
  if (::access(kJava, X_OK) != 0 || ::access(kJar, R_OK) != 0)
    throw std::runtime_error(std::string("ZooKeeper's tests need ") + kJava + " and " + kJar +
                             " (Debian's zookeeper package) and do not skip without them");
  dir_ = make_temp_dir("lockwatch-zk");
  try {
    for (int i = 0; i < members; ++i) {
      auto m = std::make_unique<Member>();
      // Distinct ports: a free port is free only until someone binds it.
      for (int* port : {&m->client_port, &m->peer_port, &m->election_port}) {
        for (;;) {
          int p = free_loopback_port();
          bool taken = false;
          for (const auto& other : members_)
            taken = taken || p == other->client_port || p == other->peer_port || p == other->election_port;
          taken = taken || p == m->client_port || p == m->peer_port;
          if (!taken) {
            *port = p;
            break;
          }
        }
      }
      members_.push_back(std::move(m));
    }
    std::string servers;
    for (int i = 0; i < members; ++i)
      servers += "server." + std::to_string(i + 1) + "=127.0.0.1:" + std::to_string(members_[i]->peer_port) + ":" +
                 std::to_string(members_[i]->election_port) + "\n";
    for (int i = 0; i < members; ++i) {
      const std::string data = dir_ + "/" + std::to_string(i + 1);
      fs::create_directories(data);
      std::ofstream(data + "/myid") << (i + 1) << "\n";
      std::ofstream cfg(dir_ + "/zoo" + std::to_string(i + 1) + ".cfg");
      cfg << "tickTime=100\ninitLimit=50\nsyncLimit=" << (timing == Timing::kSteady ? 30 : 5) << "\n"
          << "dataDir=" << data << "\n"
          << "clientPort=" << members_[i]->client_port << "\nclientPortAddress=127.0.0.1\n"
          << "minSessionTimeout=200\nmaxSessionTimeout=60000\n"
          << "admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok,wchp\n"
          << "forceSync=no\npreAllocSize=1024\nmaxClientCnxns=0\n"
          << servers;
    }
    for (int i = 0; i < members; ++i) spawn(i);
    if (!wait_serving()) throw std::runtime_error("the ZooKeeper ensemble did not serve within 60 s: " + log_tail(0));
  } catch (...) {
    for (auto& m : members_)
      if (m->process) m->process->kill(SIGKILL);
    members_.clear();
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

ZooKeeperEnsemble::~ZooKeeperEnsemble() {
  for (int i = 0; i < size(); ++i) {
    try {
      kill(i);
    } catch (...) {
    }
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void ZooKeeperEnsemble::spawn(int i) {
  const std::string n = std::to_string(i + 1);
  // A small, quick JVM: three of them share the test machine.
  members_[i]->process = std::make_unique<ChildProcess>(std::vector<std::string>{
      "/bin/sh", "-c",
      std::string("exec setpriv --pdeathsig KILL ") + kJava +
          " -Xmx96m -Xss512k -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dzookeeper.jmx.log4j.disable=true"
          " -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dorg.slf4j.simpleLogger.showDateTime=true"
          " -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS -cp " + kJar +
          ":/usr/share/java/slf4j-simple.jar org.apache.zookeeper.server.quorum.QuorumPeerMain " +
          dir_ + "/zoo" + n + ".cfg >>" + dir_ + "/server" + n + ".log 2>&1"});
  members_[i]->paused = false;
}

int ZooKeeperEnsemble::client_port(int i) const { return members_.at(i)->client_port; }

std::string ZooKeeperEnsemble::hosts(int except) const {
  std::string out;
  for (int i = 0; i < size(); ++i) {
    if (i == except) continue;
    if (!out.empty()) out += ',';
    out += "127.0.0.1:" + std::to_string(members_[i]->client_port);
  }
  return out;
}

void ZooKeeperEnsemble::kill(int i) {
  auto& m = *members_.at(i);
  if (!m.process) return;
  m.process->kill(SIGKILL);
  m.process->wait(10000ms);
  m.process.reset();
  m.paused = false;
}

void ZooKeeperEnsemble::start(int i) {
  if (members_.at(i)->process) return;
  spawn(i);
}

void ZooKeeperEnsemble::pause(int i) {
  auto& m = *members_.at(i);
  if (!m.process) return;
  m.process->kill(SIGSTOP);
  m.paused = true;
  auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    char s = process_state(m.process->pid());
    if (s == 'T' || s == 't' || s == '\0' || s == 'Z') return;
    std::this_thread::sleep_for(1ms);  // the kernel stops it as it next runs: no event to wait on
  }
  throw std::runtime_error("a ZooKeeper member did not stop");
}

void ZooKeeperEnsemble::resume(int i) {
  auto& m = *members_.at(i);
  if (!m.process) return;
  m.process->kill(SIGCONT);
  m.paused = false;
}

bool ZooKeeperEnsemble::running(int i) const {
  const auto& m = *members_.at(i);
  if (!m.process) return false;
  char s = process_state(m.process->pid());
  return s != '\0' && s != 'Z';
}

std::string ZooKeeperEnsemble::mode(int i) const {
  if (!running(i) || members_.at(i)->paused) return {};
  std::string answer = four_letters(client_port(i), "srvr", 500ms);
  auto at = answer.find("Mode: ");
  if (at == std::string::npos) return {};
  auto end = answer.find('\n', at);
  return answer.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6);
}

int ZooKeeperEnsemble::leader(std::chrono::milliseconds bound) const {
  auto until = std::chrono::steady_clock::now() + bound;
  do {
    for (int i = 0; i < size(); ++i)
      if (mode(i) == "leader") return i;
    std::this_thread::sleep_for(50ms);  // an election under way: no event to wait on
  } while (std::chrono::steady_clock::now() < until);
  return -1;
}

bool ZooKeeperEnsemble::wait_watched(const std::string& path, std::chrono::milliseconds bound) const {
  auto until = std::chrono::steady_clock::now() + bound;
  do {
    for (int i = 0; i < size(); ++i) {
      if (!running(i) || members_[i]->paused) continue;
      // `wchp`: each watched path on a line of its own, its sessions below.
      std::istringstream answer(four_letters(client_port(i), "wchp", 500ms));
      for (std::string line; std::getline(answer, line);)
        if (line == path) return true;
    }
    std::this_thread::sleep_for(20ms);  // a client's watch is set inside the member: no event to wait on
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

bool ZooKeeperEnsemble::wait_serving(std::chrono::milliseconds bound) const {
  auto until = std::chrono::steady_clock::now() + bound;
  do {
    bool all = true;
    for (int i = 0; i < size() && all; ++i)
      if (running(i) && !members_[i]->paused) all = !mode(i).empty();
    if (all) return true;
    std::this_thread::sleep_for(50ms);  // members starting: no event to wait on
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

std::string ZooKeeperEnsemble::log_tail(int i) const {
  std::ifstream log(dir_ + "/server" + std::to_string(i + 1) + ".log");
  std::stringstream s;
  s << log.rdbuf();
  std::string kept, line;
  while (std::getline(s, line))
    if (line.rfind("\tat ", 0) != 0 && line.rfind("\t... ", 0) != 0) kept += line + "\n";
  return kept.size() > 4096 ? kept.substr(kept.size() - 4096) : kept;
}

namespace {
void no_log(const char*) {}
void check(int rc, const char* what) {
  if (rc != ZOK) throw std::runtime_error(std::string("zookeeper ") + what + ": " + zerror(rc));
}
}  // namespace

ZooKeeperClient::ZooKeeperClient(const std::string& hosts, const std::string& digest) {
  zh_ = zookeeper_init2(hosts.c_str(), nullptr, 10000, nullptr, nullptr, 0, no_log);
  if (zh_ == nullptr) throw std::runtime_error("zookeeper_init failed for " + hosts);
  auto until = std::chrono::steady_clock::now() + 10s;
  while (zoo_state(zh_) != ZOO_CONNECTED_STATE) {
    if (std::chrono::steady_clock::now() > until) {
      zookeeper_close(zh_);
      throw std::runtime_error("no ZooKeeper session with " + hosts + " within 10 s");
    }
    std::this_thread::sleep_for(5ms);  // the client's own thread connects: no event handed to us
  }
  if (!digest.empty()) check(zoo_add_auth(zh_, "digest", digest.data(), static_cast<int>(digest.size()), nullptr, nullptr), "add_auth");
}

ZooKeeperClient::~ZooKeeperClient() {
  if (zh_ != nullptr) zookeeper_close(zh_);
}

std::vector<std::string> ZooKeeperClient::children(const std::string& path) {
  String_vector v{};
  int rc = zoo_get_children(zh_, path.c_str(), 0, &v);
  std::vector<std::string> out;
  if (rc == ZNONODE) return out;
  check(rc, "get_children");
  for (int i = 0; i < v.count; ++i) out.emplace_back(v.data[i]);
  deallocate_String_vector(&v);
  return out;
}

std::optional<std::string> ZooKeeperClient::get(const std::string& path) {
  std::string buf(1 << 16, '\0');
  int len = static_cast<int>(buf.size());
  int rc = zoo_get(zh_, path.c_str(), 0, buf.data(), &len, nullptr);
  if (rc == ZNONODE) return std::nullopt;
  check(rc, "get");
  buf.resize(len < 0 ? 0 : static_cast<std::size_t>(len));
  return buf;
}

void ZooKeeperClient::remove(const std::string& path) {
  int rc = zoo_delete(zh_, path.c_str(), -1);
  if (rc != ZNONODE) check(rc, "delete");
}

std::string ZooKeeperClient::create_ephemeral_sequential(const std::string& prefix, const std::string& data) {
  std::string made(prefix.size() + 64, '\0');
  check(zoo_create(zh_, prefix.c_str(), data.data(), static_cast<int>(data.size()), &ZOO_CREATOR_ALL_ACL,
                   ZOO_EPHEMERAL_SEQUENTIAL, made.data(), static_cast<int>(made.size())),
        "create");
  made.resize(std::strlen(made.c_str()));
  return made;
}

long long ZooKeeperClient::touch(const std::string& path) {
  Stat st{};
  check(zoo_set2(zh_, path.c_str(), "", 0, -1, &st), "set");
  return st.mtime;
}

}  // namespace lockwatch::testing
