#include "store/sql/sql_connection.hpp"
#include "store/sql/sql_error.hpp"
#include "store/sql/sql_literals.hpp"

#include <errmsg.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <sys/socket.h>

namespace lockwatch::detail {

namespace {

// Statements sent in one round trip at most, and their total size: well
// under the server's max_allowed_packet (16 MiB by default, 4 MiB on old
// MySQL).
constexpr std::size_t kMaxBatch = 256;
constexpr std::size_t kMaxBatchBytes = 1 << 20;

// Errors of the client library itself (2000-2999): the connection, not
// the statement, failed.
bool client_error(unsigned code) { return code >= CR_MIN_ERROR && code <= CR_MAX_ERROR; }

// What the library waits for, and the uv_poll events that end each wait
// (a disconnect: a read sees it), as the other side's bits of `bits`.
int waits_as(int bits, bool as_uv) {
  constexpr std::pair<int, int> kWaits[] = {{MYSQL_WAIT_READ, UV_READABLE | UV_DISCONNECT},
                                            {MYSQL_WAIT_WRITE, UV_WRITABLE},
                                            {MYSQL_WAIT_EXCEPT, UV_PRIORITIZED}};
  int out = 0;
  for (const auto& [wait, uv] : kWaits)
    if (bits & (as_uv ? wait : uv)) out |= as_uv ? uv : wait;
  return out;
}

}  // namespace

void SqlRequest::ResultFree::operator()(MYSQL_RES* r) const noexcept { mysql_free_result(r); }

SqlConnection::SqlConnection(Loop& loop, SqlTarget target, const sqlcommon::SqlSettings& settings, SqlSession session)
    : ConnectionCore(loop, settings, target.name(), target.host, target.socket.empty() ? nullptr : "localhost",
                     std::move(session)),
      target_(std::move(target)) {
  [[maybe_unused]] static const int library = mysql_library_init(0, nullptr, nullptr);  // once, thread-safe
}

SqlConnection::~SqlConnection() {
  // close() ran on the loop thread and the loop drained: nothing is left
  // but, if the loop never ran, the handle itself.
  if (mysql_ != nullptr) mysql_close(mysql_);
}

void SqlConnection::start() {
  uv_timer_init(loop_.uv(), &io_timer_);
  io_timer_.data = this;
  timer_open_ = true;
  ConnectionCore::start();
}

// The steps, filled, in one round trip.
void SqlConnection::execute(const std::string& name, const std::vector<std::string>& params, SqlDone done) {
  const SqlStatement* s = statement(name, done);
  if (s == nullptr) return;
  std::string sql;
  for (const auto& step : s->steps) sql.append(sql.empty() ? "" : ";\n").append(sql::fill(step, s->types, params));
  enqueue(Request{std::move(sql), std::move(done), s->steps.size()});
}

void SqlConnection::execute_all(std::vector<sqlcommon::Call> calls,
                                std::function<void(std::size_t, const SqlResult&)> each, SqlDone done) {
  // Each answer's values are kept in session variables of their own
  // (@lw_a<column>), all read by the next statement of the round trip.
  std::string body, read;
  std::vector<std::size_t> at{0};  // each call's first column in the read, then the end
  for (const auto& call : calls) {
    const SqlStatement* s = statement(call.statement, done);
    if (s == nullptr) return;
    body += sql::fill(s->steps.front(), s->types, call.params);
    std::size_t column = at.back();
    for (const auto& expr : s->answer) {
      body += fmt::format(" SET @lw_a{} = {};", column, expr);
      read += fmt::format("{}@lw_a{}", column == 0 ? "SELECT " : ", ", column);
      ++column;
    }
    at.push_back(column);
  }
  // The transaction, then (when any answers) the read, in one round trip.
  std::string sql = sql::transaction(body).append(read.empty() ? "" : ";\n").append(read);
  auto answer = [each = std::move(each), done = std::move(done), at = std::move(at)](const SqlResult& r,
                                                                                     const StoreError* err) {
    const bool whole = r.size() == 1 && r.columns == at.back();
    for (std::size_t k = 0; !err && k + 1 < at.size(); ++k) {
      SqlResult one;  // its columns of the read (none: no answer)
      if (whole && at[k] < at[k + 1]) {
        one.cells.assign(r.cells.begin() + at[k], r.cells.begin() + at[k + 1]);
        one.columns = at[k + 1] - at[k];
      }
      each(k, one);
    }
    done(r, err);
  };
  enqueue(Request{std::move(sql), std::move(answer), read.empty() ? 1u : 2u});
}

// The attempt connects to the address ConnectionCore found, IPv4 first.
void SqlConnection::connect_to(const std::string& host) {
  phase_ = Phase::kConnect;
  mysql_ = mysql_init(nullptr);
  if (mysql_ == nullptr) return connection_failed(0, "out of memory for a connection");
  mysql_options(mysql_, MYSQL_OPT_NONBLOCK, nullptr);
  unsigned int protocol = target_.socket.empty() ? MYSQL_PROTOCOL_TCP : MYSQL_PROTOCOL_SOCKET;
  mysql_options(mysql_, MYSQL_OPT_PROTOCOL, &protocol);
  my_bool no = 0;
  mysql_options(mysql_, MYSQL_OPT_LOCAL_INFILE, &no);
  // The client library keeps the host's pointer for the attempt (its
  // error messages name it): it must outlive this call.
  connect_host_ = host;
  MYSQL* ret = nullptr;
  int status = mysql_real_connect_start(&ret, mysql_, connect_host_.c_str(), target_.user.c_str(), target_.password.c_str(),
                                        target_.database.c_str(), static_cast<unsigned>(target_.port),
                                        target_.socket.empty() ? nullptr : target_.socket.c_str(),
                                        CLIENT_MULTI_STATEMENTS | CLIENT_MULTI_RESULTS);
  connect_step(status, ret);
}

// Where each non-blocking call goes once it returned (from `_start` or
// `_cont`): on waiting for the socket, or on with its answer.
void SqlConnection::connect_step(int status, MYSQL* ret) {
  if (status != 0) return wait_for(status);
  if (ret == nullptr) return connection_failed(mysql_errno(mysql_), mysql_error(mysql_));
  // The socket is up; the threads left behind are ended, then the session
  // set-up and the table check.
  state_ = State::kSetUp;
  phase_ = Phase::kNone;
  start_set_up();
  kick();
}

void SqlConnection::result_step(int status, bool failed) {
  if (status != 0) return wait_for(status);
  if (failed) return statement_failed();
  statement_answered();
}

// A step of the set-up, after those queued before it.
void SqlConnection::set_up_step(std::string sql, const SqlStatement*, SqlDone done) {
  set_up_.push_back(Request{std::move(sql), std::move(done)});
}

// Gone already (1094) or not ours to end (1095): a KILL fails alone and
// the count tells. A killed thread leaves the process list when it has
// stopped; the wait is bounded by half the connect timeout (the whole
// set-up by all of it).
std::vector<std::string> SqlConnection::end_sessions(const std::vector<unsigned long>& ids, int round) const {
  if (round >= std::max<long long>(1, settings_.connect_timeout.count() / 2 / 20)) return {};
  std::vector<std::string> steps{"DO SLEEP(0.02)"};
  if (round == 0) {
    steps.clear();
    for (unsigned long id : ids) steps.push_back(fmt::format("KILL CONNECTION {}", id));
  }
  steps.push_back(
      fmt::format("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN ({}) AND ID <> CONNECTION_ID()",
                  fmt::join(ids, ",")));
  return steps;
}

StoreError SqlConnection::table_error(const StoreError& error) const {
  return about_table(error, "the lock table {} (or its companion _holders table) does not have lockwatch's columns "
                            "(see lockwatch's docs/stores.md for their definitions): {}");
}

void SqlConnection::send_queued() {
  if (phase_ != Phase::kNone || !linked()) return;
  std::deque<Request>& source = state_ == State::kSetUp ? set_up_ : queue_;
  // After a failed request, at once: a transaction it began holds its rows.
  if (std::exchange(roll_back_, false))
    source.push_front(Request{"ROLLBACK", [](const SqlResult&, const StoreError*) {}});
  // Idle: the socket is watched anyway, to notice a server that closes it.
  if (source.empty()) return wait_for(MYSQL_WAIT_READ);
  std::string sql;
  std::size_t n = 0;
  const auto now = RequestTimer::Clock::now();
  while (!source.empty() && n < kMaxBatch && (n == 0 || sql.size() + source.front().sql.size() < kMaxBatchBytes)) {
    if (!sql.empty()) sql += ";\n";
    sql += source.front().sql;
    n += source.front().statements;
    source.front().sent = now;
    inflight_.push_back(std::move(source.front()));
    source.pop_front();
  }
  phase_ = Phase::kQuery;
  request_timer_.watch();
  int err = 0;
  int status = mysql_real_query_start(&err, mysql_, sql.data(), static_cast<unsigned long>(sql.size()));
  result_step(status, err != 0);
}

int SqlConnection::socket() const { return mysql_ == nullptr ? -1 : static_cast<int>(mysql_get_socket(mysql_)); }

void SqlConnection::wait_for(int status) {
  if (!watch(waits_as(status, true), false)) return;
  if (status & MYSQL_WAIT_TIMEOUT) {
    uv_timer_start(&io_timer_, on_io_timer, mysql_get_timeout_value_ms(mysql_), 0);
  } else {
    uv_timer_stop(&io_timer_);
  }
}

void SqlConnection::on_socket(int status, int events) {
  if (status < 0) events = UV_READABLE | UV_WRITABLE;  // let the library see the error
  uv_timer_stop(&io_timer_);
  resume(waits_as(events, false));
}

void SqlConnection::on_io_timer(uv_timer_t* t) { static_cast<SqlConnection*>(t->data)->resume(MYSQL_WAIT_TIMEOUT); }

void SqlConnection::resume(int events) {
  switch (phase_) {
    case Phase::kNone:
      // Idle, and the socket became readable: the server closed the
      // connection (or sent what nobody asked for).
      if (linked()) connection_failed(0, "the server closed the connection");
      return;
    case Phase::kConnect: {
      MYSQL* ret = nullptr;
      int status = mysql_real_connect_cont(&ret, mysql_, events);
      return connect_step(status, ret);
    }
    case Phase::kQuery: {
      int err = 0;
      int status = mysql_real_query_cont(&err, mysql_, events);
      return result_step(status, err != 0);
    }
    case Phase::kStore: {
      MYSQL_RES* res = nullptr;
      int status = mysql_store_result_cont(&res, mysql_, events);
      return store_step(status, res);
    }
    case Phase::kNext: {
      int ret = 0;
      int status = mysql_next_result_cont(&ret, mysql_, events);
      return result_step(status, ret > 0);
    }
  }
}

void SqlConnection::statement_answered() {
  // A statement of the request at the front of inflight_ was run: read
  // its result set, if it has one.
  if (inflight_.empty()) return connection_failed(0, "the server sent more results than statements");  // cannot be
  if (mysql_field_count(mysql_) == 0) return statement_done();
  phase_ = Phase::kStore;
  MYSQL_RES* res = nullptr;
  int status = mysql_store_result_start(&res, mysql_);
  store_step(status, res);
}

// The statement's result set read (or not, `status`: wait for the socket).
void SqlConnection::store_step(int status, MYSQL_RES* res) {
  if (status != 0) return wait_for(status);
  if (res == nullptr) return statement_failed();
  Request& front = inflight_.front();
  front.result.reset(res);  // the answer's cells are views into it
  SqlResult& out = front.answer;
  out.cells.clear();
  out.columns = mysql_num_fields(res);
  out.cells.reserve(out.columns * mysql_num_rows(res));
  while (MYSQL_ROW row = mysql_fetch_row(res)) {
    unsigned long* lengths = mysql_fetch_lengths(res);
    for (std::size_t i = 0; i < out.columns; ++i)
      out.cells.push_back(row[i] == nullptr ? std::nullopt : std::optional<std::string_view>(std::in_place, row[i], lengths[i]));
  }
  statement_done();
}

// A statement of the request at the front of inflight_ is answered: the
// request too with its last, else the round trip goes on.
void SqlConnection::statement_done() {
  if (--inflight_.front().statements == 0) return answer_front(nullptr);
  after_results();
}

void SqlConnection::after_results() {
  if (phase_ == Phase::kNone) return;  // a callback dropped the connection
  if (mysql_more_results(mysql_)) {
    phase_ = Phase::kNext;
    int ret = 0;
    int status = mysql_next_result_start(&ret, mysql_);
    return result_step(status, ret > 0);
  }
  // The round trip is over. Statements left in flight were not run.
  request_timer_.stop();
  std::deque<Request>& source = state_ == State::kSetUp ? set_up_ : queue_;
  source.insert(source.begin(), std::make_move_iterator(inflight_.begin()), std::make_move_iterator(inflight_.end()));
  inflight_.clear();
  phase_ = Phase::kNone;
  send_queued();
}

void SqlConnection::statement_failed() {
  const unsigned code = mysql_errno(mysql_);
  if (client_error(code) || inflight_.empty()) return connection_failed(code, mysql_error(mysql_));
  // The server refused this statement; the connection is fine and the
  // statements after it in the round trip were not run (a transaction
  // the request began is rolled back first).
  roll_back_ = state_ == State::kReady;
  StoreError err = sql_error(name_, code, mysql_error(mysql_));
  if (code == ER_PARSE_ERROR && inflight_.front().sql.starts_with(sql::kCompound))
    // A server without MariaDB's compound statements (MySQL): say what is
    // missing rather than only where the syntax broke.
    err.message = "shared, permit and fair locks need MariaDB's compound statements (BEGIN NOT ATOMIC), which "
                  "this server does not take: " + err.message;
  answer_front(&err);
}

// The request at the front of inflight_ answered (its last statement, or
// one that failed): its caller hears, then the round trip goes on (unless
// the callback dropped the connection).
void SqlConnection::answer_front(const StoreError* err) {
  Request r = std::move(inflight_.front());
  inflight_.pop_front();
  r.done(err ? SqlResult{} : std::move(r.answer), err);
  after_results();
}

// The connection is lost: `code` is the client library's error number,
// 0 for a failure of our own. While connecting, a refused login is kAuth.
void SqlConnection::connection_failed(unsigned code, std::string why) {
  if (state_ != State::kConnecting && state_ != State::kSetUp) return fail_unavailable(why);
  StoreError error = StoreError::unavailable(name_, why, code != 0 ? mariadb_code(code) : std::error_code());
  if (code != 0 && sql_error(name_, code, why).kind == StoreError::Kind::kAuth) error.kind = StoreError::Kind::kAuth;
  fail(why, error);
}

unsigned long SqlConnection::session() const {
  return mysql_ != nullptr && state_ == State::kReady ? mysql_thread_id(mysql_) : 0;
}

void SqlConnection::release(bool) {
  uv_timer_stop(&io_timer_);
  // Shut the socket first: mysql_close() then cannot wait on a server
  // that stopped answering.
  if (const int fd = socket(); fd >= 0) ::shutdown(fd, SHUT_RDWR);
  if (mysql_ != nullptr) mysql_close(mysql_);
  mysql_ = nullptr;
  set_up_.clear();
  roll_back_ = false;
  phase_ = Phase::kNone;
}

void SqlConnection::close() {
  ConnectionCore::close();
  if (std::exchange(timer_open_, false)) uv_close(reinterpret_cast<uv_handle_t*>(&io_timer_), nullptr);
}

}  // namespace lockwatch::detail
