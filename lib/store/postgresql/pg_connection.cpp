#include "store/postgresql/pg_connection.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <optional>

#include "core/option_checks.hpp"
#include "store/postgresql/pg_error.hpp"

namespace lockwatch::detail {

namespace {

using Clock = std::chrono::steady_clock;

// libpq's message as one line: without the LOCATION line the verbose form
// adds (the server's source file), its line breaks and tabs one space.
std::string one_line(const char* message) {
  std::string s = message != nullptr ? message : "";
  if (auto loc = s.find("\nLOCATION:"); loc != std::string::npos) s.resize(loc);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\n' || c == '\t'; }, ' ');
  s.erase(std::unique(s.begin(), s.end(), [](char a, char b) { return a == ' ' && b == ' '; }), s.end());
  return s;
}

// Session settings, sent in the startup packet: no round trip, and in
// force before the first statement. The server cancels a statement at
// three quarters of the command timeout and a wait for a row lock at half
// of it: answered "retry later" (nothing was done) before the client gives
// up on the connection (then nothing is known).
std::string startup_options(const sqlcommon::SqlSettings& o) {
  const long long command_ms = o.command_timeout.count();
  return fmt::format("-c TimeZone=UTC -c statement_timeout={} -c lock_timeout={} -c bytea_output=hex",
                     std::max<long long>(1, command_ms * 3 / 4), std::max<long long>(1, command_ms / 2));
}

// A result's rows: views into libpq's, which the request keeps.
PgRows rows_of(const PGresult* result) {
  PgRows out{.cells = {}, .columns = result != nullptr ? static_cast<std::size_t>(PQnfields(result)) : 0, .hex = true};
  out.cells.reserve(result != nullptr ? out.columns * static_cast<std::size_t>(PQntuples(result)) : 0);
  for (int r = 0; result != nullptr && r < PQntuples(result); ++r)
    for (int c = 0; c < PQnfields(result); ++c)
      out.cells.push_back(PQgetisnull(result, r, c) != 0 ? std::nullopt
                                                          : std::optional<std::string_view>(std::in_place,
                                                                PQgetvalue(result, r, c), PQgetlength(result, r, c)));
  return out;
}

}  // namespace

void PgRequest::ResultFree::operator()(pg_result* r) const noexcept { PQclear(r); }

PgConnection::PgConnection(Loop& loop, PgTarget target, const sqlcommon::SqlSettings& settings, PgSession session)
    : ConnectionCore(loop, settings, target.name(), target.host, target.socket_dir.empty() ? nullptr : "",
                     std::move(session)),
      target_(std::move(target)) {}

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
  if (conn_ == nullptr) return set_up_failed(unavailable("out of memory for a connection"));
  // Non-blocking from the start: nothing libpq does later (a flush, its
  // goodbye in PQfinish) may wait on the socket.
  PQsetnonblocking(conn_, 1);
  // The server's notices (CREATE TABLE IF NOT EXISTS on an existing table
  // says so) would go to stderr by default.
  PQsetNoticeReceiver(conn_, [](void*, const PGresult*) {}, nullptr);
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
  set_up_failed(pg_connect_error(name_, code, one_line(raw)));
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
  if (watch(UV_READABLE, true)) start_set_up();
}

// Only lockwatch's own sessions of this role, never this one (a pid can
// have been reused meanwhile): ended, gone already, or not ours to end
// (refused), they are not tried again. PostgreSQL 14 and later wait for
// the process to exit, within half the connect timeout.
std::vector<std::string> PgConnection::end_sessions(const std::vector<int>& pids, int round) const {
  if (round > 0) return {};
  const long long wait_ms = std::max<long long>(1, settings_.connect_timeout.count() / 2);
  const std::string terminate =
      PQserverVersion(conn_) >= 140000 ? fmt::format("pg_terminate_backend(a.pid, {})", wait_ms) : "pg_terminate_backend(a.pid)";
  return {fmt::format("SELECT {} FROM pg_stat_activity a WHERE a.pid = ANY('{{{}}}'::int[]) AND a.usename = current_user "
                      "AND (a.application_name = 'lockwatch' OR a.application_name LIKE 'lockwatch:%') AND a.pid <> pg_backend_pid()",
                      terminate, fmt::join(pids, ","))};
}

// A step of the set-up: the prepare of `*prepare`, or (none) `sql`.
void PgConnection::set_up_step(std::string sql, const PgStatement* prepare, PgDone done) {
  inflight_.push_back(Request{.prepare = prepare, .sql = std::move(sql), .done = std::move(done)});
  if (!send(inflight_.back())) return fail_unavailable(one_line(PQerrorMessage(conn_)));
  flush();
}

// The tables' check (the first statement's prepare), another prepare or
// the plan check refused: what the table lacks.
StoreError PgConnection::table_error(const StoreError& error) const {
  if (error.kind == StoreError::Kind::kUnavailable || error.kind == StoreError::Kind::kRetryLater) return error;
  if (error.code == pg_code("42501"))  // insufficient_privilege
    return about_table(error, "the lock table {} cannot be used by this user (it needs SELECT, INSERT and UPDATE "
                              "on it): {}");
  return about_table(error, "the lock table {} cannot be used: it needs lockwatch's columns (lock_name, owner, fence, "
                            "expires_at, last_period, of the types in lockwatch's docs/stores.md) and lock_name as its "
                            "key: {}");
}

// ---- requests

bool PgConnection::send(Request& r) {
  int ok = 1;
  if (r.prepare != nullptr) {
    // The parameters' types as pg_type OIDs: text, int8, bool, text[], int8[].
    std::vector<Oid> types;
    for (char t : r.prepare->types) types.push_back(t == 'x' ? 25 : t == 'n' ? 20 : t == 'b' ? 16 : t == 'X' ? 1009 : 1016);
    ok = PQsendPrepare(conn_, r.prepare->name.c_str(), r.prepare->steps.front().c_str(), static_cast<int>(types.size()),
                       types.data());
  } else if (r.calls.empty())
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
  if (was_idle) request_timer_.watch();
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
      // The end of a statement's results; else nothing to read yet, or (a
      // connection gone bad) nothing more will come: on_readable() sees
      // the status.
      if (!front.ending) break;
      front.ending = false;
      continue;
    }
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      PQclear(r);
      complete_front();
      continue;
    }
    if (front.ending)
      PQclear(r);
    else
      front.results.emplace_back(r);  // the statement's one result
    front.ending = true;
  }
}

// The request answers the first error of its statements, else the last
// one's rows (and, to `each`, every one's).
void PgConnection::complete_front() {
  Request r = std::move(inflight_.front());
  inflight_.pop_front();
  request_timer_.watch();
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
    for (std::size_t i = 0; i < r.results.size(); ++i) r.each(i, rows_of(r.results[i].get()));
  }
  r.done(rows_of(error ? nullptr : r.results.back().get()), error ? &*error : nullptr);
}

int PgConnection::session() const { return conn_ != nullptr ? PQbackendPID(conn_) : 0; }

// Given up on, the socket is shut already (ConnectionCore's teardown, on
// the watched duplicate): PQfinish's goodbye cannot wait.
void PgConnection::release(bool) {
  if (conn_ != nullptr) PQfinish(conn_);
  conn_ = nullptr;
}

}  // namespace lockwatch::detail
