// lib/store/sqlcommon/connection_core.hpp: what the SQL stores'
// connections (MariaDB's SqlConnection, PostgreSQL's PgConnection) keep
// and do the same way, whatever their client library does underneath.
//
// A connection's requests wait in queue_ until the loop turn's end
// (kick()), go to the server, and stay in inflight_ until answered, in
// order; every callback runs exactly once, on the loop thread, never
// inside the call that queued it. A request without an answer within
// command_timeout, or a connection attempt past connect_timeout, drops
// the connection: what was in flight fails, what was queued goes to the
// next attempt. Lost connections come back on a doubling back-off
// (reconnect_min .. reconnect_max; core/reconnector.hpp).
//
// A connection given up on with statements in flight leaves its server
// session behind (why that matters: docs/stores.md, "Connections"): its
// id goes on a list the store's connections share (StaleSessions); the
// others start again too, and each ends the listed sessions before its
// set-up.
//
// The driver (the derived connection) connects, sends, reads, and keeps
// its own state. Threading: the loop thread only, but construction.
// Costs: nothing beyond the driver's; a refusal after close() is one
// posted task.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/loop.hpp"
#include "core/net.hpp"
#include "core/reconnector.hpp"
#include "core/turn_end.hpp"
#include "store/sqlcommon/settings.hpp"
#include "store/store_error.hpp"

namespace lockwatch::detail::sqlcommon {

// The server sessions (MariaDB thread ids, PostgreSQL backend pids) of
// connections given up on with statements in flight, and the connections
// that share the list (a store's statement connections). Loop thread only.
template <class Connection, class Id>
struct StaleSessions {
  std::vector<Id> ids;
  std::vector<Connection*> connections;

  // A session left behind goes on the list once (an id of 0 is none known).
  void add(Id id) {
    if (id > 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  // `ended` are not tried again.
  void forget(const std::vector<Id>& ended) {
    std::erase_if(ids, [&](Id id) { return std::find(ended.begin(), ended.end(), id) != ended.end(); });
  }
  // `ids` as a comma-separated list, for a statement.
  static std::string list(const std::vector<Id>& ids) {
    std::string out;
    for (Id id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
    return out;
  }
  // The connections but `self` that `up` says are usable go down and
  // start again (`restart`), behind the session `self` left.
  template <class Up, class Restart>
  void restart_others(const Connection* self, Up up, Restart restart) const {
    std::vector<Connection*> others = connections;  // a restart may change the list
    for (Connection* c : others)
      if (c != self && up(*c)) restart(*c, "starting again behind a connection given up on with statements in flight");
  }
};

// A named statement of the store's dialect and its parameters, one of a
// transaction's (the connections' execute_all()).
struct Call {
  std::string statement;
  std::vector<std::string> params;
};

// What a connection tells the store and the timers. `Request` carries a
// `done` callback taking (const Answer&, const StoreError*); a failed
// request gets an empty Answer{}.
template <class Request, class Answer>
class ConnectionCore : protected Reconnector::Attempts, protected RequestTimer::Requests {
 public:
  ConnectionCore(const ConnectionCore&) = delete;
  ConnectionCore& operator=(const ConnectionCore&) = delete;

  // Told when the connection goes down (with why) and when it is usable
  // again: once per transition (set before start()).
  void set_state_hook(std::function<void(bool up, const std::string& why)> hook) {
    reconnector_.set_state_hook(std::move(hook));
  }
  // Loop thread only, from here on: the turn's-end send, the command
  // timeout and the first attempt.
  void start() {
    kick_.open();
    request_timer_.start();
    reconnector_.start();
  }
  // Requests queued or in flight.
  std::size_t pending() const noexcept { return queue_.size() + inflight_.size(); }
  const std::string& name() const noexcept { return name_; }

 protected:
  ConnectionCore(Loop& loop, const SqlSettings& settings, std::string name)
      : loop_(loop), settings_(settings), name_(std::move(name)) {}
  ~ConnectionCore() = default;

  // Sends what was queued (at the loop turn's end).
  virtual void send_queued() = 0;

  // What was queued goes out at the turn's end (not once closed).
  void kick() {
    if (!reconnector_.closed()) kick_.request();
  }
  // After close(), a request is refused on the next turn: true when `done` was.
  template <class Done>
  bool refused_closed(Done& done) {
    if (!reconnector_.closed()) return false;
    loop_.post([done = std::move(done), err = unavailable("the store is closed")] { done(Answer{}, &err); });
    return true;
  }
  StoreError unavailable(const std::string& why) const { return StoreError::unavailable(name_, why); }

  static void fail_all(std::deque<Request>& requests, const StoreError& error) {
    for (auto& r : requests) r.done(Answer{}, &error);
    requests.clear();
  }
  // The connection dropped (torn down already): what was in flight may or
  // may not have run, and fails; what was queued waits for the next
  // attempt unless `fail_queued`. The reconnector is told `why` once, and
  // makes the next attempt after the back-off.
  void dropped(const std::string& why, const StoreError& error, bool fail_queued) {
    std::deque<Request> inflight = std::move(inflight_);
    inflight_.clear();
    reconnector_.down(why);
    fail_all(inflight, error);
    if (!fail_queued) return;
    std::deque<Request> queued = std::move(queue_);
    queue_.clear();
    fail_all(queued, error);
  }
  // close()'s end (the reconnector closed: it hears nothing more, and
  // what the callbacks ask for is refused): everything pending fails, and
  // the turn's-end send stops.
  void close_requests() {
    dropped("the store is closed", unavailable("the store is closed"), true);
    kick_.close();
  }
  // Looks `host` up on libuv's thread pool for the attempt under way (the
  // client library's own lookup would block the loop): `found(address)`,
  // or `failed(why)`; neither when the attempt is over by then
  // (`current(status)` false, or a later attempt under way).
  template <class Current, class Found, class Failed>
  void resolve(const std::string& host, Current current, Found found, Failed failed) {
    const unsigned attempt = attempt_;
    int rc = resolve_host(loop_.uv(), host, [=, this](int status, std::string address) {
      if (!current(status) || attempt_ != attempt) return;
      if (address.empty())
        return failed(fmt::format("cannot resolve {}: {}", host, status == 0 ? "no address" : uv_strerror(status)));
      found(address);
    });
    if (rc < 0) failed(fmt::format("cannot resolve {}: {}", host, uv_strerror(rc)));
  }

  Loop& loop_;
  const SqlSettings settings_;
  const std::string name_;
  TurnEnd kick_{[this] { send_queued(); }};  // sends what was queued, at the loop turn's end
  unsigned attempt_ = 0;  // connection attempts made: a late lookup answers an old one
  Reconnector reconnector_{loop_, Backoff(settings_.reconnect_min, settings_.reconnect_max), settings_.connect_timeout,
                           *this};
  RequestTimer request_timer_{loop_, settings_.command_timeout, *this};

  std::deque<Request> queue_;     // not yet sent
  std::deque<Request> inflight_;  // sent, answered in order
};

}  // namespace lockwatch::detail::sqlcommon
