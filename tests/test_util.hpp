// Helpers shared by the Redis-backed tests.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <functional>
#include <future>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <string_view>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "support/redis_server.hpp"

namespace lockwatch::testing {

using namespace std::chrono_literals;

// Every wait in the tests is bounded by this; a failure is a finding, not
// a hang.
inline constexpr auto kBound = 20s;

// Adds `param` ("min_replicas=1") to the query of the options' store URL
// (store_url, else redis_url): a store's own settings are its URL's.
inline void add_url_param(Options& o, const std::string& param) {
  std::string& url = o.store_url.empty() ? o.redis_url : o.store_url;
  const auto at = url.rfind('@');
  url += url.find('?', at == std::string::npos ? 0 : at) == std::string::npos ? '?' : '&';
  url += param;
}

inline Options options_for(const RedisServer& server, std::size_t threads = 4) {
  Options o;
  o.redis_url = server.url();
  o.runtime.threads = threads;
  if (server.tls()) o.tls.ca_file = test_certificates().ca_cert;
  return o;
}

// The shared Redis suites run once in plaintext and once over TLS.
enum class Transport { kPlain, kTls };
inline std::string transport_name(const ::testing::TestParamInfo<Transport>& info) {
  return info.param == Transport::kTls ? "Tls" : "Plain";
}
// `o` for a server that speaks `t`.
inline RedisServerOptions over(Transport t, RedisServerOptions o = {}) {
  if (t == Transport::kTls) o.tls = RedisTls{};
  return o;
}
// What a child process needs in its environment to reach `server`.
inline std::vector<std::string> env_for(const RedisServer& server) {
  std::vector<std::string> env{"LOCKWATCH_REDIS_URL=" + server.url()};
  if (server.tls()) env.push_back("LOCKWATCH_TLS_CA_FILE=" + test_certificates().ca_cert);
  return env;
}

// The Redis key lockwatch uses for `key` with the default prefix.
inline std::string lock_key(const std::string& key) { return "lockwatch:{" + key + "}"; }

// CRC16/XMODEM mod 16384: the Redis Cluster slot of `s`, hashed whole.
inline unsigned slot_of(std::string_view s) {
  unsigned crc = 0;
  for (unsigned char c : s) {
    crc ^= static_cast<unsigned>(c) << 8;
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

// The slot of lock_key(key): its hash tag is `key` up to its first '}'.
inline unsigned lock_slot(const std::string& key) { return slot_of(key.substr(0, key.find('}'))); }

// The fencing counter lockwatch uses for `key` with the default prefix:
// `lockwatch:fence:{T}`, T the first of the shortest strings over 0-9a-zA-Z
// (in that order) in the slot of lock_key(key), as docs/how-it-works.md's "Redis
// layout" gives the rule (written here from it, apart from the library's
// table, which cluster_slot_test pins). A search: up to 240,000 CRCs.
inline std::string fence_key(const std::string& key) {
  const unsigned slot = lock_slot(key);
  const std::string_view alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  for (std::size_t len = 1; len <= 3; ++len) {
    std::vector<std::size_t> idx(len, 0);
    for (;;) {
      std::string tag;
      for (std::size_t i : idx) tag.push_back(alphabet[i]);
      if (slot_of(tag) == slot) return "lockwatch:fence:{" + tag + "}";
      std::size_t pos = len;
      while (pos > 0 && ++idx[pos - 1] == alphabet.size()) idx[--pos] = 0;
      if (pos == 0) break;
    }
  }
  return {};
}

inline bool exists(const RedisServer& server, const std::string& key) {
  return server.command({"EXISTS", lock_key(key)}).integer == 1;
}

// A TCP listener on 127.0.0.1, on a port the kernel picks, for a test
// that plays a server; closed with it. Throws std::runtime_error when it
// cannot listen.
class LoopbackListener {
 public:
  explicit LoopbackListener(int backlog = 16) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, backlog) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error("cannot listen on loopback");
    }
    port_ = ntohs(addr.sin_port);
  }
  ~LoopbackListener() { ::close(fd_); }
  LoopbackListener(const LoopbackListener&) = delete;
  LoopbackListener& operator=(const LoopbackListener&) = delete;
  int fd() const { return fd_; }
  int port() const { return port_; }
  // Wakes an accept() blocked on it, which then fails.
  void shut() { ::shutdown(fd_, SHUT_RDWR); }

 private:
  int fd_;
  int port_ = 0;
};

// A one-shot gate a test opens to let held work finish.
class Gate {
 public:
  void open() {
    if (!opened_) {
      opened_ = true;
      p_.set_value();
    }
  }
  // Waits at most kBound; returns whether the gate opened.
  bool wait() const { return f_.wait_for(kBound) == std::future_status::ready; }
  // Waits at most kBound for the gate, or for `call` to end first: then
  // says, as a failure, how it ended. Returns whether the gate opened.
  template <class T>
  bool wait_or_ended(std::future<T>& call) const {
    return wait_or_ended(call, [](const ConnectionError&) { return false; });
  }
  // As wait_or_ended(call), but a call that ended with a ConnectionError
  // before the gate opened (a store's session not yet made on a loaded
  // machine) is made again by `make`, at most `attempts` calls in all.
  template <class Make>
  bool wait_remaking(Make&& make, decltype(make())& call, int attempts) const {
    call = make();
    for (int made = 1;; ++made) {
      bool again = false;
      if (wait_or_ended(call, [&](const ConnectionError& e) {
            std::fprintf(stderr, "call %d of %d ended before the gate opened: %s\n", made, attempts, e.what());
            return again = made < attempts;
          }))
        return true;
      if (!again) return false;
      call = make();
    }
  }

 private:
  // `retry` says whether a ConnectionError ending the call is not a failure.
  template <class T, class Retry>
  bool wait_or_ended(std::future<T>& call, Retry retry) const {
    const auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until) {
      if (f_.wait_for(std::chrono::milliseconds(10)) == std::future_status::ready) return true;
      if (call.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      try {
        call.get();
        ADD_FAILURE() << "the call ended before the gate opened";
      } catch (const ConnectionError& e) {
        if (!retry(e)) ADD_FAILURE() << "the call ended before the gate opened: " << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the call ended before the gate opened: " << e.what();
      }
      return false;
    }
    ADD_FAILURE() << "the gate stayed shut and the call still runs after " << kBound.count() << " s";
    return false;
  }

  std::promise<void> p_;
  std::shared_future<void> f_ = p_.get_future().share();
  bool opened_ = false;
};

// What the log said at warning level (Options::observability.log = lines.sink()), for
// the cases that wait for a line. It must outlive the runtimes it serves.
class LogLines {
 public:
  LogSink sink() {
    return [this](LogLevel level, std::string_view line) {
      if (level < LogLevel::kWarning) return;
      {
        std::lock_guard lk(mu_);
        lines_.emplace_back(line);
      }
      cv_.notify_all();
    };
  }
  // Waits at most kBound for a line holding `text`.
  bool wait_for(const std::string& text) const {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, kBound, [&] {
      for (const auto& l : lines_)
        if (l.find(text) != std::string::npos) return true;
      return false;
    });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<std::string> lines_;
};

// Waits (bounded) until `lease` was renewed `more` times since the call, or
// was lost; returns whether the renewals happened with the lease kept.
inline bool renewed_again(const Lease& lease, std::uint64_t more) {
  auto target = lease.renewals() + more;
  auto until = std::chrono::steady_clock::now() + kBound;
  while (lease.renewals() < target && !lease.lost() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a counter the watchdog moves
  return lease.renewals() >= target && !lease.lost();
}

// Waits (bounded) until `token` is stopped (a lease lost); returns whether
// it was.
inline bool stopped_within_bound(std::stop_token token) {
  std::promise<void> stopped;
  std::stop_callback cb(token, [&] { stopped.set_value(); });
  return stopped.get_future().wait_for(kBound) == std::future_status::ready;
}

template <class T>
T get_bounded(std::future<T>& f) {
  if (f.wait_for(kBound) != std::future_status::ready) {
    ADD_FAILURE() << "future not ready within the bound";
    throw std::runtime_error("future not ready within the bound");
  }
  return f.get();
}

// Gives a handle's lock back and waits (bounded) for the store's answer.
inline void give_back(LockHandle& h) {
  auto f = h.release();
  get_bounded(f);
}

// Takes a lock on every key (all asked for at once) and returns the handles.
inline std::vector<LockHandle> hold_all(Runtime& rt, const std::vector<std::string>& keys,
                                        std::chrono::milliseconds ttl) {
  std::vector<std::future<LockHandle>> acquiring;
  for (const auto& key : keys) acquiring.push_back(rt.acquire(key, ttl));
  std::vector<LockHandle> held;
  for (auto& f : acquiring) held.push_back(get_bounded(f));
  return held;
}

// Waits (bounded) until `rt` sent `n` renewals more than at `before`;
// returns the stats then (the caller checks how many it got).
inline RuntimeStats after_renewals(Runtime& rt, const RuntimeStats& before, std::uint64_t n) {
  auto until = std::chrono::steady_clock::now() + kBound;
  while (rt.stats().renewals_sent - before.renewals_sent < n && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);  // polling counters the watchdog moves
  return rt.stats();
}

// For worker threads: get_bounded() that records a failure instead of
// throwing, since an exception escaping a thread ends the whole binary.
template <class T>
bool completes(std::future<T>& f) {
  try {
    get_bounded(f);
    return true;
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
    return false;
  }
}

// Locks `sku:0` .. `sku:<names - 1>` through `rt` twice, `in_flight` calls at
// a time (each released before its future is ready), and checks that each
// name's second token is above its first.
inline void lock_names_twice(Runtime& rt, int names, int in_flight) {
  auto token_of = locked("sku:{0}", std::chrono::seconds(10), 0).on(rt)([](int) { return this_lease().fencing_token(); });
  std::vector<std::uint64_t> first(static_cast<std::size_t>(names));
  for (int round = 0; round < 2; ++round) {
    for (int base = 0; base < names; base += in_flight) {
      std::vector<std::future<std::uint64_t>> calls;
      for (int i = base; i < base + in_flight; ++i) calls.push_back(token_of(i));
      for (int i = base; i < base + in_flight; ++i) {
        const std::uint64_t t = get_bounded(calls[static_cast<std::size_t>(i - base)]);
        if (round == 0) first[static_cast<std::size_t>(i)] = t;
        else ASSERT_GT(t, first[static_cast<std::size_t>(i)]) << "sku:" << i;
      }
    }
  }
}

// The exception of type E `f` threw (nullptr, with a failure, otherwise).
template <class E, class F>
std::unique_ptr<E> thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return std::make_unique<E>(e);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception: " << e.what();
    return nullptr;
  }
  ADD_FAILURE() << "no exception";
  return nullptr;
}

// The exception of type E the future holds (bounded), as thrown().
template <class E, class T>
std::unique_ptr<E> error_of(std::future<T>& f) {
  return thrown<E>([&] { get_bounded(f); });
}

// Everyone who arrives waits for the others, up to the test bound: true
// if all `n` were there together.
class Rendezvous {
 public:
  explicit Rendezvous(int n) : left_(n) {}
  bool arrive() {
    std::unique_lock lk(mu_);
    if (--left_ <= 0) cv_.notify_all();
    return cv_.wait_for(lk, kBound, [&] { return left_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

// Every URL of `bad` is refused when options made of it (by `make`) are
// checked: an InvalidArgument that names `store` and never shows the
// password, which is "secret" in each.
template <class MakeOptions>
void expect_refused_urls(std::initializer_list<const char*> bad, MakeOptions make, std::string_view store) {
  for (const char* url : bad) {
    Options o = make(url);
    try {
      o.validate();
      ADD_FAILURE() << "accepted " << url;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(store), std::string::npos) << e.what();
    }
  }
}


// A shared set of four keys (named `k`:a..d, in another order) taken on
// `rt` while `steps` (the store's count of its statements or
// transactions) rises by exactly one; `other`'s reader is then let in and
// its writer refused. For the stores that decide a set in one step.
inline void expect_shared_set_in_one_step(Runtime& rt, Runtime& other, const std::string& k,
                                          const std::function<long long()>& steps) {
  using namespace std::chrono_literals;
  const long long before = steps();
  auto f = rt.acquire({.key = lockwatch::all_of(k + ":d", k + ":b", k + ":a", k + ":c"),
                       .ttl = 5s,
                       .kind = LockKind::shared()});
  LockHandle h = get_bounded(f);
  EXPECT_EQ(steps() - before, 1);
  EXPECT_EQ(h.lease().keys().size(), 4u);
  auto reader = other.acquire({.key = k + ":a", .ttl = 5s, .kind = LockKind::shared()});
  LockHandle r = get_bounded(reader);  // shared: another reader is let in
  auto writer = other.acquire({.key = k + ":c", .ttl = 5s});
  EXPECT_TRUE(error_of<LockNotAcquired>(writer));
  r.release().get();
  h.release().get();
}

}  // namespace lockwatch::testing
