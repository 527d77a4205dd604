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
// A connection takes requests once its session is set up (Session): the
// sessions left behind ended, the session's settings, the tables checked
// (made when missing), its statements prepared where the server prepares
// them; a failed step gives the connection up, as a failed attempt.
//
// ConnectionCore is that machinery; the client (the derived connection)
// connects, sends and reads through its library. close() stops
// reconnecting, fails what is pending and closes the handles, and the
// loop then drains (Loop::shutdown): the object may be destroyed once the
// loop has stopped. Threading: the loop thread only, but construction.
// Costs: nothing beyond the client library's; a refusal after close() is
// one posted task.
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
#include <system_error>
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

// A named statement of the store's dialect (sqlcommon/sql_recipe.hpp
// lists the recipe's): its `steps` (MariaDB's sent in order in one round
// trip, the last result set its answer; PostgreSQL's one, prepared) and
// each parameter's type ('x' hex text, 'n' a number, 'X', 'N' arrays of
// either, 'b' a boolean). In a transaction (execute_all()), MariaDB's
// first step is part of one compound statement, its answer the values of
// `answer`'s expressions after it; PostgreSQL's execute() runs the
// statement `first` names before it, on its first parameter.
struct Statement {
  std::string name;
  std::string types;
  std::vector<std::string> steps;
  std::vector<std::string> answer = {};
  std::string first = {};
};

// What a connection runs before it takes requests (ConnectionCore's
// set-up): the sessions left behind ended, `setup` in order, then the
// tables' check: `check`, or (none) the first statement's prepare, then
// the others' and `plan_check` (a planner's refusal). When the check
// fails with an error of `missing` (a table, a column), `create` in order
// (an error of `exists`: another connection made it meanwhile) and the
// check again, once.
template <class Id>
struct Session {
  std::vector<Statement> statements;
  std::shared_ptr<StaleSessions<Id>> stale;  // null: not tracked
  std::vector<std::string> setup;
  std::string check;
  std::vector<std::string> create;
  std::string plan_check;
  std::string table;  // for messages
  std::vector<std::error_code> missing, exists;
};

// The machinery of a SQL connection on the loop, written once; the
// client (the derived connection: SqlConnection for MariaDB, PgConnection
// for PostgreSQL) adds only what its client library does its own way:
// starting a non-blocking connect and driving it, sending the queued
// requests, reading their answers off its socket, closing the library's
// handle, and its errors. Here: the link's state, the attempt (the host
// looked up, the connect deadline, the back-off, state changes told once),
// the queue that waits while the link is down, the requests in flight
// with their command timeout, the turn's-end send, the watch on the
// client's socket, the sessions left behind, the session's set-up
// (Session), dropping and closing.
//
// `Request` carries `done`, taking (const Answer&, const StoreError*) (a
// failed request gets an empty Answer{}), and `sent`, its send time.
// `Id` names a server session.
template <class Request, class Answer, class Id>
class ConnectionCore : protected Reconnector::Attempts, protected RequestTimer::Requests, protected Restartable {
 public:
  using Done = std::function<void(const Answer&, const StoreError*)>;

  // Told when the connection goes down (with why) and when it is usable
  // again: once per transition (set before start()).
  void set_state_hook(std::function<void(bool up, const std::string& why)> hook) {
    reconnector_.set_state_hook(std::move(hook));
  }
  // Told each time the connection became usable (its set-up done).
  void set_ready_hook(std::function<void()> hook) { ready_hook_ = std::move(hook); }
  // Loop thread only, from here on: the turn's-end send, the command
  // timeout and the first attempt.
  void start() {
    kick_.open();
    request_timer_.start();
    reconnector_.start();
  }
  // No more attempts or timeouts, the client closed (politely when the
  // link was usable), everything pending fails (what its callbacks ask
  // for is refused), no more sends.
  void close() {
    if (state_ == State::kClosed) return;
    const bool healthy = state_ == State::kReady;
    state_ = State::kClosed;
    reconnector_.close();
    request_timer_.close();
    teardown(healthy);
    lost("the store is closed", unavailable("the store is closed"), true, false);
    kick_.close();
  }
  // Requests queued or in flight.
  std::size_t pending() const noexcept { return queue_.size() + inflight_.size(); }
  const std::string& name() const noexcept { return name_; }

 protected:
  // kSetUp: connected, the client's session set-up under way (the connect
  // deadline still runs); kReady: usable.
  enum class State { kDown, kConnecting, kSetUp, kReady, kClosed };

  // `host` is looked up unless `local` names a local socket (what the
  // client library is given for it then). On the session's stale list
  // (none: not tracked) while it lives.
  ConnectionCore(Loop& loop, const SqlSettings& settings, std::string name, std::string host, const char* local,
                 Session<Id> session)
      : loop_(loop),
        settings_(settings),
        name_(std::move(name)),
        session_(std::move(session)),
        host_(std::move(host)),
        local_(local) {
    if (session_.stale) session_.stale->connections.push_back(this);
  }
  ~ConnectionCore() {
    if (session_.stale) std::erase(session_.stale->connections, static_cast<Restartable*>(this));
  }

  // The client's side. connect_to(): start a connection to `address` (a
  // numeric host, or `local`); socket(): its socket (-1: none);
  // on_socket(): the socket is ready (uv_poll's status and events);
  // send_queued(): send what was queued, at the turn's end; session():
  // the server session a drop would leave behind (0: none);
  // release(): close the library's handle (`graceful`: it may say goodbye).
  virtual void connect_to(const std::string& address) = 0;
  virtual int socket() const = 0;
  virtual void on_socket(int status, int events) = 0;
  virtual void send_queued() = 0;
  virtual Id session() const = 0;
  virtual void release(bool graceful) = 0;
  // The set-up's side. set_up_step(): send `sql`, or (with `prepare`)
  // that statement's prepare, answered in order; end_sessions(): the
  // statements that end the sessions `ids` left behind, in their `round`
  // (none: no more rounds), the last answering whether any is left (a
  // cell but "0"); table_error(): the error the connection fails with when
  // the tables' check (or a prepare) was refused with `error`.
  virtual void set_up_step(std::string sql, const Statement* prepare, Done done) = 0;
  virtual std::vector<std::string> end_sessions(const std::vector<Id>& ids, int round) const = 0;
  virtual StoreError table_error(const StoreError& error) const = 0;

  // Connected or usable: the client's socket is open.
  bool linked() const noexcept { return state_ == State::kSetUp || state_ == State::kReady; }
  // `r` waits its turn (once usable, the turn's end); after close() it is
  // refused on the next turn.
  void enqueue(Request r) {
    if (state_ == State::kClosed) {
      loop_.post([done = std::move(r.done), err = unavailable("the store is closed")] { done(Answer{}, &err); });
      return;
    }
    queue_.push_back(std::move(r));
    if (state_ == State::kReady) kick();
  }
  // What was queued goes out at the turn's end (not once closed).
  void kick() {
    if (state_ != State::kClosed) kick_.request();
  }
  StoreError unavailable(const std::string& why) const { return StoreError::unavailable(name_, why); }
  // Connected (the client set kSetUp): the session's set-up (Session),
  // then set_up_done().
  void start_set_up() { end_stale(session_.stale ? session_.stale->ids : std::vector<Id>{}, 0); }
  // The statement the session names `name`; none (`done` then fails, on
  // the next turn) cannot be: the store names its own.
  const Statement* statement(const std::string& name, Done& done) {
    for (const auto& s : session_.statements)
      if (s.name == name) return &s;
    loop_.post([done = std::move(done), err = unavailable("no statement " + name)] { done(Answer{}, &err); });
    return nullptr;
  }
  // The set-up is over: usable, told once; what waited goes out.
  void set_up_done() {
    state_ = State::kReady;
    reconnector_.connected();
    reconnector_.usable();
    if (state_ != State::kReady) return;
    if (ready_hook_) ready_hook_();
    if (state_ == State::kReady && !queue_.empty()) kick();
  }
  // Watches the client's socket for `events` (`renew`: a fresh handle, the
  // socket may be new): false when it cannot (the connection dropped).
  bool watch(int events, bool renew) {
    const int fd = socket();
    const char* failed =
        fd < 0 ? "the client library has no socket" : socket_.watch(loop_.uv(), fd, events, renew, this, on_poll);
    if (failed != nullptr) fail_unavailable(failed);
    return failed == nullptr;
  }
  // The connection dropped, `why` (told to the state hook) and `error`
  // (what the requests in flight get: they may or may not have run). What
  // was queued waits for the next attempt unless this was an attempt
  // (which it waited for). A session left behind with statements in
  // flight goes on the stale list, and the others restart.
  void fail(const std::string& why, const StoreError& error) {
    if (state_ == State::kClosed || state_ == State::kDown) return;
    const bool connecting = state_ == State::kConnecting || state_ == State::kSetUp;
    const bool left_behind = leave_behind();
    teardown(false);
    lost(why, error, connecting, left_behind);
  }
  void fail_unavailable(const std::string& why) { fail(why, unavailable(why)); }
  // The set-up failed with `error`: the connection is given up, and what
  // waited for it fails (as after any failed attempt).
  void set_up_failed(const StoreError& error) { fail(error.message, error); }
  // `error`, its message told as `what` says ({0}: the table, {1}: the message).
  StoreError about_table(const StoreError& error, std::string_view what) const {
    StoreError why = error;
    why.message = fmt::format(fmt::runtime(what), session_.table, error.message);
    return why;
  }

  Loop& loop_;
  const SqlSettings settings_;
  const std::string name_;
  const Session<Id> session_;
  State state_ = State::kDown;
  Reconnector reconnector_{loop_, Backoff(settings_.reconnect_min, settings_.reconnect_max), settings_.connect_timeout,
                           *this};
  RequestTimer request_timer_{loop_, settings_.command_timeout, *this};

  std::deque<Request> queue_;     // not yet sent
  std::deque<Request> inflight_;  // sent, answered in order

 private:
  // Reconnector::Attempts: an attempt, its address looked up on libuv's
  // thread pool unless numeric (the client library's own lookup would
  // block the loop); not heard when the loop cancelled the lookup, or
  // when the attempt is over by then (a later one under way).
  void attempt() final {
    if (state_ == State::kClosed) return;
    state_ = State::kConnecting;
    const unsigned attempt = ++attempt_;
    if (local_ != nullptr || numeric_host(host_)) return connect_to(local_ != nullptr ? std::string(local_) : host_);
    int rc = resolve_host(loop_.uv(), host_, [=, this](int status, std::string address) {
      if (status == UV_ECANCELED || state_ != State::kConnecting || attempt_ != attempt) return;
      if (address.empty())
        return fail_unavailable(
            fmt::format("cannot resolve {}: {}", host_, status == 0 ? "no address" : uv_strerror(status)));
      connect_to(address);
    });
    if (rc < 0) fail_unavailable(fmt::format("cannot resolve {}: {}", host_, uv_strerror(rc)));
  }
  void attempt_timed_out() final {
    if (state_ != State::kConnecting && state_ != State::kSetUp) return;
    fail_unavailable(
        fmt::format("no connection within the connect timeout ({} ms)", settings_.connect_timeout.count()));
  }
  // RequestTimer::Requests: the oldest request in flight (none while
  // setting up: the connect deadline runs instead, and request_timer_'s
  // watch() then arms nothing), and the server silent for the command
  // timeout.
  RequestTimer::Clock::time_point unanswered_since() const final {
    return state_ == State::kReady && !inflight_.empty() ? inflight_.front().sent : RequestTimer::kNone;
  }
  void overdue() final {
    fail_unavailable(fmt::format("no answer within the command timeout ({} ms)", settings_.command_timeout.count()));
  }
  // Restartable: down and up again behind a session another left.
  void restart(const char* why) final {
    if (linked()) fail_unavailable(why);
  }

  // A step of the set-up, its answer not heard once the set-up is over
  // (the connection dropped meanwhile).
  void step(std::string sql, const Statement* prepare, Done done) {
    set_up_step(std::move(sql), prepare, [this, done = std::move(done)](const Answer& answer, const StoreError* err) {
      if (state_ == State::kSetUp) done(answer, err);
    });
  }
  // The sessions `ids` left behind ended, a round at a time (then, ended
  // or beyond waiting for, not tried again); then `setup` and the check.
  void end_stale(std::vector<Id> ids, int round) {
    std::vector<std::string> steps = ids.empty() ? std::vector<std::string>{} : end_sessions(ids, round);
    if (steps.empty()) {
      if (!ids.empty()) session_.stale->forget(ids);
      return check_tables(false);
    }
    const auto ignore = [](const Answer&, const StoreError*) {};
    for (std::size_t i = 0; i + 1 < steps.size(); ++i) step(std::move(steps[i]), nullptr, ignore);
    step(std::move(steps.back()), nullptr, [this, ids, round](const Answer& answer, const StoreError* err) {
      if (!err && !answer.null(0, 0) && answer.at(0, 0) != "0") return end_stale(ids, round + 1);
      session_.stale->forget(ids);
      check_tables(false);
    });
  }
  // `setup` (not again once `created`), then the tables' check; when a
  // table or a column is missing, `create` and the check again, once.
  // Nothing to check (a notices connection): usable after `setup`.
  void check_tables(bool created) {
    const bool prepared = session_.check.empty(), unchecked = prepared && session_.statements.empty();
    for (std::size_t i = 0; !created && i < session_.setup.size(); ++i)
      step(session_.setup[i], nullptr,
           [this, last = unchecked && i + 1 == session_.setup.size()](const Answer&, const StoreError* err) {
             if (err) return set_up_failed(about_table(*err, "the session set-up failed: {1}"));
             if (last) set_up_done();
           });
    if (unchecked) return;
    step(session_.check, prepared ? &session_.statements.front() : nullptr,
         [this, created](const Answer&, const StoreError* err) {
           if (!err) return prepare_rest();
           if (created || std::ranges::count(session_.missing, err->code) == 0)
             return set_up_failed(table_error(*err));
           for (const auto& sql : session_.create)
             step(sql, nullptr, [this](const Answer&, const StoreError* e) {
               if (e && std::ranges::count(session_.exists, e->code) == 0)
                 set_up_failed(about_table(*e, "cannot create the lock table {} or its holders' table: {}"));
             });
           check_tables(true);
         });
  }
  // The tables checked: the other statements prepared (when the check was
  // the first one's prepare), then the plan check. Answers come in order:
  // the last prepare's tells that all were.
  void prepare_rest() {
    const std::size_t n = session_.check.empty() ? session_.statements.size() : 1;
    for (std::size_t i = 1; i < n && state_ == State::kSetUp; ++i)
      step({}, &session_.statements[i], [this, last = i + 1 == n](const Answer&, const StoreError* err) {
        if (err) return set_up_failed(table_error(*err));
        if (last) check_plan();
      });
    if (n <= 1) check_plan();
  }
  void check_plan() {
    if (session_.plan_check.empty()) return set_up_done();
    step(session_.plan_check, nullptr,
         [this](const Answer&, const StoreError* err) { err ? set_up_failed(table_error(*err)) : set_up_done(); });
  }

  static void on_poll(uv_poll_t* handle, int status, int events) {
    static_cast<ConnectionCore*>(handle->data)->on_socket(status, events);
  }
  // Going down with statements in flight on a session the server knows:
  // it goes on the stale list, and true tells lost() to restart the others.
  bool leave_behind() {
    const Id id = session_.stale && !inflight_.empty() ? session() : Id{};
    if (id == Id{}) return false;
    session_.stale->add(id);
    return true;
  }
  // A connection given up on is shut first (through the duplicate, open
  // even when the library closed its own): its goodbye cannot wait on a
  // server that stopped answering.
  void teardown(bool graceful) {
    request_timer_.stop();
    if (!graceful) socket_.shutdown();
    socket_.close();
    release(graceful);
    if (state_ != State::kClosed) state_ = State::kDown;
  }
  // Torn down already: what was in flight fails, what was queued too when
  // `fail_queued`; the reconnector is told `why` once and makes the next
  // attempt after the back-off.
  void lost(const std::string& why, const StoreError& error, bool fail_queued, bool left_behind) {
    std::deque<Request> inflight = std::exchange(inflight_, {});
    reconnector_.down(why);
    for (auto& r : inflight) r.done(Answer{}, &error);
    if (fail_queued)
      for (auto& r : std::exchange(queue_, {})) r.done(Answer{}, &error);  // a callback may queue anew
    if (left_behind) session_.stale->restart_others(this);
  }

  const std::string host_;
  const char* const local_;  // null: a TCP host
  std::function<void()> ready_hook_;
  TurnEnd kick_{[this] { send_queued(); }};  // sends what was queued, at the loop turn's end
  unsigned attempt_ = 0;  // connection attempts made: a late lookup answers an old one
  SocketWatch socket_;    // on the client's socket
};

}  // namespace lockwatch::detail::sqlcommon
