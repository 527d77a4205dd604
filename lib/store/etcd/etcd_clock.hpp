// lib/store/etcd/etcd_clock.hpp: the etcd members' clock, for scheduled
// jobs (JobClaims::server_time), read where etcd shows it.
//
// etcd's v3 API has no call that returns the time. But every member also
// serves HTTP/1.1 on its client port (GET /version, answered without
// credentials even with authentication on), and Go's net/http stamps each
// answer with a Date header: the member's clock, in whole seconds. The
// clock reads it finer than a second: it asks GET /version every
// kSampleGap on one kept-alive connection until the Date's second changes
// (at most kSampleSpan), and takes the middle of the span between the
// last request that saw the old second being sent and the first that saw
// the new one being answered as that second's start. The error is at most
// half that span (kSampleGap plus a round trip: about 15 ms on a LAN).
// What it keeps is an offset from the local clock:
//   - fresher than kRefresh: answered at once (on the next loop turn);
//   - older, but within kMaxAge: answered at once, and measured again in
//     the background;
//   - none yet, or older than kMaxAge: the caller waits for a measurement
//     (about a second).
// The store measures once when it starts (warm()), in the background, so
// that a standby job taking over does not wait a second for its first
// claim; later only when asked.
// Members are tried in the URL's order, the first that answers is read
// (so that processes of one URL read one member's clock); a member that
// cannot be connected to, does not answer within the timeouts, or answers
// something but etcd's /version with a Date costs its attempt, and the
// next is tried. None answering: a kUnavailable StoreError (a
// ConnectionError), never a time.
//
// etcds://: HTTPS, with OpenSSL and the store's TLS options (the same
// CA, client certificate and name checks as the gRPC calls; the client
// port refuses plain text then). Without the `tls` feature, etcds://
// locks work (gRPC's own TLS) but its clock fails, naming the feature.
//
// Threading: now() and close() on the loop thread; answers are posted to
// the loop, each exactly once and never inside now(). Measuring runs on a
// thread of its own (started by the first measurement): resolving names,
// connecting, the TLS handshake and the samples block that thread only;
// connecting and the handshake are bounded by Options::connection.connect_timeout,
// each request by command_timeout, name resolution by the system's
// resolver. The destructor (off the loop thread, after close()) stops and
// joins it: a wait in progress sees the stop within 50 ms.
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

#include "lockwatch/options.hpp"
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
  ~EtcdClock();
  EtcdClock(const EtcdClock&) = delete;
  EtcdClock& operator=(const EtcdClock&) = delete;

  // The members' clock now, by the offset kept (see above).
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

  // One measurement's outcome (measuring thread).
  struct Measured {
    std::chrono::milliseconds offset{0};       // the members' clock minus `local`
    std::chrono::milliseconds uncertainty{0};  // half the span the second changed in
    bool ok = false;
    StoreError error;  // when not ok
  };

 private:
  struct Conn;
  struct State;
  void run();
  Measured measure();
  Measured measure_member(std::size_t member);
  void want_measure();  // loop thread

  Loop& loop_;
  const EtcdTarget target_;
  const std::string name_;
  const std::chrono::milliseconds connect_timeout_;
  const std::chrono::milliseconds command_timeout_;
  const LocalClock local_;
  std::shared_ptr<const TlsContext> tls_;
  std::string tls_error_;  // why there is no TLS context for etcds://
  // What the loop thread keeps (the offset, the callers waiting), shared
  // with the answers the measuring thread posts, which may run after
  // close() and must not touch this object.
  std::shared_ptr<State> state_;

  // The measuring thread's: asked to measure, or to stop.
  std::mutex mu_;
  std::condition_variable_any cv_;
  bool wanted_ = false;  // guarded by mu_
  std::stop_source stop_;  // requested by close() and the destructor
  std::thread thread_;  // loop thread starts it
};

}  // namespace lockwatch::detail
