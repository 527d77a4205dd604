#include "redis_server.hpp"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kStartTimeout = 10s;
constexpr auto kStopTimeout = 10s;
// How long start() keeps retrying a port someone else still holds.
constexpr auto kRebindTimeout = 5s;
constexpr int kPortAttempts = 5;
constexpr std::size_t kLogTailBytes = 4096;

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// Closes a descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) noexcept : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// The child's dup2() calls onto 0, 1 and 2 must not clobber a source that
// happens to sit there (when the test runs with a standard stream closed).
Fd above_std_streams(int fd) {
  if (fd < 0 || fd > 2) return Fd(fd);
  int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int saved = errno;
  ::close(fd);
  errno = saved;
  if (moved < 0) throw_errno("fcntl(F_DUPFD_CLOEXEC)");
  return Fd(moved);
}

bool is_executable_file(const std::string& path) {
  std::error_code ec;
  return ::access(path.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(path, ec);
}

// Resolved in the parent so that the child runs only async-signal-safe code
// between fork() and exec.
std::optional<std::string> find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (is_executable_file(name)) return name;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t begin = 0;
  while (begin <= dirs.size()) {
    std::size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(begin, end - begin);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    begin = end + 1;
  }
  return std::nullopt;
}

std::string find_redis_server() {
  if (is_executable_file("/usr/bin/redis-server")) return "/usr/bin/redis-server";
  if (auto found = find_executable("redis-server")) return *found;
  throw std::runtime_error(
      "redis-server not found (looked at /usr/bin/redis-server and PATH); "
      "the Redis tests need it installed and do not skip without it");
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// This process's environment with `extra` entries ("NAME=value") replacing
// those of the same name.
std::vector<std::string> merged_environment(const std::vector<std::string>& extra) {
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    bool replaced = std::any_of(extra.begin(), extra.end(), [&](const std::string& x) {
      return name_of(x) == name_of(entry);
    });
    if (!replaced) env.push_back(std::move(entry));
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

struct SpawnFds {
  int in;   // becomes the child's 0
  int out;  // becomes the child's 1
  int err;  // becomes the child's 2
};

// fork/exec `path` with `argv` and `env`. Only async-signal-safe calls run in
// the child, because other threads of the test may hold locks at fork time.
// Throws std::runtime_error when exec fails (reported back through a
// close-on-exec pipe that stays silent on success).
pid_t spawn(const std::string& path, std::vector<std::string> argv, std::vector<std::string> env,
            SpawnFds fds) {
  std::vector<char*> argv_c = c_strings(argv);
  std::vector<char*> env_c = c_strings(env);

  int report_pipe[2];
  if (::pipe2(report_pipe, O_CLOEXEC) != 0) throw_errno("pipe2");
  Fd report_read(report_pipe[0]);
  Fd report_write = above_std_streams(report_pipe[1]);

  // PR_SET_PDEATHSIG fires when the forking *thread* exits, so it is only
  // safe to ask for it from the main thread, whose end is the process's end.
  const bool die_with_parent = ::gettid() == ::getpid();
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    if (die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    }
    // Undo what the test may have changed for itself: blocked signals and an
    // ignored SIGPIPE survive exec.
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &dfl, nullptr);

    const int targets[3] = {fds.in, fds.out, fds.err};
    for (int target = 0; target < 3; ++target) {
      int source = targets[target];
      if (source == target) {
        int flags = ::fcntl(source, F_GETFD);
        if (flags >= 0) ::fcntl(source, F_SETFD, flags & ~FD_CLOEXEC);
      } else if (::dup2(source, target) < 0) {
        int e = errno;
        (void)!::write(report_write.get(), &e, sizeof e);
        ::_exit(127);
      }
    }
    // Descriptors the test opened without O_CLOEXEC must not leak into the
    // child (a server holding a test's pipe would keep its reader waiting).
    const unsigned keep = static_cast<unsigned>(report_write.get());
    if (keep > 3) ::syscall(SYS_close_range, 3u, keep - 1, 0u);
    ::syscall(SYS_close_range, keep + 1, ~0u, 0u);

    ::execve(path.c_str(), argv_c.data(), env_c.data());
    int e = errno;
    (void)!::write(report_write.get(), &e, sizeof e);
    ::_exit(127);
  }

  report_write.reset();
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report_read.get(), &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw std::runtime_error("cannot start " + path + ": " + std::strerror(child_errno));
  }
  return pid;
}

// Reaps `pid`, blocking; returns its wait status.
int reap(pid_t pid) noexcept {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 0;
  }
  return status;
}

// Waits at most `timeout` for `pid` to exit and reaps it. A pidfd makes the
// wait a poll() on process exit; kernels without pidfd_open fall back to
// checking every few milliseconds.
bool wait_for_exit(pid_t pid, std::chrono::milliseconds timeout, int* status) {
  const auto deadline = Clock::now() + timeout;
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0u)));
  for (;;) {
    pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno != EINTR) throw_errno("waitpid");
    const auto now = Clock::now();
    if (now >= deadline) return false;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    if (pidfd.get() >= 0) {
      pollfd p{pidfd.get(), POLLIN, 0};
      (void)::poll(&p, 1, static_cast<int>(left.count()));
    } else {
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(left, 5ms));
    }
  }
}

std::string read_tail(const std::string& path, std::uintmax_t from = 0,
                      std::size_t max_bytes = kLogTailBytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::uintmax_t size = static_cast<std::uintmax_t>(in.tellg());
  std::uintmax_t begin = std::max<std::uintmax_t>(from, size > max_bytes ? size - max_bytes : 0);
  if (begin >= size) return {};
  in.seekg(static_cast<std::streamoff>(begin));
  std::string out(static_cast<std::size_t>(size - begin), '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<std::size_t>(in.gcount()));
  return out;
}

std::uintmax_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + ::strsignal(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

Reply copy_reply(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::kArray;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(copy_reply(r->element[i]));
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_NIL:
      out.type = Reply::Type::kNil;
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Reply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    default:
      // Only RESP2 is spoken here (no HELLO 3), so this means a hiredis
      // newer than the one we know; say so rather than guess.
      out.type = Reply::Type::kError;
      out.str = "unsupported reply type " + std::to_string(r->type);
      break;
  }
  return out;
}

ContextPtr connect(const std::string& host, int port, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  return ContextPtr(redisConnectWithTimeout(host.c_str(), port, tv));
}

// Runs `args` on `c`; null on a connection or protocol failure.
ReplyPtr run(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> argvlen;
  argv.reserve(args.size());
  argvlen.reserve(args.size());
  for (const std::string& a : args) {
    argv.push_back(a.data());
    argvlen.push_back(a.size());
  }
  return ReplyPtr(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), argvlen.data())));
}

}  // namespace

int free_loopback_port() {
  Fd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) throw_errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw_errno("bind 127.0.0.1:0");
  }
  socklen_t len = sizeof addr;
  if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw_errno("getsockname");
  }
  return ntohs(addr.sin_port);
}

std::string make_temp_dir(std::string_view name) {
  std::string pattern = (std::filesystem::temp_directory_path() / (std::string(name) + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) throw_errno("mkdtemp " + pattern);
  return pattern;
}

void remove_at_exit(std::string dir) {
  struct Dirs {
    std::mutex mutex;
    std::vector<std::string> list;
    ~Dirs() {
      std::error_code ec;
      for (const auto& d : list) std::filesystem::remove_all(d, ec);
    }
  };
  static Dirs dirs;
  std::lock_guard lock(dirs.mutex);
  dirs.list.push_back(std::move(dir));
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

char process_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(stat, s);
  auto close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() ? s[close + 2] : '\0';
}

std::string find_program(const char* name, const char* needs) {
  const std::string debian = std::string("/usr/bin/") + name;
  if (::access(debian.c_str(), X_OK) == 0) return debian;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  throw std::runtime_error(std::string(name) + " not found (looked in /usr/bin and PATH); the tests need " + needs +
                           ", and do not skip without it");
}

namespace {

// Runs openssl with `args` in `dir`; throws with its output on failure.
void run_openssl(const std::string& dir, std::vector<std::string> args) {
  std::string cmd = "cd '" + dir + "' && openssl";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " >openssl.log 2>&1";
  if (std::system(cmd.c_str()) != 0)
    throw std::runtime_error("openssl failed: " + cmd + "\n" + read_tail(dir + "/openssl.log"));
}

struct CertificatesDir {
  TestCertificates certs;
  ~CertificatesDir() {
    std::error_code ec;
    if (!certs.dir.empty()) std::filesystem::remove_all(certs.dir, ec);
  }
};

// A key and a certificate for `cn` with `san`, signed by the CA in `ca`
// (its .crt, .key and .cnf), valid from `start` to `end` (openssl ca's
// YYMMDDHHMMSSZ) or for a year.
void issue(const std::string& dir, const std::string& ca, const std::string& name, const std::string& cn,
           const std::string& san, const std::string& start = {}, const std::string& end = {}) {
  run_openssl(dir, {"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                    name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn, "-addext", "subjectAltName=" + san});
  std::vector<std::string> args = {"ca", "-batch", "-notext", "-config", ca + ".cnf", "-cert", ca + ".crt",
                                   "-keyfile", ca + ".key", "-in", name + ".csr", "-out", name + ".crt"};
  if (start.empty()) {
    args.insert(args.end(), {"-days", "365"});
  } else {
    args.insert(args.end(), {"-startdate", start, "-enddate", end});
  }
  run_openssl(dir, args);
}

void make_ca(const std::string& dir, const std::string& ca) {
  const std::string db = dir + "/" + ca + "-db";
  std::filesystem::create_directories(db);
  std::ofstream(db + "/index.txt").close();
  std::ofstream(db + "/serial") << "1000\n";
  std::ofstream(dir + "/" + ca + ".cnf") << "[ca]\ndefault_ca = this_ca\n"
                                         << "[this_ca]\ndatabase = " << db << "/index.txt\n"
                                         << "new_certs_dir = " << db << "\nserial = " << db << "/serial\n"
                                         << "default_md = sha256\npolicy = any\ncopy_extensions = copy\n"
                                         << "unique_subject = no\n[any]\ncommonName = supplied\n";
  run_openssl(dir, {"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", ca + ".key", "-out", ca + ".crt", "-days", "3650", "-subj", "/CN=lockwatch test " + ca});
}

}  // namespace

const TestCertificates& test_certificates() {
  static CertificatesDir made = [] {
    CertificatesDir m;
    const std::string d = make_temp_dir("lockwatch-tls");
    m.certs.dir = d;
    make_ca(d, "ca");
    make_ca(d, "other-ca");
    const std::string here = "IP:127.0.0.1,DNS:localhost";
    issue(d, "ca", "server", "127.0.0.1", here);
    issue(d, "ca", "client", "lockwatch test client", "DNS:client.example");
    issue(d, "other-ca", "untrusted", "127.0.0.1", here);
    issue(d, "ca", "wrong-name", "wrong.example", "DNS:wrong.example");
    issue(d, "ca", "expired", "127.0.0.1", here, "200101000000Z", "200201000000Z");
    auto& c = m.certs;
    c.ca_cert = d + "/ca.crt";
    c.server_cert = d + "/server.crt", c.server_key = d + "/server.key";
    c.client_cert = d + "/client.crt", c.client_key = d + "/client.key";
    c.untrusted_cert = d + "/untrusted.crt", c.untrusted_key = d + "/untrusted.key";
    c.wrong_name_cert = d + "/wrong-name.crt", c.wrong_name_key = d + "/wrong-name.key";
    c.expired_cert = d + "/expired.crt", c.expired_key = d + "/expired.key";
    return m;
  }();
  return made.certs;
}

RedisServer::RedisServer(RedisServerOptions options) : options_(std::move(options)) {
  binary_ = find_redis_server();
  dir_ = make_temp_dir("lockwatch-redis");
  try {
    // The port was only free when we looked; another process may take it
    // before the server binds it, so pick a fresh one and try again.
    for (int attempt = 0; attempt < kPortAttempts; ++attempt) {
      port_ = free_loopback_port();
      if (options_.tls) command_port_ = free_loopback_port();
      if (try_start()) return;
    }
    throw std::runtime_error("redis-server could not bind a free loopback port in " +
                             std::to_string(kPortAttempts) + " attempts; log tail:\n" + log_tail());
  } catch (...) {
    kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    throw;
  }
}

RedisServer::~RedisServer() {
  kill();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string RedisServer::url() const {
  std::string hostport = host_ + ":" + std::to_string(port_);
  std::string scheme = options_.tls ? "rediss://" : "redis://";
  if (options_.password.empty()) return scheme + hostport;
  return scheme + ":" + options_.password + "@" + hostport;
}

void RedisServer::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  reap(pid_);
  pid_ = -1;
}

void RedisServer::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  ::kill(pid_, SIGCONT);  // a paused server cannot act on SIGTERM
  int status = 0;
  if (wait_for_exit(pid_, kStopTimeout, &status)) {
    pid_ = -1;
    return;
  }
  kill();
}

void RedisServer::start() {
  if (running()) return;
  kill();  // reaps a server that exited by itself
  const auto deadline = Clock::now() + kRebindTimeout;
  while (!try_start()) {
    if (Clock::now() >= deadline) {
      throw std::runtime_error("redis-server could not bind 127.0.0.1:" + std::to_string(port_) +
                               " again; log tail:\n" + log_tail());
    }
    // The old socket lingers or another process took the port; this is a
    // process start, so waiting a little and trying again is the only option.
    std::this_thread::sleep_for(50ms);
  }
}

void RedisServer::pause() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}

void RedisServer::resume() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}

bool RedisServer::running() const {
  if (pid_ <= 0) return false;
  siginfo_t info{};
  // WNOWAIT: look without reaping, so that kill()/stop() still own the reap.
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return false;
  }
  return info.si_pid == 0;
}

bool RedisServer::try_start() {
  const std::string log_path = dir_ + "/redis.log";
  const std::string out_path = dir_ + "/stdout.log";
  const std::uintmax_t log_offset = file_size_or_zero(log_path);

  std::vector<std::string> args = {
      binary_,  "--port",    std::to_string(port_), "--bind",      host_,
      "--dir",  dir_,        "--logfile",           log_path,      "--daemonize",
      "no",
  };
  if (options_.tls) {
    const TestCertificates& certs = test_certificates();
    const RedisTls& t = *options_.tls;
    args[2] = std::to_string(command_port_);
    args.insert(args.end(), {"--tls-port", std::to_string(port_), "--tls-cert-file",
                             t.cert_file.empty() ? certs.server_cert : t.cert_file, "--tls-key-file",
                             t.key_file.empty() ? certs.server_key : t.key_file, "--tls-ca-cert-file",
                             certs.ca_cert, "--tls-auth-clients", t.auth_clients ? "yes" : "no"});
  }
  if (options_.appendonly) {
    args.insert(args.end(), {"--appendonly", "yes", "--appendfsync", "always", "--save", ""});
  } else {
    args.insert(args.end(), {"--appendonly", "no", "--save", ""});
  }
  if (!options_.password.empty()) args.insert(args.end(), {"--requirepass", options_.password});
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());

  Fd in = above_std_streams(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) throw_errno("open /dev/null");
  // Errors before the log file is open (a bad option) go to stdout/stderr.
  Fd out = above_std_streams(::open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (out.get() < 0) throw_errno("open " + out_path);
  pid_ = spawn(binary_, std::move(args), merged_environment({}), {in.get(), out.get(), out.get()});

  const auto deadline = Clock::now() + kStartTimeout;
  for (;;) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (read_tail(log_path, log_offset).find("already in use") != std::string::npos) {
        return false;
      }
      throw std::runtime_error("redis-server exited during startup (" + describe_status(status) +
                               "); log tail:\n" + log_tail());
    }
    {
      ContextPtr c = connect(host_, options_.tls ? command_port_ : port_, 200ms);
      if (c && c->err == 0) {
        bool authed = true;
        if (!options_.password.empty()) {
          ReplyPtr auth = run(c.get(), {"AUTH", options_.password});
          authed = auth && auth->type == REDIS_REPLY_STATUS;
        }
        if (authed) {
          ReplyPtr pong = run(c.get(), {"PING"});
          if (pong && pong->type == REDIS_REPLY_STATUS) return true;
        }
      }
    }
    if (Clock::now() >= deadline) {
      kill();
      throw std::runtime_error("redis-server did not answer PING on port " + std::to_string(port_) +
                               " within 10 s; log tail:\n" + log_tail());
    }
    // Polling is acceptable here only: nothing signals "ready" from a
    // freshly started process.
    std::this_thread::sleep_for(10ms);
  }
}

std::string RedisServer::log_tail() const {
  std::string out;
  for (const char* name : {"redis.log", "stdout.log"}) {
    std::string tail = read_tail(dir_ + "/" + name);
    if (!tail.empty()) out += std::string("[") + name + "]\n" + tail + "\n";
  }
  return out.empty() ? "(empty)" : out;
}

Reply RedisServer::command(const std::vector<std::string>& args) const {
  if (args.empty()) throw std::invalid_argument("RedisServer::command: no arguments");
  const int port = options_.tls ? command_port_ : port_;
  const std::string where = host_ + ":" + std::to_string(port);
  ContextPtr c = connect(host_, port, 2s);
  if (!c) throw std::runtime_error("cannot allocate a hiredis context for " + where);
  if (c->err != 0) throw std::runtime_error("cannot connect to " + where + ": " + c->errstr);
  timeval reply_timeout{10, 0};
  redisSetTimeout(c.get(), reply_timeout);
  if (!options_.password.empty()) {
    ReplyPtr auth = run(c.get(), {"AUTH", options_.password});
    if (!auth) throw std::runtime_error("AUTH to " + where + " failed: " + c->errstr);
    if (auth->type == REDIS_REPLY_ERROR) {
      throw std::runtime_error("AUTH to " + where + " refused: " + std::string(auth->str, auth->len));
    }
  }
  ReplyPtr reply = run(c.get(), args);
  if (!reply) throw std::runtime_error(args[0] + " to " + where + " failed: " + c->errstr);
  return copy_reply(reply.get());
}

ChildProcess::ChildProcess(std::vector<std::string> argv, std::vector<std::string> extra_env, bool piped_stdin) {
  if (argv.empty()) throw std::invalid_argument("ChildProcess: empty argv");
  std::optional<std::string> path = find_executable(argv[0]);
  if (!path) throw std::runtime_error("ChildProcess: cannot find executable " + argv[0]);

  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw_errno("pipe2");
  Fd write_raw(out_pipe[1]);
  Fd read_end = above_std_streams(out_pipe[0]);
  Fd write_end = above_std_streams(write_raw.release());

  int in_pipe[2] = {-1, -1};
  if (piped_stdin && ::pipe2(in_pipe, O_CLOEXEC) != 0) throw_errno("pipe2");
  Fd to_child = piped_stdin ? above_std_streams(in_pipe[1]) : Fd();
  Fd in = piped_stdin ? above_std_streams(in_pipe[0]) : above_std_streams(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) throw_errno("open /dev/null");
  pid_ = spawn(*path, std::move(argv), merged_environment(extra_env),
               {in.get(), write_end.get(), STDERR_FILENO});
  stdout_fd_ = read_end.release();
  stdin_fd_ = to_child.release();
}

bool ChildProcess::write_line(const std::string& line) {
  if (stdin_fd_ < 0) return false;
  const std::string out = line + "\n";
  std::size_t done = 0;
  while (done < out.size()) {
    // MSG_NOSIGNAL is for sockets: a closed pipe is EPIPE here only if
    // SIGPIPE is ignored, so the child's end is checked first.
    pollfd p{stdin_fd_, POLLOUT, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0) return false;
    const ssize_t n = ::write(stdin_fd_, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

void ChildProcess::close_stdin() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  stdin_fd_ = -1;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    reap(pid_);
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
}

std::optional<std::string> ChildProcess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (std::size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (stdout_closed_) {
      if (buffer_.empty()) return std::nullopt;
      return std::exchange(buffer_, std::string());
    }
    const auto now = Clock::now();
    const auto left = now >= deadline ? 0ms : std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    pollfd p{stdout_fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw_errno("poll");
    }
    if (ready == 0) return std::nullopt;
    char chunk[4096];
    ssize_t n = ::read(stdout_fd_, chunk, sizeof chunk);
    if (n > 0) {
      buffer_.append(chunk, static_cast<std::size_t>(n));
    } else if (n == 0) {
      stdout_closed_ = true;
    } else if (errno != EINTR && errno != EAGAIN) {
      throw_errno("read child stdout");
    }
  }
}

int ChildProcess::wait(std::chrono::milliseconds timeout) {
  if (!reaped_) {
    if (!wait_for_exit(pid_, timeout, &status_)) {
      ::kill(pid_, SIGKILL);
      status_ = reap(pid_);
      reaped_ = true;
      throw std::runtime_error("child " + std::to_string(pid_) + " did not exit within " +
                               std::to_string(timeout.count()) + " ms; killed it");
    }
    reaped_ = true;
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

void ChildProcess::kill(int sig) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

}  // namespace lockwatch::testing
