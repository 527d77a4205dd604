// lib/store/postgresql/pg_store.hpp: locks in a PostgreSQL table
// (postgresql://user:password@host[:port]/database).
//
// The design is in docs/stores.md (#postgresql: the lock row, each step
// one statement and its own transaction, LISTEN/NOTIFY) and docs/kinds.md
// (#postgresql: the holders' table, each other kind's step a short
// transaction that locks the lock rows first); the statements are in
// pg_statements.cpp, the recipe it shares with MariaDB in
// sqlcommon/sql_recipe.hpp. What the code adds to them:
//   - every change to a name's holders' rows comes after its lock row is
//     locked (the exclusive statement's too), so these never deadlock
//     each other;
//   - release notices come on a connection of its own, made at the first
//     subscribe(); `subscribed` is reported for every name once LISTEN is
//     confirmed (again after each reconnect), `subscriptions_lost` when
//     that connection drops (notices sent meanwhile are lost).
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <memory>
#include <set>
#include <string>

#include "store/postgresql/pg_connection.hpp"
#include "store/postgresql/pg_target.hpp"
#include "store/sqlcommon/sql_recipe.hpp"

namespace lockwatch::detail {

class PgStore final : public sqlcommon::RecipeStore<PgConnection>, public FenceRaising {
 public:
  PgStore(Loop& loop, PgTarget target, const sqlcommon::SqlSettings& settings);
  static constexpr const char* kServer = "PostgreSQL";  // as messages name its lock table's server

  void close() override;
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  void poll_replies() override;
  // FenceRaising on the row. The locks' steps, JobClaims (on the
  // database's clock, clock_timestamp()), OperatorTools and FairQueue are
  // RecipeStore's flows over pg_statements() (each step one statement, or
  // for the other kinds one transaction, its lock rows locked first; a
  // first waiter that withdraws from a free lock notifies).
  void raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) override;

 private:
  void start_notices();

  // ON CONFLICT updates a row once per statement; arrays carry a ttl per lease.
  static constexpr sqlcommon::Dialect kDialect{.repeated_names = false, .ttl_per_lease = true};

  const PgTarget target_;
  std::unique_ptr<PgConnection> notices_;  // made at the first subscribe()
  std::set<std::string, std::less<>> subscribed_;
  bool listening_ = false;  // LISTEN is confirmed on notices_
  bool closed_ = false;
};

}  // namespace lockwatch::detail
