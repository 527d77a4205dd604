// lib/store/postgresql/pg_connection.hpp: one PostgreSQL connection on the
// loop thread, through libpq's asynchronous API.
//
// Connecting is PQconnectStartParams and PQconnectPoll driven by a
// uv_poll_t on the connection's socket (a host name is looked up on
// libuv's thread pool first and handed to libpq as hostaddr, so libpq
// never resolves on the loop). Once connected the connection is in
// pipeline mode and non-blocking: each request is a prepared statement
// sent with PQsendQueryPrepared and its own sync (so each runs as its own
// transaction, and one that fails fails alone), sent on the next loop turn
// together with whatever else was queued, without waiting for the answers
// before it; PQconsumeInput and PQgetResult, as far as PQisBusy allows,
// read the answers in order. The loop never waits on the database.
//
// A connection first runs its session's set-up (docs/stores.md,
// "Connections"): a statements connection prepares its statements, the
// table check (a missing table is created once, with its holders' table;
// a table without its key fails the planning of an EXPLAIN); a notices
// connection runs LISTEN. Requests wait for that.
//
// Failures are StoreErrors naming the server: a refused login is kAuth,
// anything else that stops the connection kUnavailable; a statement the
// server refuses carries its SQLSTATE (pg_error.hpp). Timeouts,
// reconnection, the server processes left behind (ended here with
// pg_terminate_backend, waiting for them to exit), threading and the
// callbacks' contract are sqlcommon::ConnectionCore's; an idle connection
// the server closed is noticed at once (the socket is always watched).
#pragma once

#include <uv.h>

#include <chrono>
#include <memory>
#include <string_view>

#include "store/sqlcommon/connection_core.hpp"
#include "store/sqlcommon/values.hpp"
#include "store/postgresql/pg_target.hpp"

struct pg_conn;
struct pg_result;

namespace lockwatch::detail {

// A statement's rows as text (libpq's text format; names and tokens as hex).
using PgRows = sqlcommon::Rows;

// `rows` is meaningful only when `error` is null; `error` is valid during
// the call only.
using PgDone = std::function<void(const PgRows& rows, const StoreError* error)>;

// A statement prepared at connect (its one step, parameters typed as
// sqlcommon::Statement says), and one of a transaction (execute_all())
// with its parameters. What a connection runs before it takes requests
// (ConnectionCore's set-up): the stale backends ended, the prepares (the
// first doubling as the table check), the plan check; a notices
// connection's LISTEN as its `setup`.
using PgStatement = sqlcommon::Statement;
using PgCall = sqlcommon::Call;
using PgSession = sqlcommon::Session<int>;

// A request on a connection (a transaction's statements, or a step of
// the set-up: a prepare, or a statement's text), kept until it is answered.
struct PgRequest {
  struct ResultFree {
    void operator()(pg_result* r) const noexcept;
  };
  std::vector<PgCall> calls = {};       // the transaction's statements (none: a set-up step)
  const PgStatement* prepare = nullptr;  // a set-up step: this statement's prepare, else `sql`
  std::string sql = {};
  PgDone done = {};
  std::function<void(std::size_t, const PgRows&)> each = {};  // execute_all's, if any
  std::chrono::steady_clock::time_point sent{};
  bool ending = false;  // a statement's result came: a null ends it
  std::vector<std::unique_ptr<pg_result, ResultFree>> results = {};  // each statement's, in order

  // The statements it runs: a set-up step one.
  std::size_t statements() const noexcept { return calls.empty() ? 1 : calls.size(); }
};

class PgConnection final : public sqlcommon::ConnectionCore<PgRequest, PgRows, int> {
 public:
  PgConnection(Loop& loop, PgTarget target, const sqlcommon::SqlSettings& settings, PgSession session);
  ~PgConnection();

  // Loop thread only, from here on (start() first).
  // Runs the prepared statement `statement` with these parameters (text
  // format, none NULL), after its PgStatement::first in one transaction.
  void execute(const std::string& statement, std::vector<std::string> params, PgDone done);
  // Runs the statements as one transaction (one sync): each sees what the
  // ones before it did and locked (READ COMMITTED takes a snapshot per
  // statement), and the first that fails undoes them all and skips the
  // rest. `done` gets the last statement's rows, or the first error; with
  // `each`, it is called once per statement with its rows, in order,
  // before `done`, when all of them ran (never after an error).
  void execute_all(std::vector<PgCall> calls, std::function<void(std::size_t, const PgRows&)> each, PgDone done);
  // A notices connection: each NOTIFY on its channel (payload as sent).
  void set_notify_hook(std::function<void(std::string_view payload)> hook) { notify_hook_ = std::move(hook); }
  // Reads and dispatches the answers that have arrived, now. Never from
  // inside one of this connection's callbacks.
  void poll_now();

 private:
  using Request = PgRequest;

  // ConnectionCore's client side.
  void connect_to(const std::string& hostaddr) override;
  int socket() const override;
  void on_socket(int status, int events) override;
  void send_queued() override;
  int session() const override;
  void release(bool graceful) override;

  void set_up_step(std::string sql, const PgStatement* prepare, PgDone done) override;
  std::vector<std::string> end_sessions(const std::vector<int>& pids, int round) const override;
  StoreError table_error(const StoreError& error) const override;

  void connect_step(int polling_status);
  void connected();
  bool send(Request& r);
  void flush();
  void on_readable();
  void drain();
  void complete_front();

  const PgTarget target_;
  std::function<void(std::string_view)> notify_hook_;

  pg_conn* conn_ = nullptr;
  // inflight_: the session set-up's requests too.
};

}  // namespace lockwatch::detail
