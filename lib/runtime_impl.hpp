// lib/runtime_impl.hpp: the runtime's insides, shared by runtime.cpp
// (calls, acquisition, the watchdog) and nodes.cpp (the Redis nodes and
// the quorum over them). Everything here but the constructor and the
// any-thread entry points runs on the loop thread.
#pragma once

#include "lockwatch/runtime.hpp"

#include <fmt/format.h>
#include <uv.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "lease_record.hpp"
#include "loop.hpp"
#include "redis_connection.hpp"
#include "scripts.hpp"
#include "sentinel.hpp"
#include "token.hpp"

namespace lockwatch {

using detail::LeaseRecord;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;


namespace detail {

// The call behind a LockHandle: no work, two outcomes (acquired, released).
class HandleCall final : public Call {
 public:
  void run() noexcept override {}
  void finish(std::exception_ptr error) noexcept override {
    try {
      if (!granted) {
        acquired.set_exception(error ? error : std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped")));
      } else if (error) {
        released.set_exception(error);
      } else {
        released.set_value();
      }
    } catch (...) {
    }
  }
  std::promise<LockHandle> acquired;
  std::promise<void> released;
  bool granted = false;  // loop thread
};

struct HandleState {
  std::weak_ptr<Runtime::Impl> rt;
  std::shared_ptr<LeaseRecord> lease;
  std::shared_ptr<HandleCall> call;
};

// A call waiting to take its lock. Lives until it is granted or failed.
struct Acquisition final : TimerTask {
  Runtime::Impl* rt = nullptr;
  LockSpec spec;
  std::shared_ptr<Call> call;
  std::string token;
  std::string lock_key, fence_key, channel;
  Clock::time_point started;
  Timeout wait_timeout;
  bool done = false;
  bool inline_run = false;  // granted: hand the lease to the waiting thread
  std::shared_ptr<HandleCall> handle;  // Runtime::acquire: granted makes a LockHandle
  std::promise<std::shared_ptr<LeaseRecord>> granted;  // inline only
  std::shared_ptr<std::promise<void>> finished;        // inline only

  void run(Timeout) noexcept override;
};

// The in-process waiters for one key: only the head talks to Redis, the
// rest queue behind it in arrival order, so a release wakes one caller.
struct KeyWaiters final : TimerTask {
  Runtime::Impl* rt = nullptr;
  std::string channel;
  std::deque<std::shared_ptr<Acquisition>> queue;
  bool in_flight = false;    // the head's attempt awaits its reply
  bool again = false;        // a wake-up came while it was in flight
  bool subscribed = false;   // the release channel is confirmed
  bool held_locally = false; // one of our leases holds it: our release wakes us
  Timeout retry;             // the holder's ttl runs out
  std::exception_ptr connection_error;  // the head's last attempt could not reach Redis

  void run(Timeout) noexcept override;
};

}  // namespace detail

using detail::Acquisition;
using detail::KeyWaiters;

namespace detail {

// What an acquisition attempt came to, over one node or a quorum.
struct AcquireOutcome {
  enum class Kind { kTaken, kBusy, kFailed } kind = Kind::kFailed;
  std::uint64_t fence = 0;
  std::chrono::milliseconds pttl{0};  // busy: when the holder's ttl ends
  std::exception_ptr error;           // failed
  Clock::time_point sent;
};

struct StatsCounters {
  std::atomic<std::uint64_t> acquired{0};
  std::atomic<std::uint64_t> renewals_sent{0};
  std::atomic<std::uint64_t> renew_commands{0};
  std::atomic<std::uint64_t> leases_lost{0};
  std::atomic<std::uint64_t> timer_wakeups{0};
  // Written by the loop thread only, in microseconds.
  std::atomic<std::int64_t> min_renewal_slack_us{std::numeric_limits<std::int64_t>::max()};
};
}  // namespace detail

struct HandleAccess {
  static LockHandle make(std::shared_ptr<detail::HandleState> state) { return LockHandle(std::move(state)); }
};

struct Runtime::Impl : std::enable_shared_from_this<Runtime::Impl> {
  explicit Impl(Options opts);

  // Any thread.
  void validate(detail::LockSpec& spec) const;
  std::shared_ptr<Acquisition> make_acquisition(detail::LockSpec spec, std::shared_ptr<detail::Call> call);
  void dispatch(detail::LockSpec spec, std::shared_ptr<detail::Call> call);
  std::future<LockHandle> acquire(detail::LockSpec spec);
  void call_done();
  void stop();

  // Loop thread.
  void start_acquire(std::shared_ptr<Acquisition> a);
  void attempt_once(std::shared_ptr<Acquisition> a);
  void attempt_head(const std::string& channel);
  void on_acquire_outcome(const std::shared_ptr<Acquisition>& a, const detail::AcquireOutcome& out, KeyWaiters* w);
  void fail(const std::shared_ptr<Acquisition>& a, std::exception_ptr err);
  void grant(const std::shared_ptr<Acquisition>& a, std::uint64_t fence, Clock::time_point sent);
  void on_wait_expired(Acquisition* a);
  void on_pubsub(std::string_view kind, std::string_view channel);
  void maybe_forget(KeyWaiters* w);
  void schedule(LeaseRecord& l, LeaseRecord::Phase phase, Clock::time_point at);
  // A timeout on the wheel, with the loop woken on its tick.
  Timeout timeout_at(TimerTask& task, Clock::time_point at);
  void on_lease_timer(LeaseRecord* l);
  void send_renew(LeaseRecord* l);
  void flush_renewals();
  void on_renewed(const std::shared_ptr<LeaseRecord>& l, Clock::time_point sent);
  void renewal_failed(const std::shared_ptr<LeaseRecord>& l, std::string why);
  void lose(LeaseRecord* l, LostReason reason, std::string detail = {});
  void work_done(const std::shared_ptr<LeaseRecord>& l);
  void send_release(const std::shared_ptr<LeaseRecord>& l, std::function<void(bool freed)> then);

  // The Redis nodes (nodes.cpp). One node: plain lock. Several: Redlock,
  // every step needs a majority (quorum) of them.
  void start_nodes();
  void quorum_acquire(const std::shared_ptr<Acquisition>& a,
                      std::function<void(const detail::AcquireOutcome&)> done);
  void quorum_renew(std::vector<std::shared_ptr<LeaseRecord>> batch, Clock::time_point sent);
  void on_renew_vote(const std::shared_ptr<LeaseRecord>& l, std::uint64_t round, Clock::time_point sent, long long v,
                     const std::string& why);
  // done(freed, held): freed when a majority confirmed the key is not ours
  // any more; held when a majority still held our token.
  void quorum_release(const std::string& lock_key, const std::string& token, const std::string& channel,
                      std::function<void(bool freed, bool held, bool taken, std::string why)> done);
  void subscribe_all(const std::string& channel);
  void unsubscribe_all(const std::string& channel);
  void finish_lease(const std::shared_ptr<LeaseRecord>& l);
  void run_on_pool(const std::shared_ptr<LeaseRecord>& l);
  // Makes the wheel's timer fire no later than `at` (it sleeps until the
  // next occupied tick instead of ticking while idle).
  void arm_wheel(Clock::time_point at);
  void on_wheel_timer();
  void begin_stop();
  void close_all();

  std::shared_ptr<LeaseRecord> shared(LeaseRecord* l) { return l->shared_from_this(); }

  const Options options;
  const Topology topology;
  const std::vector<Endpoint> endpoints;  // one per node (the sentinel master: port 0 until found)
  const std::size_t quorum;
  ThreadPool pool;
  ThreadPool notifier{1};  // runs stop callbacks: user code never runs on the loop
  detail::Loop loop;
  TimerWheel wheel;
  uv_timer_t wheel_timer{};
  struct Node {
    std::unique_ptr<detail::RedisConnection> conn;  // commands, pipelined
    std::unique_ptr<detail::RedisConnection> renew;  // renewals: never queued behind bulk acquisitions
    std::unique_ptr<detail::RedisConnection> sub;   // release notifications
  };
  std::vector<Node> nodes;
  std::unique_ptr<detail::SentinelWatcher> sentinel;
  detail::TokenGenerator tokens;

  // Loop thread only.
  std::unordered_map<LeaseRecord*, std::shared_ptr<LeaseRecord>> leases;
  std::unordered_map<std::string, std::unique_ptr<KeyWaiters>> waiters;  // by channel
  std::vector<std::shared_ptr<LeaseRecord>> renew_batch;                 // due this tick
  std::uint64_t advances_ = 0;    // wheel advances so far
  Clock::time_point wheel_due_ = Clock::time_point::max();  // when wheel_timer fires
  std::uint64_t drained_at_ = ~std::uint64_t{0};  // the advance that last read replies early
  detail::StatsCounters stats;

  std::atomic<bool> stopping{false};
  std::atomic<std::size_t> held{0};
  std::mutex mu;
  std::condition_variable cv;
  std::size_t active_calls = 0;  // guarded by mu
};

namespace detail {

inline std::chrono::milliseconds drift_for(const Options& o, milliseconds ttl) {
  auto d = milliseconds(static_cast<milliseconds::rep>(static_cast<double>(ttl.count()) * o.drift_factor));
  return d + o.drift_floor;
}

// How long after a renewal (or the acquisition) was sent the next one goes
// out: at ttl*weight, or earlier if that would leave less than
// Options::min_renewal_window before the local deadline, but never before
// half the ttl.
inline Clock::duration renew_after(const Options& o, milliseconds ttl, double weight) {
  using Dur = std::chrono::duration<double, std::milli>;
  auto weighted = Dur(static_cast<double>(ttl.count()) * weight);
  auto latest = Dur(ttl - drift_for(o, ttl) - o.min_renewal_window);
  auto half = Dur(static_cast<double>(ttl.count()) / 2);
  return std::chrono::duration_cast<Clock::duration>(std::min(weighted, std::max(half, latest)));
}

inline std::string redis_key(const Options& o, const std::string& key) {
  std::string out;
  out.reserve(o.key_prefix.size() + key.size() + 2);
  out += o.key_prefix;
  out += '{';
  out += key;
  out += '}';
  return out;
}

inline long long integer_at(const redisReply* r, std::size_t i) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements <= i) return 0;
  const redisReply* e = r->element[i];
  return e->type == REDIS_REPLY_INTEGER ? e->integer : 0;
}

inline bool is_connection_error(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const AuthError&) {
    return false;
  } catch (const ConnectionError&) {
    return true;
  } catch (...) {
    return false;
  }
}

inline std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace detail

}  // namespace lockwatch
