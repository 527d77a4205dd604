// lib/store/etcd/etcd_clock.hpp: the etcd members' clock, for scheduled
// jobs (JobClaims::server_time): etcd's v3 API has none, so it is read
// from the Date header of the members' answers to GET /version (HTTPS for
// etcds://) and kept as an offset from the local clock (docs/etcd.md,
// "Scheduled jobs"). None answering is a kUnavailable StoreError, never a
// time.
//
// Threading: now() and close() on the loop thread; answers are posted to
// the loop, each exactly once and never inside now(). Measuring (resolving,
// connecting, the TLS handshake, the samples: bounded by the connection
// options' timeouts) blocks only a thread of its own, started by the first
// measurement and stopped and joined by the destructor (off the loop
// thread, after close()) within 50 ms.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "store/etcd/etcd_target.hpp"
#include "store/store_error.hpp"
#include "store/store_settings.hpp"

namespace lockwatch::detail {

class Loop;
class TlsContext;

class EtcdClock {
 public:
  using time_point = std::chrono::system_clock::time_point;
  using LocalClock = std::function<time_point()>;
  using Done = std::function<void(time_point now, const StoreError* error)>;

  static constexpr std::chrono::milliseconds kSampleGap{20};
  // A second and a few gaps: the Date must change within it.
  static constexpr std::chrono::milliseconds kSampleSpan{1200};
  static constexpr std::chrono::seconds kRefresh{30};
  static constexpr std::chrono::seconds kMaxAge{3600};

  // `local` is this process's clock (tests give a skewed one).
  EtcdClock(Loop& loop, EtcdTarget target, const StoreSettings& settings, LocalClock local = {});
  EtcdClock(const EtcdClock&) = delete;
  EtcdClock& operator=(const EtcdClock&) = delete;

  void now(Done done);
  // Measures in the background if nothing is kept yet.
  void warm();
  // The members' clock now if an offset no older than kMaxAge is kept.
  std::optional<time_point> estimate() const;
  // How far off the last measurement may be (half its span; 0: none yet).
  std::chrono::milliseconds uncertainty() const;
  // Fails the callers waiting (each callback runs once, now); later
  // calls fail on the next loop turn.
  void close();

  struct Measured {
    std::chrono::milliseconds offset{0};       // the members' clock minus `local`
    std::chrono::milliseconds uncertainty{0};  // half the span the second changed in
    bool ok = false;
    StoreError error{};  // when not ok
  };

 private:
  struct Conn;
  struct State;
  void run(std::stop_token stop);
  Measured measure(std::stop_token stop);
  Measured measure_member(const EtcdTarget::Member& m, std::stop_token stop);
  void want_measure();  // loop thread

  Loop& loop_;
  const EtcdTarget target_;
  const std::chrono::milliseconds connect_timeout_;
  const std::chrono::milliseconds command_timeout_;
  std::shared_ptr<const TlsContext> tls_;
  std::string tls_error_;  // why there is no TLS context for etcds://
  // What the loop thread keeps, shared with the answers the measuring
  // thread posts, which may run after close() and must not touch this object.
  std::shared_ptr<State> state_;

  std::mutex mu_;
  std::condition_variable_any cv_;
  bool wanted_ = false;  // guarded by mu_
  // Loop thread starts it; asked to stop by close(), stopped and joined
  // by the destructor.
  std::jthread thread_;
};

}  // namespace lockwatch::detail
