// lib/store/etcd/etcd_clock.hpp: the etcd members' clock, for scheduled
// jobs (JobClaims::server_time): etcd's v3 API has none, so it is read
// from the Date header of the members' answers to GET /version (HTTPS for
// etcds://) and kept as an offset from the local clock (docs/etcd.md,
// "Scheduled jobs"). None answering is a kUnavailable StoreError, never a
// time.
//
// Threading: made on any thread, then used on the loop thread only;
// answers run there, each exactly once and never inside now(). Measuring runs there too, over a
// core/stream.hpp Stream and a timer (the name looked up on libuv's
// threads, the connect, the TLS handshake, the samples: bounded by the
// connection options' timeouts): nothing blocks. After close() the object
// may be destroyed once the loop has drained (Loop::shutdown).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/stream.hpp"
#include "store/etcd/etcd_target.hpp"
#include "store/store_error.hpp"
#include "store/store_settings.hpp"

namespace lockwatch::detail {

class Loop;

class EtcdClock : private Stream::Events {
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
  std::chrono::milliseconds uncertainty() const { return uncertainty_; }
  // Fails the callers waiting (each callback runs once, now); later
  // calls fail on the next loop turn.
  void close();

 private:
  // What the timer waits for: a connect, an answer, the next sample's turn
  // (the first's: the loop's next turn, never inside now()); kIdle: no
  // measurement under way (or, within a callback, one between its steps).
  enum class Step { kIdle, kConnecting, kAwaiting, kGap };
  struct Sample {
    time_point sent, answered;
    std::int64_t second = 0;
  };
  void want_measure();
  void on_timer();
  // The current member's next sample: connected first if need be.
  void sample();
  void stream_ready() override;
  void stream_data(const char* data, std::size_t n) override;
  // The current member failed (its stream broke, or it answered late or
  // wrongly): the next one, or the measurement fails.
  void stream_failed(const std::string& why) override;
  void answered(std::int64_t second, bool keep);
  // The measurement's end: `error`, or the members' clock minus local_'s
  // and half the span the second changed in.
  void finish(const StoreError* error, std::chrono::milliseconds offset = {},
              std::chrono::milliseconds uncertainty = {});
  void drop_stream();
  void arm(std::chrono::milliseconds after);

  Loop& loop_;
  const EtcdTarget target_;
  const std::chrono::milliseconds connect_timeout_;
  const std::chrono::milliseconds command_timeout_;
  std::shared_ptr<const TlsContext> tls_;
  std::string tls_error_;  // why there is no TLS context for etcds://
  const LocalClock local_;
  bool have_ = false;  // an offset was measured
  std::chrono::milliseconds offset_{0};
  std::chrono::milliseconds uncertainty_{0};
  std::chrono::steady_clock::time_point measured_at_{};
  std::vector<Done> waiting_;  // for the measurement under way
  // Shared with the answers now() posts, which may run after close() (and
  // must not touch this object).
  const std::shared_ptr<bool> closed_ = std::make_shared<bool>(false);

  // One measurement at a time, on the loop thread.
  uv_timer_t timer_{};  // made by the first measurement, closed by close()
  bool timer_made_ = false;
  Step step_ = Step::kIdle;
  Stream* stream_ = nullptr;  // kept alive between a member's samples
  std::size_t member_ = 0;    // the member being read, in the URL's order
  std::string whys_;          // why the members before it could not be read
  std::string in_;            // read and not yet consumed
  Sample prev_;               // the last sample of the current member
  Sample now_;                // the sample under way
  bool have_prev_ = false;
  std::chrono::steady_clock::time_point until_;    // the span's end
  std::chrono::steady_clock::time_point next_at_;  // the next sample's turn
};

}  // namespace lockwatch::detail
