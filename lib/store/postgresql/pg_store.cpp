#include "store/postgresql/pg_store.hpp"

#include <fmt/format.h>

#include <optional>

#include "store/kind_rules.hpp"
#include "store/postgresql/pg_error.hpp"
#include "store/postgresql/pg_statements.hpp"
#include "store/sqlcommon/claims.hpp"
#include "store/sqlcommon/values.hpp"

namespace lockwatch::detail {

namespace {

// Names and tokens travel as hex text and are decoded by the server
// (sqlcommon/values.hpp).
using sqlcommon::array_literal;
using sqlcommon::micros;
using sqlcommon::to_hex;
using sqlcommon::to_ll;
using sqlcommon::unhex;

// A batch's arrays: the names and tokens of the `n` locks lock(0)..,
// then their ttls in µs (when the locks have one) and (with `markers`)
// their kinds' markers.
template <class Lock>
std::vector<std::string> lock_arrays(std::size_t n, Lock lock, bool markers = false) {
  std::vector<std::string> out{array_literal(n, [&](std::size_t i) -> std::string_view { return lock(i).name; }),
                               array_literal(n, [&](std::size_t i) -> std::string_view { return lock(i).token; })};
  if constexpr (requires { lock(0).ttl; })
    out.push_back(array_literal(n, [&](std::size_t i) { return micros(lock(i).ttl); }));
  if (markers) out.push_back(array_literal(n, [&](std::size_t i) { return kinds::marker(lock(i).kind); }));
  return out;
}

// Each of `n` locks' status: `yes`, but those an answer names (its
// 1-based position, whether another owner holds it): `taken` or `gone`.
template <class Status>
std::vector<Status> not_done(const PgRows& rows, std::size_t n, Status yes, Status taken, Status gone) {
  std::vector<Status> status(n, yes);
  for (int r = 0; r < rows.size(); ++r) {
    long long k = to_ll(rows.at(r, 0)) - 1;
    if (k < 0 || k >= static_cast<long long>(n)) continue;
    status[k] = rows.at(r, 1) == "t" ? taken : gone;
  }
  return status;
}

using sqlcommon::ms_up;

std::string quoted(const std::string& table) { return "\"" + table + "\""; }

}  // namespace

std::string PgStore::table_definition(const std::string& table) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS {} (\n"
      "  lock_name   bytea PRIMARY KEY CHECK (octet_length(lock_name) BETWEEN 1 AND {}),\n"
      "  owner       bytea NOT NULL DEFAULT '',\n"
      "  fence       bigint NOT NULL DEFAULT 0,\n"
      "  expires_at  timestamptz NOT NULL,\n"
      "  last_period bigint,\n"
      "  owner_name  bytea NOT NULL DEFAULT '',\n"
      "  granted_at  timestamptz\n"
      ") WITH (fillfactor = 70)",
      quoted(table), kMaxNameBytes);
}

std::string PgStore::holders_table_definition(const std::string& table) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS {} (\n"
      "  lock_name  bytea NOT NULL,\n"
      "  owner      bytea NOT NULL,\n"
      "  role       char(1) NOT NULL CHECK (role IN ('s', 'p', 'f', 'q', 'w')),\n"
      "  seq        bigint NOT NULL DEFAULT 0,\n"
      "  expires_at timestamptz NOT NULL,\n"
      "  owner_name bytea NOT NULL DEFAULT '',\n"
      "  granted_at timestamptz,\n"
      "  PRIMARY KEY (lock_name, owner)\n"
      ")",
      quoted(table));
}

PgStore::PgStore(Loop& loop, PgTarget target, const sqlcommon::SqlSettings& settings)
    : RecipeStore(loop, settings, kDialect,
                  "the lock name (key_prefix + key) is longer than the 255 bytes the PostgreSQL lock table's "
                  "lock_name takes",
                  target.channel()),
      target_(std::move(target)) {
  offer({.fence_raising = this, .job_claims = this, .operator_tools = this, .lock_listing = this, .fair_queue = this});
  PgSession session;
  session.statements = pg_statements(quoted(target_.table), quoted(target_.holders_table()),
                                  "decode('" + to_hex(settings_.owner_name) + "', 'hex')");
  session.create = {table_definition(target_.table), holders_table_definition(target_.holders_table())};
  // Tables made by versions before get the columns added since.
  for (const std::string& table : {target_.table, target_.holders_table()})
    session.create.push_back(fmt::format("ALTER TABLE {} ADD COLUMN IF NOT EXISTS owner_name bytea NOT NULL DEFAULT "
                                         "'', ADD COLUMN IF NOT EXISTS granted_at timestamptz",
                                         quoted(table)));
  // Planned, not run: ON CONFLICT (lock_name) needs lock_name to be the
  // table's key, which only the planner checks.
  session.plan_check = "EXPLAIN EXECUTE lockwatch_acquire('{}', '{}', '{}')";
  session.table = fmt::format("{}.{}", target_.database, target_.table);
  session.stale = std::make_shared<PgStaleBackends>();
  connections_.make(loop, target_, settings_, session);
}

PgStore::~PgStore() = default;

// ---- acquire

void PgStore::acquire_batch(AcquireBatchPtr batch) {
  const auto& l = batch->locks;
  auto params = lock_arrays(l.size(), [&](std::size_t i) -> const sqlcommon::PendingAcquire& { return l[i]; });
  command_connection().execute("lockwatch_acquire", std::move(params), [this, batch](const PgRows& rows,
                                                                                     const StoreError* err) {
    if (err) return acquire_failed(batch, *err);
    std::vector<bool> answered(batch->locks.size(), false);
    for (int r = 0; r < rows.size(); ++r) {
      long long i = to_ll(rows.at(r, 0)) - 1;
      if (i < 0 || i >= static_cast<long long>(batch->locks.size()) || answered[i]) continue;
      answered[i] = true;
      Acquired out;
      if (!rows.null(r, 1)) {
        out.status = Acquired::Status::kTaken;
        out.fence = static_cast<std::uint64_t>(to_ll(rows.at(r, 1)));
      } else {
        // Busy. No row in the snapshot (taken meanwhile by a statement
        // that started later): busy for a moment, then asked again.
        out.status = Acquired::Status::kBusy;
        out.busy_for = rows.null(r, 2) ? std::chrono::milliseconds(1) : ms_up(to_ll(rows.at(r, 2)));
        // A kind's marker: readers' (the statement renewed our writer's
        // mark), or another kind's.
        std::string owner;
        const auto& lock = batch->locks[i];
        if (!rows.null(r, 3) && unhex(rows.at(r, 3), owner))
          sqlcommon::exclusive_busy(out, lock, owner, target_.name());
      }
      batch->locks[i].answer(out);
    }
    for (std::size_t i = 0; i < answered.size(); ++i) {
      if (answered[i]) continue;
      Acquired out;
      out.error = pg_statement_error(target_.name(), "", "the acquisition's answer left a lock out");
      batch->locks[i].answer(out);
    }
  });
}

// ---- renew

void PgStore::renew_group(sqlcommon::RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds,
                          bool kinds) {
  auto params = lock_arrays(
      members.size(), [&](std::size_t k) -> const LockRef& { return batch->locks[members[k]]; }, kinds);
  auto answered = [batch, members](const PgRows& rows, const StoreError* err) {
    if (err) return batch->answer(members, Renewed::kTransient, err);
    // The answer names those not renewed.
    auto status = not_done(rows, members.size(), Renewed::kYes, Renewed::kTakenByOther, Renewed::kGone);
    for (std::size_t k = 0; k < members.size(); ++k) batch->done(members[k], status[k], nullptr);
  };
  connections_.renew->execute(kinds ? "lockwatch_renew_kind" : "lockwatch_renew", std::move(params),
                              std::move(answered));
}

// ---- release

void PgStore::release_batch(std::shared_ptr<ReleaseBatch> batch) {
  const auto& l = batch->locks;
  const bool of_kinds = !l.empty() && !l.front().kind.exclusive_kind();
  auto params = lock_arrays(l.size(), [&](std::size_t i) -> const PendingRelease& { return l[i]; }, of_kinds);
  params.push_back(batch->notify ? "t" : "f");
  params.push_back(channel_);
  auto answered = [this, batch](const PgRows& rows, const StoreError* err) {
    if (err) {
      if (!sqlcommon::retry_later(batch, *err, [this](std::shared_ptr<ReleaseBatch> b) { release_batch(std::move(b)); }))
        batch->answer(Released::kUnconfirmed, err);
      return;
    }
    // The answer names those not released.
    auto status = not_done(rows, batch->locks.size(), Released::kYes, Released::kTakenByOther, Released::kGone);
    for (std::size_t k = 0; k < status.size(); ++k) batch->locks[k].answer(status[k], nullptr);
  };
  command_connection().execute(of_kinds ? "lockwatch_release_kind" : "lockwatch_release", std::move(params),
                               std::move(answered));
}

// ---- the rest

void PgStore::raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) {
  command_connection().execute("lockwatch_raise_fence", {to_hex(name), std::to_string(fence)},
                               [done = std::move(done)](const PgRows&, const StoreError* err) { done(!err); });
}

// ---- release notices

void PgStore::subscribe(std::string_view name) {
  if (closed_) return;
  auto it = subscribed_.emplace(name).first;
  if (!notices_) return start_notices();
  if (!listening_) return;  // confirmed for every name once LISTEN is
  // Already listening: confirmed on the next turn (never inside the call).
  loop_.post([this, name = *it] {
    if (!closed_ && listening_ && subscribed_.count(name) != 0 && events_.subscribed) events_.subscribed(name);
  });
}

void PgStore::unsubscribe(std::string_view name) {
  // The channel stays: other names share it.
  if (auto it = subscribed_.find(name); it != subscribed_.end()) subscribed_.erase(it);
}

void PgStore::start_notices() {
  PgSession session;
  session.listen = channel_;
  session.table = fmt::format("{}.{}", target_.database, target_.table);
  notices_ = std::make_unique<PgConnection>(loop_, target_, settings_, std::move(session));
  notices_->set_ready_hook([this] {
    listening_ = true;
    if (!events_.subscribed) return;
    std::vector<std::string> names(subscribed_.begin(), subscribed_.end());
    for (const auto& n : names)
      if (!closed_ && subscribed_.count(n) != 0) events_.subscribed(n);
  });
  notices_->set_state_hook([this](bool up, const std::string&) {
    if (up || !listening_) return;
    listening_ = false;
    if (events_.subscriptions_lost) events_.subscriptions_lost();
  });
  notices_->set_notify_hook([this](std::string_view payload) {
    std::string name;
    if (!unhex(payload, name)) return;
    if (subscribed_.count(name) != 0 && events_.released) events_.released(name);
  });
  notices_->start();
}

void PgStore::poll_replies() { connections_.renew->poll_now(); }

void PgStore::close() {
  closed_ = true;
  RecipeStore::close();
  if (notices_) notices_->close();
}

}  // namespace lockwatch::detail
