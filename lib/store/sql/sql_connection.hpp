// lib/store/sql/sql_connection.hpp: one MariaDB/MySQL connection on the
// loop thread, through MariaDB Connector/C's non-blocking API.
//
// Every call that could block is started with its `_start` variant and
// resumed with `_cont` when the socket is ready (a host name is looked up
// on libuv's thread pool first): a uv_poll_t on the
// connection's socket (one per socket; a reconnect makes a new one) and a
// timer for the library's own timeouts. The loop never waits on the
// database.
//
// Requests (a statement, or several that go together) queue in order.
// Those queued when the loop comes round go to the server together, as one
// multi-statement round trip, and each is answered on its own (its last
// result set). A request the server refuses fails alone: the requests
// after it in the same round trip were not run and go out again, after a
// ROLLBACK sent at once (a request may have left a transaction open).
// Callbacks as sqlcommon::ConnectionCore says.
//
// A connection runs a session set-up first (UTC time zone, strict mode,
// READ COMMITTED, a lock wait bounded by command_timeout) and then checks
// the lock table, creating it when it is missing; requests wait for that.
// Failures are StoreErrors naming the server: a refused login is kAuth,
// anything else that stops the connection kUnavailable; a statement the
// server refuses carries its error number, classified by sql_error() (a
// deadlock is kRetryLater, most are kRefused). Timeouts, reconnection
// and the threads left behind are sqlcommon::ConnectionCore's (these end
// with KILL CONNECTION, then a wait until the process list no longer shows
// them); an idle connection the server closed is noticed at once.
#pragma once

#include <uv.h>

#include <chrono>
#include <memory>

#include "store/sqlcommon/connection_core.hpp"
#include "store/sqlcommon/values.hpp"
#include "store/sql/sql_target.hpp"

struct st_mysql;
struct st_mysql_res;

namespace lockwatch::detail {

using SqlResult = sqlcommon::Rows;

// `result` is meaningful only when `error` is null; `error` is valid during
// the call only (classified by sql_error(); a lost connection or a timeout
// is kUnavailable).
using SqlDone = std::function<void(const SqlResult& result, const StoreError* error)>;

// A named statement: its steps' $1..$9 are filled with the parameters as
// its types say (sql::fill()). What a connection runs before it takes
// requests (ConnectionCore's set-up): the stale threads ended, the session
// settings, the tables' check (a SELECT of their columns; 1146 or 1054: the
// tables made, then ALTER TABLE ... ADD COLUMN IF NOT EXISTS each column
// added since).
using SqlStatement = sqlcommon::Statement;
using SqlSession = sqlcommon::Session<unsigned long>;

// Statements sent together (separated by ";\n"), kept until answered.
struct SqlRequest {
  std::string sql;
  SqlDone done;
  std::size_t statements = 1;  // results still to come
  struct ResultFree {
    void operator()(st_mysql_res* r) const noexcept;
  };
  std::unique_ptr<st_mysql_res, ResultFree> result = {};  // the last result set so far, which `answer` reads
  SqlResult answer = {};
  std::chrono::steady_clock::time_point sent = {};  // its round trip's
};

class SqlConnection final : public sqlcommon::ConnectionCore<SqlRequest, SqlResult, unsigned long> {
 public:
  SqlConnection(Loop& loop, SqlTarget target, const sqlcommon::SqlSettings& settings, SqlSession session);
  ~SqlConnection();

  // Loop thread only, from here on: its own timer, then ConnectionCore's.
  void start();
  // The session's statement `name` (SqlStatement) with these parameters:
  // its steps in order, in one round trip; `done` gets the last result
  // set, or the first failure (the steps after it do not run).
  void execute(const std::string& name, const std::vector<std::string>& params, SqlDone done);
  // The statements as one transaction (one compound statement, then the
  // read of their answers): `each` gets each one's answer, in order,
  // before `done` (never after an error, which `done` alone gets).
  void execute_all(std::vector<sqlcommon::Call> calls, std::function<void(std::size_t, const SqlResult&)> each,
                   SqlDone done);
  void close();  // ConnectionCore's, then its own timer

 private:
  // The library call under way: none (idle, or a round trip over), the
  // connect, or a round trip's (its query, a result set's read, the next
  // result), which stays its phase while a request's callback runs.
  enum class Phase { kNone, kConnect, kQuery, kStore, kNext };
  using Request = SqlRequest;

  // ConnectionCore's client side.
  void connect_to(const std::string& host) override;
  int socket() const override;
  void on_socket(int status, int events) override;
  void send_queued() override;
  unsigned long session() const override;
  void release(bool graceful) override;

  void set_up_step(std::string sql, const SqlStatement* prepare, SqlDone done) override;
  std::vector<std::string> end_sessions(const std::vector<unsigned long>& ids, int round) const override;
  StoreError table_error(const StoreError& error) const override;

  void resume(int events);
  void connect_step(int status, st_mysql* ret);
  void result_step(int status, bool failed);
  void store_step(int status, st_mysql_res* res);
  void statement_answered();
  void statement_done();
  void statement_failed();
  void answer_front(const StoreError* err);
  void after_results();
  void wait_for(int status);
  void connection_failed(unsigned code, std::string why);

  static void on_io_timer(uv_timer_t* t);

  const SqlTarget target_;

  Phase phase_ = Phase::kNone;
  st_mysql* mysql_ = nullptr;
  uv_timer_t io_timer_{};  // the library's own timeouts (MYSQL_WAIT_TIMEOUT)
  bool timer_open_ = false;
  std::string connect_host_;  // the address of the attempt under way
  bool roll_back_ = false;  // a request failed: a ROLLBACK goes next, at once
  // inflight_: sent in the current round trip, answered in order.
  std::deque<Request> set_up_;  // the session set-up, before queue_
};

}  // namespace lockwatch::detail
