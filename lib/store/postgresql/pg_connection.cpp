#include "store/postgresql/pg_connection.hpp"

#include <libpq-fe.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "core/option_checks.hpp"
#include "store/postgresql/pg_error.hpp"

namespace lockwatch::detail {

namespace {

using Clock = std::chrono::steady_clock;

// The server's notices (CREATE TABLE IF NOT EXISTS on an existing table
// says so) would go to stderr by default.
void ignore_notice(void*, const PGresult*) {}

// libpq's message as one line: without the LOCATION line the verbose form
// adds (the server's source file), its line breaks and tabs one space.
std::string one_line(const char* message) {
  std::string s = message != nullptr ? message : "";
  if (auto loc = s.find("\nLOCATION:"); loc != std::string::npos) s.resize(loc);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\n' || c == '\t') c = ' ';
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out.push_back(c);
  }
  return out;
}

// Session settings, sent in the startup packet: no round trip, and in
// force before the first statement. The server cancels a statement at
// three quarters of the command timeout and a wait for a row lock at half
// of it: answered "retry later" (nothing was done) before the client gives
// up on the connection (then nothing is known).
std::string startup_options(const sqlcommon::SqlSettings& o) {
  const long long command_ms = o.command_timeout.count();
  long long statement_ms = std::max<long long>(1, command_ms * 3 / 4);
  long long lock_ms = std::max<long long>(1, command_ms / 2);
  return fmt::format("-c TimeZone=UTC -c statement_timeout={} -c lock_timeout={} -c bytea_output=hex", statement_ms,
                     lock_ms);
}

}  // namespace

void PgRequest::ResultFree::operator()(pg_result* r) const noexcept { PQclear(r); }

int PgRows::size() const noexcept { return result_ == nullptr ? 0 : PQntuples(result_); }

std::string_view PgRows::at(int row, int column) const noexcept {
  if (result_ == nullptr || row >= PQntuples(result_) || column >= PQnfields(result_)) return {};
  return {PQgetvalue(result_, row, column), static_cast<std::size_t>(PQgetlength(result_, row, column))};
}

bool PgRows::null(int row, int column) const noexcept {
  if (result_ == nullptr || row >= PQntuples(result_) || column >= PQnfields(result_)) return true;
  return PQgetisnull(result_, row, column) != 0;
}

PgConnection::PgConnection(Loop& loop, PgTarget target, const sqlcommon::SqlSettings& settings, PgSession session)
    : ConnectionCore(loop, settings, target.name(), target.host, target.socket_dir.empty() ? nullptr : "",
                     session.stale),
      target_(std::move(target)),
      session_(std::move(session)) {}

PgConnection::~PgConnection() {
  // close() ran on the loop thread and the loop drained: nothing is left
  // but, if the loop never ran, the connection itself.
  if (conn_ != nullptr) PQfinish(conn_);
}

void PgConnection::execute(const std::string& statement, std::vector<std::string> params, PgDone done) {
  std::vector<PgCall> calls;
  for (const auto& s : session_.statements)
    if (s.name == statement && !s.first.empty() && !params.empty()) calls.push_back({s.first, {params.front()}});
  calls.push_back({statement, std::move(params)});
  execute_all(std::move(calls), {}, std::move(done));
}

void PgConnection::execute_all(std::vector<PgCall> calls, std::function<void(std::size_t, const PgRows&)> each,
                               PgDone done) {
  enqueue(Request{.calls = std::move(calls), .done = std::move(done), .each = std::move(each)});
}

// ---- connecting

// The attempt connects to the address ConnectionCore found, IPv4 first;
// libpq keeps the host's name for TLS's host name check.
void PgConnection::connect_to(const std::string& hostaddr) {
  std::vector<const char*> keys, values;
  std::deque<std::string> held;  // the values' storage, until PQconnectStartParams copied them
  auto add = [&](const char* key, std::string_view value) {
    if (value.empty()) return;
    keys.push_back(key);
    values.push_back(held.emplace_back(value).c_str());
  };
  add("host", target_.socket_dir.empty() ? target_.host : target_.socket_dir);
  add("hostaddr", hostaddr);
  add("port", std::to_string(target_.port));
  add("dbname", target_.database);
  add("user", target_.user);
  add("password", target_.password);
  add("options", startup_options(settings_));
  // The owner name, for pg_stat_activity (the server keeps 63 bytes of it).
  add("application_name", "lockwatch:" + connection_owner_name(settings_.owner_name));
  // GSSAPI encryption is not asked for: libpq would otherwise look for
  // Kerberos credentials first.
  add("gssencmode", "disable");
  add("sslmode", target_.sslmode);
  add("sslrootcert", target_.sslrootcert);
  add("sslcert", target_.sslcert);
  add("sslkey", target_.sslkey);
  add("sslcrl", target_.sslcrl);
  keys.push_back(nullptr);
  values.push_back(nullptr);
  conn_ = PQconnectStartParams(keys.data(), values.data(), 0);
  if (conn_ == nullptr) return went_down(unavailable("out of memory for a connection"));
  // Non-blocking from the start: nothing libpq does later (a flush, its
  // goodbye in PQfinish) may wait on the socket.
  PQsetnonblocking(conn_, 1);
  PQsetNoticeReceiver(conn_, ignore_notice, nullptr);
  // A failed login's SQLSTATE is only in the message, in this form.
  PQsetErrorVerbosity(conn_, PQERRORS_VERBOSE);
  if (PQstatus(conn_) == CONNECTION_BAD) return connect_step(PGRES_POLLING_FAILED);
  connect_step(PGRES_POLLING_WRITING);
}

void PgConnection::connect_step(int polling_status) {
  if (polling_status == PGRES_POLLING_OK) return connected();
  if (polling_status == PGRES_POLLING_READING || polling_status == PGRES_POLLING_WRITING) {
    watch(polling_status == PGRES_POLLING_READING ? UV_READABLE : UV_WRITABLE, true);
    return;
  }
  const char* raw = PQerrorMessage(conn_);
  std::string code(sqlstate_in_verbose_message(raw != nullptr ? raw : ""));  // in libpq's own layout
  went_down(pg_connect_error(name_, code, one_line(raw)));
}

// While connecting, libpq may close its socket and open another (TLS
// refused, then plain text): each step watches with a fresh handle, since
// a new socket can reuse the old number.
int PgConnection::socket() const { return conn_ == nullptr ? -1 : PQsocket(conn_); }

void PgConnection::on_socket(int status, int events) {
  if (state_ == State::kConnecting) return connect_step(PQconnectPoll(conn_));
  if (!linked()) return;
  if (status == 0 && (events & UV_WRITABLE)) {
    flush();
    if (!linked()) return;
  }
  if (status < 0 || (events & (UV_READABLE | UV_DISCONNECT))) on_readable();
}

void PgConnection::connected() {
  // The socket is up and the login done; the set-up comes first. The
  // connect deadline keeps running until it is over.
  state_ = State::kSetUp;
  PQsetErrorVerbosity(conn_, PQERRORS_DEFAULT);
  if (PQenterPipelineMode(conn_) != 1)
    return fail_unavailable(fmt::format("cannot enter pipeline mode: {}", one_line(PQerrorMessage(conn_))));
  if (watch(UV_READABLE, true)) end_stale_backends();
}

void PgConnection::end_stale_backends() {
  if (!stale_ || stale_->ids.empty()) return handshake(false);
  std::vector<int> pids = stale_->ids;
  // Only lockwatch's own sessions of this role, never this one (a pid can
  // have been reused meanwhile). PostgreSQL 14 and later wait for the
  // process to exit, within half the connect timeout.
  const long long wait_ms = std::max<long long>(1, settings_.connect_timeout.count() / 2);
  const std::string terminate =
      PQserverVersion(conn_) >= 140000 ? fmt::format("pg_terminate_backend(a.pid, {})", wait_ms) : "pg_terminate_backend(a.pid)";
  std::string sql = fmt::format("SELECT {} FROM pg_stat_activity a WHERE a.pid = ANY('{{{}}}'::int[]) AND a.usename = current_user "
                                "AND (a.application_name = 'lockwatch' OR a.application_name LIKE 'lockwatch:%') AND a.pid <> pg_backend_pid()",
                                terminate, PgStaleBackends::list(pids));
  send_setup(nullptr, std::move(sql), [this, pids](const PgRows&, const StoreError*) {
    // Ended, gone already, or not ours to end (refused): either way not
    // tried again.
    stale_->forget(pids);
    handshake(false);
  });
}

// A step of the set-up: the prepare of `*prepare`, or (none) `sql`.
void PgConnection::send_setup(const PgStatement* prepare, std::string sql, PgDone done) {
  inflight_.push_back(Request{.prepare = prepare, .sql = std::move(sql), .done = in_set_up(std::move(done))});
  if (!send(inflight_.back())) return fail_unavailable(one_line(PQerrorMessage(conn_)));
  flush();
}

void PgConnection::handshake(bool created) {
  if (!session_.listen.empty())
    return send_setup(nullptr, fmt::format("LISTEN \"{}\"", session_.listen),
                      [this](const PgRows&, const StoreError* err) { err ? went_down(*err) : set_up_done(); });
  // The first statement's prepare is the table check: a missing table is
  // created once, then prepared again; any other refusal says what the
  // table lacks.
  send_setup(&session_.statements.front(), {}, [this, created](const PgRows&, const StoreError* err) {
    if (!err) return prepare_rest();
    // undefined_table, or undefined_column: a table of a version before
    // (create adds the columns since).
    if ((err->code == pg_code("42P01") || err->code == pg_code("42703")) && !created) return create_tables(0);
    table_error(*err);
  });
}

// The lock table and its companion (CREATE TABLE IF NOT EXISTS each),
// one after the other, then the prepares again.
void PgConnection::create_tables(std::size_t next) {
  if (next == session_.create.size()) return handshake(true);
  send_setup(nullptr, session_.create[next], [this, next](const PgRows&, const StoreError* e) {
    // Another connection may have created it meanwhile (42P07; 42710
    // or 23505 when both got as far as the catalog): the next prepare
    // tells.
    if (e && e->code != pg_code("42P07") && e->code != pg_code("42710") && e->code != pg_code("23505")) {
      StoreError why = *e;
      why.message =
          fmt::format("cannot create the lock table {} or its holders' table: {}", session_.table, e->message);
      return went_down(why);
    }
    create_tables(next + 1);
  });
}

void PgConnection::prepare_rest() {
  auto left = std::make_shared<std::size_t>(session_.statements.size() - 1);
  if (*left == 0) return check_plan();
  for (std::size_t i = 1; i < session_.statements.size(); ++i) {
    send_setup(&session_.statements[i], {}, [this, left](const PgRows&, const StoreError* err) {
      if (err) return table_error(*err);
      if (--*left == 0) check_plan();
    });
    if (state_ != State::kSetUp) return;
  }
}

void PgConnection::check_plan() {
  if (session_.plan_check.empty()) return set_up_done();
  send_setup(nullptr, session_.plan_check,
             [this](const PgRows&, const StoreError* err) { err ? table_error(*err) : set_up_done(); });
}

void PgConnection::table_error(const StoreError& error) {
  if (error.kind == StoreError::Kind::kUnavailable || error.kind == StoreError::Kind::kRetryLater)
    return went_down(error);
  StoreError why = error;
  if (error.code == pg_code("42501"))  // insufficient_privilege
    why.message = fmt::format("the lock table {} cannot be used by this user (it needs SELECT, INSERT and UPDATE "
                              "on it): {}",
                              session_.table, error.message);
  else
    why.message = fmt::format(
        "the lock table {} cannot be used: it needs lockwatch's columns (lock_name, owner, fence, expires_at, "
        "last_period, of the types in lockwatch's docs/stores.md) and lock_name as its key: {}",
        session_.table, error.message);
  went_down(why);
}

// ---- requests

bool PgConnection::send(Request& r) {
  int ok = 1;
  if (r.prepare != nullptr)
    ok = PQsendPrepare(conn_, r.prepare->name.c_str(), r.prepare->sql.c_str(),
                       static_cast<int>(r.prepare->param_types.size()), r.prepare->param_types.data());
  else if (r.calls.empty())
    ok = PQsendQueryParams(conn_, r.sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0);
  for (std::size_t i = 0; ok == 1 && i < r.calls.size(); ++i) {
    std::vector<const char*> values;
    values.reserve(r.calls[i].params.size());
    for (const auto& p : r.calls[i].params) values.push_back(p.c_str());
    ok = PQsendQueryPrepared(conn_, r.calls[i].statement.c_str(), static_cast<int>(values.size()), values.data(),
                             nullptr, nullptr, 0);
  }
  // Each request its own sync: its own implicit transaction (one
  // statement, or execute_all()'s), and a failure aborts nothing after it.
  if (ok == 1) ok = PQpipelineSync(conn_);
  r.sent = Clock::now();
  return ok == 1;
}

void PgConnection::send_queued() {
  if (state_ != State::kReady) return;
  const bool was_idle = inflight_.empty();
  while (!queue_.empty()) {
    inflight_.push_back(std::move(queue_.front()));
    queue_.pop_front();
    if (!send(inflight_.back())) return fail_unavailable(one_line(PQerrorMessage(conn_)));
  }
  if (was_idle) watch_requests();
  flush();
}

void PgConnection::flush() {
  int rc = PQflush(conn_);
  if (rc < 0) return fail_unavailable(one_line(PQerrorMessage(conn_)));
  watch(UV_READABLE | (rc == 1 ? UV_WRITABLE : 0), false);  // 1: libpq has output it could not send yet
}

void PgConnection::on_readable() {
  if (PQconsumeInput(conn_) == 0) {
    std::string why = one_line(PQerrorMessage(conn_));
    return fail_unavailable(why.empty() ? "the server closed the connection" : why);
  }
  drain();
  if (!linked()) return;
  while (PGnotify* n = PQnotifies(conn_)) {
    std::string payload = n->extra != nullptr ? n->extra : "";
    PQfreemem(n);
    if (notify_hook_) notify_hook_(payload);
    if (!linked()) return;
  }
  if (PQstatus(conn_) == CONNECTION_BAD) fail_unavailable("the server closed the connection");
}

void PgConnection::poll_now() {
  if (state_ == State::kReady && !inflight_.empty()) on_readable();
}

// Answers arrive in order, each statement's as its result and a null,
// then the sync's own result: the request at the front is complete at its
// sync. A transaction's statements answer in order (those skipped after
// a failure with PGRES_PIPELINE_ABORTED).
void PgConnection::drain() {
  while (!inflight_.empty() && linked() && PQisBusy(conn_) == 0) {
    PGresult* r = PQgetResult(conn_);
    Request& front = inflight_.front();
    if (r == nullptr) {
      // The end of the front's results; else nothing to read yet, or (a
      // connection gone bad) nothing more will come: on_readable() sees
      // the status.
      if (front.stage != Stage::kEnd) break;
      front.stage = ++front.ended < front.statements() ? Stage::kResult : Stage::kSync;
      continue;
    }
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      PQclear(r);
      complete_front();
      continue;
    }
    if (front.results.size() == front.ended)
      front.results.emplace_back(r);  // the statement's one result
    else
      PQclear(r);
    front.stage = Stage::kEnd;
  }
}

// The request answers the first error of its statements, else the last
// one's rows (and, to `each`, every one's).
void PgConnection::complete_front() {
  Request r = std::move(inflight_.front());
  inflight_.pop_front();
  watch_requests();
  std::optional<StoreError> error;
  const auto failed = std::find_if(r.results.begin(), r.results.end(), [](const auto& res) {
    const ExecStatusType st = PQresultStatus(res.get());
    return st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK;
  });
  if (failed != r.results.end()) {
    const char* code = PQresultErrorField(failed->get(), PG_DIAG_SQLSTATE);
    const char* primary = PQresultErrorField(failed->get(), PG_DIAG_MESSAGE_PRIMARY);
    error = pg_statement_error(name_, code != nullptr ? code : "",
                               primary != nullptr ? primary : one_line(PQresultErrorMessage(failed->get())));
  } else if (r.results.size() != r.statements()) {
    error = pg_statement_error(name_, "", "the server sent no result for a statement");
  } else if (r.each) {
    for (std::size_t i = 0; i < r.results.size(); ++i) r.each(i, PgRows(r.results[i].get()));
  }
  r.done(PgRows(error ? nullptr : r.results.back().get()), error ? &*error : nullptr);
}

int PgConnection::session() const { return conn_ != nullptr ? PQbackendPID(conn_) : 0; }

void PgConnection::release(bool graceful) {
  if (conn_ != nullptr) {
    if (!graceful) {
      int fd = PQsocket(conn_);
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
    PQfinish(conn_);
    conn_ = nullptr;
  }
}

}  // namespace lockwatch::detail
