// lib/store/redis/connection.hpp: one connection to one Redis node, owned by
// the loop thread: a libuv TCP stream that lockwatch drives itself. Requests
// are written in RESP by us; replies are parsed with hiredis's redisReader.
//
// Commands from anywhere in the store are pipelined on it: what was queued
// in one loop iteration goes out in one write, just before the loop polls.
// It connects with a timeout and runs a handshake before anything else:
// AUTH, SELECT and (for a master found through Sentinel) ROLE. Requests wait
// for the handshake's answers, so a refused AUTH or SELECT, or a node that
// is no master, fails them with a clear error instead of letting them run on
// the wrong node or database. Reconnection and the command timeout are
// core/reconnector.hpp's. Every request that cannot complete fails with a
// typed error (every callback runs exactly once); one made while the
// connection is down waits for the next attempt and fails if it fails.
//
// In pubsub mode the connection carries a Subscriptions (subscriptions.hpp:
// classic or sharded), which keeps the channels wanted and is resubscribed
// after every reconnect; every push it does not handle itself (subscribe
// and unsubscribe confirmations, messages; the sharded ssubscribe, smessage
// and sunsubscribe, also unsolicited ones, alike) is reported through
// Hooks::on_message.
//
// The link is a core/stream.hpp Stream: with TLS (a rediss:// endpoint) it
// carries an OpenSSL session over memory BIOs, its handshake within the
// connect timeout; a
// refused certificate or a broken handshake fails what waited as
// unavailable, saying why.
//
// Costs: one non-blocking write per loop iteration with something queued;
// what the socket does not take goes to libuv in its buffer, uncopied, and
// what is queued meanwhile waits for that write, then goes out in one write
// from the buffer it gave back (a burst reuses two buffers, not one a
// write). A script call of 32 KiB or more is not copied: the same write
// takes it, in its place, from the buffer it was built in (kept for a
// NOSCRIPT retry). Replies are copied once into the reader's buffer.
#pragma once

#include <hiredis/hiredis.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/reconnector.hpp"
#include "core/stream.hpp"
#include "lockwatch/options.hpp"
#include "scripts.hpp"
#include "store/store_error.hpp"
#include "store/store_settings.hpp"
#include "subscriptions.hpp"

namespace lockwatch::detail {

class Loop;

// `reply` is null exactly when `error` is set; both are valid only during
// the callback. Error replies from Redis arrive classified (store_error.hpp:
// MOVED and ASK parsed, NOAUTH as kAuth, ...), a lost connection or a
// timeout as kUnavailable.
using ReplyCallback = std::function<void(const redisReply* reply, const StoreError* error)>;
// Frees a hiredis reply: the deleter of a std::unique_ptr that owns one.
struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};

// A script call's RESP. Its growth leaves the new room unwritten (the call
// then writes every byte of it), where a string's growth zeroes it: a
// batch of 512 renewals made anew each tick paid for that pass.
// Its rebinding (UnzeroedAllocator<U>) and a construction with arguments
// (std::construct_at) are std::allocator_traits' defaults.
template <class T>
struct UnzeroedAllocator : std::allocator<T> {
  UnzeroedAllocator() = default;
  template <class U>
  UnzeroedAllocator(const UnzeroedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
};
using RespText = std::vector<char, UnzeroedAllocator<char>>;

// A large script call's text, which a connection's flush writes from its
// own buffer after the first `at` bytes of its output: not copied into it.
struct LargeCall {
  std::size_t at;
  std::shared_ptr<const RespText> text;
};

// A script call (EVALSHA) written in RESP as it is built, each argument
// straight from its pieces: no argument strings, no argument vector. The
// counts are given first, as RESP's headers need them; add exactly `args`
// arguments, the `keys` keys first.
class EvalRequest {
 public:
  EvalRequest(const Script& script, std::size_t keys, std::size_t args, std::size_t bytes_hint = 0);
  // One argument, the concatenation of `pieces`.
  template <class... P>
  EvalRequest& arg(const P&... pieces) {
    char* at = open((std::string_view(pieces).size() + ...));
    ((at = copy(std::string_view(pieces), at)), ...);
    if (++written_ == expected_) resp_.resize(used_);  // the room made by open() goes
    return *this;
  }
  // A call of few arguments, all at hand: `keys` keys, then the rest.
  template <class... A>
  static EvalRequest of(const Script& script, std::size_t keys, const A&... args) {
    EvalRequest request(script, keys, sizeof...(A), (std::string_view(args).size() + ...));
    (request.arg(args), ...);
    return request;
  }
  // The call in RESP, once every argument is written (else empty).
  std::string_view resp() const noexcept {
    return written_ == expected_ ? std::string_view(resp_.data(), resp_.size()) : std::string_view();
  }
  const Script& script() const noexcept { return *script_; }

 private:
  friend class RedisConnection;
  // Appends a bulk string's header and its closing CRLF, `n` bytes apart,
  // in one step; returns where the n bytes go (room made ahead, a whole
  // estimate at a time).
  char* open(std::size_t n);
  static char* copy(std::string_view piece, char* at) noexcept {
    if (!piece.empty()) std::memcpy(at, piece.data(), piece.size());
    return at + piece.size();
  }
  const Script* script_;
  RespText resp_;            // its first used_ bytes are the call, until it is whole
  std::size_t used_ = 0;
  std::size_t body_at_ = 0;  // where the key count starts (after the sha)
  std::size_t expected_ = 0;
  std::size_t written_ = 0;
};

class RedisConnection : private Reconnector::Attempts,
                        private RequestTimer::Requests,
                        private Stream::Events {
 public:
  struct Hooks {
    // Pubsub mode: kind is the push's first element ("subscribe",
    // "unsubscribe", "message", "ssubscribe", "sunsubscribe", "smessage",
    // ...); for "pmessage" the channel and payload that matched.
    std::function<void(std::string_view kind, std::string_view channel, std::string_view payload)> on_message;
    // The connection went down (pubsub: every subscription is gone until
    // the reconnect resubscribes).
    std::function<void()> on_down;
    // Sharded pubsub mode: the node no longer serves `channel` (`why`:
    // Redis's error answering its SSUBSCRIBE, classified, e.g. a MOVED with
    // its target; null: the node sent an unsolicited sunsubscribe). The
    // channel is no longer wanted here.
    std::function<void(std::string_view channel, const StoreError* why)> on_dropped;
    // Pubsub mode (not sharded): the server answered a SUBSCRIBE or
    // UNSUBSCRIBE with an error (the user's ACL refused the channel, say).
    std::function<void(const StoreError& why)> on_refused;
    // Sent right after AUTH on every new connection (e.g. SUBSCRIBE in a
    // sentinel watcher); its replies reach on_message.
    std::vector<std::string> on_connect_command;
    // CLIENT SETNAME lockwatch:<owner> at each connect (Options::runtime.owner_name);
    // off for a sentinel, whose users are given only what Sentinel needs.
    bool named = true;
  };

  enum class Mode { kCommands, kPubSub, kShardedPubSub };

  RedisConnection(Loop& loop, Endpoint endpoint, const StoreSettings& settings, Mode mode, Hooks hooks);
  RedisConnection(Loop& loop, Endpoint endpoint, const StoreSettings& settings, Mode mode)
      : RedisConnection(loop, std::move(endpoint), settings, mode, Hooks()) {}

  // Loop thread only, from here on.
  void start();
  void command(std::vector<std::string> argv, ReplyCallback cb);
  // EVALSHA, falling back to EVAL when the server answers NOSCRIPT: the
  // request is one string of its own, nothing copied.
  void eval(EvalRequest request, ReplyCallback cb);
  // Redis Cluster: the next request goes right after an ASKING (a slot this
  // node imports, an ASK redirect), and so does the EVAL it becomes on
  // NOSCRIPT: an EVAL without ASKING would only be sent back with MOVED,
  // and the script would never be cached there.
  void ask_next() { ask_next_ = true; }
  // Sentinel: the master moved. Drops the current connection (what is in
  // flight fails) and connects to `endpoint` at once. An endpoint with port
  // 0 means "not known yet": attempts wait for one, up to connect_timeout.
  void set_endpoint(const Endpoint& endpoint);
  // Reads and dispatches replies already waiting in the socket, now. Used
  // before declaring a lease lost: after a stall the loop runs its timers
  // before it polls, and the confirmation may be sitting right there.
  void poll_replies();
  // Replaces Hooks::on_down (set before start()).
  void set_down_hook(std::function<void()> hook) { hooks_.on_down = std::move(hook); }
  // Every connection checks with ROLE that the node is a master before
  // anything is sent (set before start(); for addresses learned from
  // sentinels, which may lag behind a failover).
  void require_master() { require_master_ = true; }
  // Told when the connection goes down (with why) and when it is usable
  // again: once per transition, not per attempt (set before start()).
  void set_state_hook(std::function<void(bool up, const std::string& why)> hook) {
    reconnector_.set_state_hook(std::move(hook));
  }
  void subscribe(const std::string& channel);
  void unsubscribe(const std::string& channel);
  // Stops reconnecting, fails what is pending, closes the uv handles. The
  // loop then drains (Loop::shutdown): the object may be destroyed once the
  // loop has stopped. A request made after close() fails through a posted
  // callback, never inside the call.
  void close();
  // The direct lane: a thread other than the loop's writes a script call
  // on the socket itself, so that the loop wakes only for its reply. Made
  // for a caller that would otherwise wake the loop to send one request.
  // Open while the connection is usable, plaintext and in commands mode,
  // and idle: with requests in flight the loop wakes for their replies
  // anyway and batches what comes meanwhile (and no byte of the loop's
  // can be unwritten before the request). False, with `request` and `cb` untouched, when
  // the lane is closed or the socket took nothing: the caller then goes
  // the loop's way. True once the request is written (a part the socket
  // did not take goes out with the loop's next flush): `cb` runs on the
  // loop thread with the reply, or fails within the command timeout.
  // Any thread; set up with enable_lane() before start().
  bool send_direct(EvalRequest& request, ReplyCallback& cb);
  void enable_lane() { lane_enabled_ = true; }
  // Any thread, without the lane's lock: whether the lane was open and
  // idle at its last change. A hint that saves a caller building a
  // request send_direct() would refuse; send_direct() decides.
  bool lane_idle() const noexcept { return lane_idle_.load(std::memory_order_relaxed); }
  // Connected and past the handshake: a request made now is written at
  // once (at the end of this loop iteration).
  bool usable() const noexcept { return up() && link_ != nullptr && handshake_pending_ == 0; }
  const std::string& name() const noexcept { return name_; }

 private:
  // Connected (the handshake may still be under way).
  bool up() const noexcept { return reconnector_.state() == Reconnector::State::kUp; }
  bool closed() const noexcept { return reconnector_.closed(); }
  struct Queued {
    std::vector<std::string> argv;  // a command's arguments, or
    RespText resp;                  // a script call written whole (EvalRequest; else `whole`)
    ReplyCallback cb;
    const Script* script = nullptr;  // a script call's script (for errors)
    // In resp (or whole): where the key count starts. Non-zero: an
    // EVALSHA, retried as EVAL on NOSCRIPT (and 0 from then on).
    std::size_t body_at = 0;
    bool asking = false;   // written after an ASKING (ask_next())
    std::shared_ptr<const RespText> whole{};  // a large call's text, shared with the write sending it
  };
  // The script call `request` as a request, answered to `cb`.
  static Queued queued(EvalRequest& request, ReplyCallback cb);
  // What `q` sent, for an error that the user's ACL refused it.
  static std::string sent(const Queued& q);
  // kName: CLIENT SETNAME lockwatch:<owner>, for operators' CLIENT LIST;
  // a refusal (an ACL without it, an old server) is ignored.
  enum class Handshake : std::uint8_t { kNone, kAuth, kSelect, kRole, kName };
  // A request written on the current link whose reply has not come yet;
  // replies come in this order.
  struct Pending {
    Handshake step;  // kNone: a request (q)
    // When it was handed to the socket (flush); kUnwritten until then. The
    // command timeout counts from here, not from when it was made: a loop
    // kept busy between the two is no server's delay.
    std::chrono::steady_clock::time_point sent_at = kUnwritten;
    Queued q;
    bool awaited = true;  // counted in awaited_ (not made in a Loop::Background)
  };
  static constexpr auto kUnwritten = RequestTimer::kUnwritten;  // the latest time point
  void push_pending(Pending p);

  // Reconnector::Attempts: one attempt (the reconnector counts its
  // deadline), and the attempt given up at it.
  void attempt() override;
  void attempt_timed_out() override;
  // RequestTimer::Requests: the oldest request unanswered since when, and
  // the server silent for the command timeout.
  RequestTimer::Clock::time_point unanswered_since() const override;
  void overdue() override;
  // Subscriptions' (and the connect command's): a command on the current link.
  friend class Subscriptions;
  void write(const std::vector<std::string_view>& argv);
  bool can_write() const { return link_ != nullptr && up(); }
  // attempt()'s part: the handshake written first in the new link's
  // pipeline (AUTH, SELECT, CLIENT SETNAME, ROLE, the subscriptions).
  void write_handshake();
  // Stream::Events: the link is usable (then the flush may write), the
  // bytes it read, its failure, a write of flush()'s done.
  void stream_ready() override;
  void stream_data(const char* data, std::size_t n) override;
  void stream_failed(const std::string& why) override { link_failed(why); }
  void stream_wrote(std::unique_ptr<Stream::Write> done) override;
  void send(Queued q);
  // Fails `cb` with `err` on the loop's next turn (never inside the
  // caller's call: it may hold state across it), or at once once the
  // loop's shutdown has begun.
  void fail_later(ReplyCallback cb, StoreError err);
  // What waited for the handshake, sent now it is answered.
  void send_waiting();
  void want_flush();
  void flush();
  // flush()'s part: what it wrote (`used` bytes of out_) is pending from
  // now on.
  void written(std::size_t used);
  void dispatch(const redisReply* r);
  void on_request_reply(Queued q, const redisReply* r);
  void on_handshake_reply(Handshake step, const redisReply* r);
  void on_push(const redisReply* r);
  // Drops the current link (its handles close later) and fails what was
  // sent on it with `why`.
  void drop_link(const std::string& why);
  // The current attempt or connection failed: drop it, fail what waited for
  // it, go down and schedule the next attempt.
  void link_failed(const std::string& why);
  void went_down(const std::string& why);
  void became_usable();
  StoreError error_for(const redisReply* reply) const;
  void send_handshake(Handshake step, std::vector<std::string> argv);

  static void on_flush(uv_prepare_t* p);

  Loop& loop_;
  Endpoint endpoint_;
  std::string name_;
  const ConnectionOptions connection_;
  const std::string owner_;  // for CLIENT SETNAME
  bool require_master_ = false;
  bool ask_next_ = false;  // the next request sent carries ASKING
  Hooks hooks_;
  Reconnector reconnector_{loop_, Backoff(connection_.reconnect_min, connection_.reconnect_max),
                           connection_.connect_timeout, *this};
  RequestTimer request_timer_{loop_, connection_.command_timeout, *this};
  std::shared_ptr<const TlsContext> tls_;  // set for rediss:// endpoints
  std::string tls_error_;                   // why tls_ could not be made
  Stream* link_ = nullptr;      // the current attempt or connection
  struct ReaderFree {
    void operator()(redisReader* r) const noexcept { redisReaderFree(r); }
  };
  std::unique_ptr<redisReader, ReaderFree> reader_;  // the current link's replies
  std::string out_;              // RESP queued for the next flush (plaintext)
  std::vector<LargeCall> wholes_;  // large calls among out_'s bytes, in order
  std::string spare_;            // a finished write's buffer, for out_ to go on in
  int small_writes_ = 0;         // writes in a row that used under a quarter of out_'s size
  uv_prepare_t flush_{};        // writes what was queued, once per loop iteration
  std::size_t demand_id_ = 0;   // Loop::add_demand: awaited_ while open
  std::size_t awaited_ = 0;     // entries of pending_ a caller waits for
  bool select_failed_ = false;  // the server has no such database: a configuration error, not a node to wait for
  // Refused credentials (AUTH refused, or the user may not SELECT or ask
  // ROLE), with the refusal's code (WRONGPASS, NOPERM, ...): every error
  // reply of this attempt reads as it (error_for()).
  std::optional<StoreError> auth_refusal_;
  int handshake_pending_ = 0;    // AUTH / SELECT / ROLE answers still awaited
  std::string handshake_error_;  // why the last handshake failed
  std::deque<Queued> waiting_;   // made while down: sent on the next attempt
  std::deque<Pending> pending_;  // written on link_, awaiting replies
  // When the server last answered a request (a whole reply), and when the
  // read being dispatched came.
  std::chrono::steady_clock::time_point answered_at_{};
  std::chrono::steady_clock::time_point read_at_{};
  std::unique_ptr<Subscriptions> subs_;  // pubsub mode only (null in commands mode): what it listens to

  // The direct lane (send_direct()). lane_mu_ guards what another thread
  // may touch: pending_ (so that each request's place in
  // pending_ is its place on the wire), link_'s assignment, the fields
  // below; the loop holds it while it writes on the socket.
  void note_lane() noexcept;  // under lane_mu_: lane_idle_ anew
  mutable std::mutex lane_mu_;
  bool lane_enabled_ = false;         // set before start()
  int lane_fd_ = -1;                  // the socket while the lane is open
  int writes_in_flight_ = 0;          // uv_writes of the current link not done: the lane waits
  std::string lane_rest_;             // what the socket did not take of a direct request: first in the next flush
  std::chrono::steady_clock::time_point lane_sent_{};  // the last direct request
  std::atomic<bool> lane_idle_{false};  // written under lane_mu_, read without it (lane_idle())
  mutable bool lane_watched_ = false;  // the request timer looks after the lane's requests
};

}  // namespace lockwatch::detail
