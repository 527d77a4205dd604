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
// its own state; its close() stops reconnecting, fails what is pending
// and closes the handles, and the loop then drains (Loop::shutdown): the
// object may be destroyed once the loop has stopped. Threading: the loop
// thread only, but construction.
// Costs: nothing beyond the driver's; a refusal after close() is one
// posted task.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
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

// A connection on a StaleSessions list: restart() takes it down and up
// again when it has a server session (its set-up under way, or usable).
class Restartable {
 public:
  virtual void restart(const char* why) = 0;

 protected:
  ~Restartable() = default;
};

// The server sessions (MariaDB thread ids, PostgreSQL backend pids) of
// connections given up on with statements in flight, and the connections
// that share the list (a store's statement connections). Loop thread only.
template <class Id>
struct StaleSessions {
  std::vector<Id> ids;
  std::vector<Restartable*> connections;

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
  // The connections but `self` start again, behind the session `self` left.
  void restart_others(const Restartable* self) const {
    std::vector<Restartable*> others = connections;  // a restart may change the list
    for (Restartable* c : others)
      if (c != self) c->restart("starting again behind a connection given up on with statements in flight");
  }
};

// A uv_poll_t on a client library's socket. The handle watches a
// duplicate of the library's descriptor, closed only once the handle is:
// a library may close its own when it finds the connection lost, and that
// number may be another thread's by the time the loop stops watching it.
// Another socket (or `renew`: one that may reuse the number) gets a fresh
// handle. Loop thread only; close() before the loop drains.
class SocketWatch {
 public:
  // Watches `fd` for `events` (uv_poll's, with UV_DISCONNECT; 0: none),
  // calling `on_poll` with `owner` as the handle's data: why it cannot,
  // or null.
  const char* watch(uv_loop_t* loop, int fd, int events, bool renew, void* owner, uv_poll_cb on_poll) {
    if (handle_ != nullptr && (renew || sock_ != fd)) close();
    if (handle_ == nullptr) {
      const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (dup < 0) return "cannot watch the connection's socket (dup)";
      auto* h = new Handle{{}, dup};
      if (uv_poll_init_socket(loop, &h->poll, dup) != 0) {
        ::close(dup);
        delete h;
        return "cannot watch the connection's socket";
      }
      h->poll.data = owner;
      handle_ = h;
      sock_ = fd;
    }
    if (events != events_) {
      events_ = events;
      events != 0 ? uv_poll_start(&handle_->poll, events | UV_DISCONNECT, on_poll) : uv_poll_stop(&handle_->poll);
    }
    return nullptr;
  }
  // Shuts the socket both ways: a goodbye then cannot wait on a server
  // that stopped answering.
  void shutdown() const {
    if (handle_ != nullptr) ::shutdown(handle_->fd, SHUT_RDWR);
  }
  // Stops watching; the handle and the duplicate go in its close callback.
  void close() {
    if (handle_ == nullptr) return;
    uv_poll_stop(&handle_->poll);
    uv_close(reinterpret_cast<uv_handle_t*>(&handle_->poll), [](uv_handle_t* h) {
      auto* p = reinterpret_cast<Handle*>(h);  // the handle is its first member
      ::close(p->fd);
      delete p;
    });
    handle_ = nullptr;
    sock_ = -1;
    events_ = 0;
  }

 private:
  struct Handle {
    uv_poll_t poll;  // first: the close callback gets it
    int fd;
  };
  Handle* handle_ = nullptr;
  int sock_ = -1;  // the library's descriptor it duplicates
  int events_ = 0;
};

// A named statement of the store's dialect and its parameters, one of a
// transaction's (the connections' execute_all()).
struct Call {
  std::string statement;
  std::vector<std::string> params;
};

// What a connection tells the store and the timers. `Request` carries a
// `done` callback taking (const Answer&, const StoreError*); a failed
// request gets an empty Answer{}. `Id` names a server session.
template <class Request, class Answer, class Id>
class ConnectionCore : protected Reconnector::Attempts, protected RequestTimer::Requests, protected Restartable {
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
  // On `stale`'s list (none: not tracked) while it lives.
  ConnectionCore(Loop& loop, const SqlSettings& settings, std::string name, std::shared_ptr<StaleSessions<Id>> stale)
      : loop_(loop), settings_(settings), name_(std::move(name)), stale_(std::move(stale)) {
    if (stale_) stale_->connections.push_back(this);
  }
  ~ConnectionCore() {
    if (stale_) std::erase(stale_->connections, static_cast<Restartable*>(this));
  }

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
  // Going down, before the teardown: with statements in flight on a
  // session the server knows (`sent`), `session()` goes on the stale list
  // and true tells lost() to restart the others.
  template <class Session>
  bool leave_behind(bool sent, Session session) {
    if (!stale_ || !sent || inflight_.empty()) return false;
    stale_->add(session());
    return true;
  }
  // The connection dropped (torn down already): what was in flight may or
  // may not have run, and fails; what was queued waits for the next
  // attempt unless `fail_queued` (an attempt, which it waited for, or a
  // refused set-up). The reconnector is told `why` once, and makes the
  // next attempt after the back-off.
  void lost(const std::string& why, const StoreError& error, bool fail_queued, bool left_behind) {
    std::deque<Request> inflight = std::exchange(inflight_, {});
    reconnector_.down(why);
    fail_all(inflight, error);
    if (fail_queued) {
      std::deque<Request> queued = std::exchange(queue_, {});  // a callback may queue anew
      fail_all(queued, error);
    }
    if (left_behind) stale_->restart_others(this);
  }
  // close(): no more attempts or timeouts, `teardown()`, everything
  // pending fails (what its callbacks ask for is refused), no more sends.
  template <class Teardown>
  void close_core(Teardown teardown) {
    reconnector_.close();
    request_timer_.close();
    teardown();
    lost("the store is closed", unavailable("the store is closed"), true, false);
    kick_.close();
  }
  // Why an attempt, or a request, was given up on.
  std::string connect_timed_out() const {
    return fmt::format("no connection within the connect timeout ({} ms)", settings_.connect_timeout.count());
  }
  std::string command_timed_out() const {
    return fmt::format("no answer within the command timeout ({} ms)", settings_.command_timeout.count());
  }
  // A new attempt's address: `local` (a local socket's: what the client
  // library is given then) or a numeric `host` at once; else `host` looked
  // up on libuv's thread pool (the client library's own lookup would block
  // the loop): `found(address)`, or `failed(why)`; neither when the
  // attempt is over by then (`current(status)` false, or a later attempt
  // under way).
  template <class Current, class Found, class Failed>
  void resolve(const std::string& host, const char* local, Current current, Found found, Failed failed) {
    const unsigned attempt = ++attempt_;
    if (local != nullptr || numeric_host(host)) return found(local != nullptr ? std::string(local) : host);
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
  const std::shared_ptr<StaleSessions<Id>> stale_;  // null: not tracked
  TurnEnd kick_{[this] { send_queued(); }};  // sends what was queued, at the loop turn's end
  unsigned attempt_ = 0;  // connection attempts made: a late lookup answers an old one
  Reconnector reconnector_{loop_, Backoff(settings_.reconnect_min, settings_.reconnect_max), settings_.connect_timeout,
                           *this};
  RequestTimer request_timer_{loop_, settings_.command_timeout, *this};

  std::deque<Request> queue_;     // not yet sent
  std::deque<Request> inflight_;  // sent, answered in order
};

}  // namespace lockwatch::detail::sqlcommon
