#include "store/postgresql/pg_store.hpp"

#include <fmt/format.h>

#include "store/postgresql/pg_error.hpp"
#include "store/postgresql/pg_kind.hpp"
#include "store/postgresql/pg_statements.hpp"
#include "store/sqlcommon/values.hpp"

namespace lockwatch::detail {

constinit const StoreKind kPostgresStore =
    sqlcommon::sql_store_kind<PgStore, PgTarget>(kPostgresSchemes, kPostgresUsage);

namespace {

// Names travel as hex text, decoded by the server (sqlcommon/values.hpp).
using sqlcommon::to_hex;
using sqlcommon::unhex;

std::string quoted(const std::string& table) { return "\"" + table + "\""; }

// The tables as created when they are missing (also in docs/stores.md).
// `holders` is the lock table's companion.
std::vector<std::string> table_definitions(const std::string& table, const std::string& holders) {
  return {fmt::format(
      "CREATE TABLE IF NOT EXISTS {} (\n"
      "  lock_name   bytea PRIMARY KEY CHECK (octet_length(lock_name) BETWEEN 1 AND {}),\n"
      "  owner       bytea NOT NULL DEFAULT '',\n"
      "  fence       bigint NOT NULL DEFAULT 0,\n"
      "  expires_at  timestamptz NOT NULL,\n"
      "  last_period bigint,\n"
      "  owner_name  bytea NOT NULL DEFAULT '',\n"
      "  granted_at  timestamptz\n"
      ") WITH (fillfactor = 70)",
      quoted(table), PgStore::kMaxNameBytes), fmt::format(
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
      quoted(holders))};
}

}  // namespace

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
  session.create = table_definitions(target_.table, target_.holders_table());
  // Tables made by versions before get the columns added since.
  for (const std::string& table : {target_.table, target_.holders_table()})
    session.create.push_back(fmt::format("ALTER TABLE {} ADD COLUMN IF NOT EXISTS owner_name bytea NOT NULL DEFAULT "
                                         "'', ADD COLUMN IF NOT EXISTS granted_at timestamptz",
                                         quoted(table)));
  // Planned, not run: ON CONFLICT (lock_name) needs lock_name to be the
  // table's key, which only the planner checks.
  session.plan_check = "EXPLAIN EXECUTE lockwatch_acquire('{}', '{}', '{}', '{}')";
  session.missing = {pg_code("42P01"), pg_code("42703")};  // undefined_table, undefined_column
  // Another connection may have made it meanwhile (42P07; 42710 or 23505
  // when both got as far as the catalog): the check after tells.
  session.exists = {pg_code("42P07"), pg_code("42710"), pg_code("23505")};
  connections_.make(loop, target_, settings_, std::move(session));
}

// ---- the rest

void PgStore::raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) {
  connections_.command().execute("lockwatch_raise_fence", {to_hex(name), std::to_string(fence)},
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
  session.setup = {fmt::format("LISTEN \"{}\"", channel_)};  // no tables to name in messages
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

void PgStore::poll_replies() { connections_.renew().poll_now(); }

void PgStore::close() {
  closed_ = true;
  RecipeStore::close();
  if (notices_) notices_->close();
}

}  // namespace lockwatch::detail
