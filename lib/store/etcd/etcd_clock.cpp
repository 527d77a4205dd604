#include "store/etcd/etcd_clock.hpp"

#include <netdb.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#if LOCKWATCH_WITH_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <utility>

#include "core/loop.hpp"
#include "core/tls.hpp"

namespace lockwatch::detail {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using std::chrono::system_clock;

struct EtcdClock::State {
  bool have = false;
  milliseconds offset{0};
  milliseconds uncertainty{0};
  steady_clock::time_point measured_at{};
  bool measuring = false;
  std::vector<Done> waiting;
  bool closed = false;
  LocalClock local;
  std::string name;  // the store's, for errors

  void measured(const Measured& m) {
    measuring = false;
    if (closed) return;
    if (m.ok) {
      have = true;
      offset = m.offset;
      uncertainty = m.uncertainty;
      measured_at = steady_clock::now();
    }
    // A background refresh that failed keeps the offset until kMaxAge.
    for (auto& done : std::exchange(waiting, {})) m.ok ? done(local() + offset, nullptr) : done({}, &m.error);
  }
  // Answers `done` now: the clock, or that the store is closed.
  void answer(const Done& done) const {
    if (!closed) return done(local() + offset, nullptr);
    const auto e = StoreError::unavailable(name, "the store is closed");
    done({}, &e);
  }
};

namespace {

// "Wed, 25 Nov 2026 09:35:30 GMT" (RFC 7231's IMF-fixdate, the only form
// Go writes) as seconds since the epoch; nothing if it is not one.
std::optional<std::int64_t> parse_http_date(std::string_view s) {
  std::tm tm{};
  if (::strptime(std::string(s).c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm) == nullptr || tm.tm_year < 70)
    return std::nullopt;
  return static_cast<std::int64_t>(::timegm(&tm));
}

// The value of header `name` (case-insensitive) in `head`, trimmed.
std::optional<std::string_view> header(std::string_view head, std::string_view name) {
  for (std::size_t at = head.find("\r\n"); at != std::string_view::npos && at + 2 < head.size();) {
    const std::size_t start = at + 2;
    at = std::min(head.find("\r\n", start), head.size());
    std::string_view line = head.substr(start, at - start);
    auto colon = line.find(':');
    if (colon == name.size() && ::strncasecmp(line.data(), name.data(), name.size()) == 0) {
      const auto first = std::min(line.find_first_not_of(" \t", colon + 1), line.size());
      return line.substr(first, line.find_last_not_of(" \t") + 1 - first);
    }
  }
  return std::nullopt;
}

// Gives up a step with `text` as the reason.
bool failed(std::string& why, std::string text) {
  why = std::move(text);
  return false;
}

}  // namespace

// One kept-alive HTTP/1.1 connection to a member, plain or TLS (OpenSSL on
// the socket itself). The socket does not block: every step waits for it
// with poll, bounded by a deadline, and gives up early when the clock stops.
struct EtcdClock::Conn {
  EtcdClock& clock;
  std::stop_token stop;
  int fd = -1;
  SSL* ssl = nullptr;
  std::string in;  // read and not yet consumed

  ~Conn() {
#if LOCKWATCH_WITH_TLS
    if (ssl != nullptr) SSL_free(ssl);
#endif
    if (fd >= 0) ::close(fd);
  }

  // Waits until fd is ready for `events`, in slices, so that a stop is seen.
  bool wait(short events, steady_clock::time_point deadline, std::string& why) {
    for (;;) {
      if (stop.stop_requested()) return failed(why, "the store is closing");
      auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
      if (left <= milliseconds(0)) return failed(why, "no answer in time");
      pollfd p{fd, events, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 50)));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return failed(why, std::strerror(errno));
    }
  }

  // Runs `op` (a socket call, SSL_connect, SSL_write, SSL_read) until it
  // moves bytes, waiting for the socket as it asks (`plain`: what a socket
  // call waits for); 0 when it failed.
  template <class Op>
  int io(Op op, short plain, steady_clock::time_point deadline, std::string& why) {
    for (;;) {
#if LOCKWATCH_WITH_TLS
      ERR_clear_error();
#endif
      const int r = static_cast<int>(op());
      if (r > 0) return r;
      short events = plain;
#if LOCKWATCH_WITH_TLS
      if (ssl != nullptr) {
        const int e = SSL_get_error(ssl, r);
        events = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        if (events == 0) return failed(why, "TLS: " + tls_error_text(ssl));
      } else
#endif
      if (r == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
        return failed(why, r == 0 ? "the member closed the connection" : std::strerror(errno));
      if (!wait(events, deadline, why)) return 0;
    }
  }

  bool connect(const EtcdTarget::Member& m, steady_clock::time_point deadline, std::string& why) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(m.host.c_str(), std::to_string(m.port).c_str(), &hints, &found); rc != 0)
      return failed(why, std::string("cannot resolve: ") + ::gai_strerror(rc));
    why = "no address";
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        why = std::strerror(errno);
        continue;
      }
      int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (err == EINPROGRESS && wait(POLLOUT, deadline, why)) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      if (err == 0) break;
      if (err != EINPROGRESS) why = std::strerror(err);  // EINPROGRESS: wait() said why
      ::close(fd);
      fd = -1;
    }
    ::freeaddrinfo(found);
    if (fd < 0) return false;
#if LOCKWATCH_WITH_TLS
    if (clock.target_.tls) {
      ssl = clock.tls_->new_session(m.host, why);
      if (ssl == nullptr) return false;
      if (SSL_set_fd(ssl, fd) != 1) return failed(why, "TLS: " + tls_error_text(ssl));
      return io([this] { return SSL_connect(ssl); }, POLLOUT, deadline, why) > 0;
    }
#endif
    return true;
  }

  // Writes some of [p, p + n) (`write`), or reads some into it: how many
  // bytes (never none: the end of the stream fails), 0 when it failed.
  int transfer(char* p, std::size_t n, bool write, steady_clock::time_point deadline, std::string& why) {
    return io(
        [&]() -> long {
#if LOCKWATCH_WITH_TLS
          const int len = static_cast<int>(n);
          if (ssl != nullptr) return write ? SSL_write(ssl, p, len) : SSL_read(ssl, p, len);
#endif
          return write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
        },
        write ? POLLOUT : POLLIN, deadline, why);
  }

  // Some bytes into `in`.
  bool recv(steady_clock::time_point deadline, std::string& why) {
    char buf[4096];
    const int got = transfer(buf, sizeof buf, false, deadline, why);
    in.append(buf, static_cast<std::size_t>(got));
    return got > 0;
  }

  // One GET /version: the Date's second, and whether the connection may
  // be used again. False with `why` for anything but etcd's answer.
  bool get_version(const std::string& host, steady_clock::time_point deadline, std::int64_t& second,
                   bool& keep, std::string& why) {
    std::string request = "GET /version HTTP/1.1\r\nHost: " + host +
                          "\r\nUser-Agent: lockwatch\r\nAccept: application/json\r\n\r\n";
    for (std::size_t at = 0, sent = 0; at < request.size(); at += sent)
      if ((sent = transfer(request.data() + at, request.size() - at, true, deadline, why)) == 0) return false;
    std::size_t end;
    while ((end = in.find("\r\n\r\n")) == std::string::npos) {
      if (in.size() > 64 * 1024) return failed(why, "an answer that is not HTTP");
      if (!recv(deadline, why)) return false;
    }
    const std::string head = in.substr(0, end);
    in.erase(0, end + 4);
    if (head.rfind("HTTP/1.", 0) != 0 || head.size() < 12) return failed(why, "an answer that is not HTTP");
    if (head.compare(9, 3, "200") != 0)
      return failed(why, "GET /version answered " + head.substr(9, head.find("\r\n") - 9));
    auto date = header(head, "Date");
    auto parsed = date ? parse_http_date(*date) : std::nullopt;
    if (!parsed) return failed(why, "GET /version answered without a Date header");
    std::size_t length = 0;
    auto cl = header(head, "Content-Length");
    if (!cl || std::from_chars(cl->data(), cl->data() + cl->size(), length).ec != std::errc() ||
        length > 64 * 1024)
      return failed(why, "GET /version answered without a usable Content-Length");
    while (in.size() < length)
      if (!recv(deadline, why)) return false;
    const std::string body = in.substr(0, length);
    in.erase(0, length);
    if (body.find("\"etcdserver\"") == std::string::npos)
      return failed(why, "GET /version answered, but not as etcd does");
    auto connection = header(head, "Connection");
    keep = !(connection && (*connection == "close" || *connection == "Close"));
    second = *parsed;
    return true;
  }
};

EtcdClock::EtcdClock(Loop& loop, EtcdTarget target, const StoreSettings& settings, LocalClock local)
    : loop_(loop),
      target_(std::move(target)),
      connect_timeout_(settings.connection.connect_timeout),
      command_timeout_(settings.connection.command_timeout),
      state_(std::make_shared<State>()) {
  state_->local = local ? std::move(local) : LocalClock([] { return system_clock::now(); });
  state_->name = target_.name();
  if (target_.tls) {
    try {
      tls_ = TlsContext::make(settings.tls);
    } catch (const std::exception& e) {
      tls_error_ = e.what();
    }
  }
}

std::optional<system_clock::time_point> EtcdClock::estimate() const {
  if (!state_->have || steady_clock::now() - state_->measured_at > kMaxAge) return std::nullopt;
  return state_->local() + state_->offset;
}

milliseconds EtcdClock::uncertainty() const { return state_->uncertainty; }

void EtcdClock::now(Done done) {
  State& s = *state_;
  const auto age = steady_clock::now() - s.measured_at;
  if (s.closed || (s.have && age <= kMaxAge)) {
    if (!s.closed && age > kRefresh) want_measure();
    loop_.post([state = state_, done = std::move(done)] { state->answer(done); });
    return;
  }
  s.waiting.push_back(std::move(done));
  want_measure();
}

void EtcdClock::warm() {
  if (!state_->have && !state_->closed) want_measure();
}

void EtcdClock::want_measure() {
  State& s = *state_;
  if (s.measuring) return;
  s.measuring = true;
  if (!thread_.joinable()) thread_ = std::jthread([this](std::stop_token stop) { run(std::move(stop)); });
  {
    std::lock_guard lk(mu_);
    wanted_ = true;
  }
  cv_.notify_all();
}

void EtcdClock::close() {
  State& s = *state_;
  s.closed = true;
  thread_.request_stop();
  for (auto& done : std::exchange(s.waiting, {})) s.answer(done);
}

void EtcdClock::run(std::stop_token stop) {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, stop, [this] { return wanted_; });
      if (stop.stop_requested()) return;
      wanted_ = false;
    }
    Measured m = measure(stop);
    loop_.post([state = state_, m = std::move(m)] { state->measured(m); });
  }
}

EtcdClock::Measured EtcdClock::measure(std::stop_token stop) {
  if (target_.tls && !tls_)
    return {.error = StoreError::invalid(state_->name, "cannot read the members' clock over TLS: " + tls_error_)};
  std::string whys;
  for (const auto& member : target_.members) {
    Measured m = measure_member(member, stop);
    if (m.ok || stop.stop_requested()) return m;
    whys += (whys.empty() ? "" : "; ") + m.error.message;
  }
  return {.error = StoreError::unavailable(state_->name, "no member's clock could be read: " + whys)};
}

EtcdClock::Measured EtcdClock::measure_member(const EtcdTarget::Member& m, std::stop_token stop) {
  const std::string endpoint = (target_.tls ? "https://" : "http://") + m.address();
  auto fail = [&](const std::string& why) {
    return Measured{.error = StoreError::unavailable(state_->name, endpoint + ": " + why)};
  };
  std::unique_ptr<Conn> conn;
  std::string why;
  struct Sample {
    system_clock::time_point sent, answered;
    std::int64_t second = 0;
  };
  auto sample = [&](Sample& s) -> bool {
    if (!conn) {
      conn = std::make_unique<Conn>(*this, stop);
      if (!conn->connect(m, steady_clock::now() + connect_timeout_, why)) return false;
    }
    bool keep = true;
    s.sent = state_->local();
    bool ok = conn->get_version(m.address(), steady_clock::now() + command_timeout_, s.second, keep, why);
    s.answered = state_->local();
    if (!ok || !keep) conn.reset();
    return ok;
  };
  Sample prev;
  if (!sample(prev)) return fail(why);
  // Until the second changes: the change lies between the sending of the
  // last request that saw the old second and the answer of the first
  // that saw the new one.
  const auto until = steady_clock::now() + kSampleSpan;
  auto next_at = steady_clock::now() + kSampleGap;
  while (steady_clock::now() < until) {
    {
      std::unique_lock lk(mu_);
      cv_.wait_until(lk, stop, next_at, [] { return false; });
      if (stop.stop_requested()) return fail("the store is closing");
    }
    next_at = steady_clock::now() + kSampleGap;
    Sample s;
    if (!sample(s)) return fail(why);
    if (s.second == prev.second + 1) {
      const auto span = s.answered - prev.sent;
      const auto change = prev.sent + span / 2;
      const system_clock::time_point start{std::chrono::seconds(s.second)};
      return {.offset = duration_cast<milliseconds>(start - change),
              .uncertainty = duration_cast<milliseconds>(span / 2) + milliseconds(1),
              .ok = true};
    }
    prev = s;  // the same second, or a jump (a slow answer, a clock stepped): from here
  }
  return fail(fmt::format("the Date it answers did not change within {} ms", kSampleSpan.count()));
}

}  // namespace lockwatch::detail
