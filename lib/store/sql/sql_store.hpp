// lib/store/sql/sql_store.hpp: locks in a MariaDB/MySQL table
// (mysql://user:password@host[:port]/database).
//
// The design is in docs/stores.md (#sql-mariadb-or-mysql: the lock row,
// each exclusive step one atomic write, the waiter's mark) and
// docs/kinds.md (#mariadb-mysql: the holders' table, each other kind's
// step one compound statement); the recipe it shares with PostgreSQL is
// sqlcommon/sql_recipe.hpp. What the code adds to them:
//   - the row is never deleted, and a read that classifies an outcome
//     (who holds a busy lock, why a renewal missed) only ever follows the
//     write that decided it, or (a release's) reads rows its transaction
//     has locked, on the clock reading its write judges by;
//   - the kinds' acquisitions of one loop turn share one transaction,
//     each lock's decision after the other in name order, each outcome in
//     a session variable of its own, read by the next statement;
//   - the waiter's mark names the store (waiter_id_, random per store),
//     not the acquisition: only the first waiter of a key in a runtime
//     asks, and a caller that waits again with a new call keeps the turn.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <string>
#include <vector>

#include "store/sql/sql_connection.hpp"
#include "store/sql/sql_target.hpp"
#include "store/sqlcommon/sql_recipe.hpp"

namespace lockwatch::detail {

// Every kind; no release notices, so waiters poll with the runtime's
// back-off, keeping their turn by their mark. The locks' steps, JobClaims
// (on the database's clock, NOW(6)), OperatorTools and FairQueue are
// RecipeStore's flows over statements().
class SqlStore final : public sqlcommon::RecipeStore<SqlConnection> {
 public:
  SqlStore(Loop& loop, SqlTarget target, const sqlcommon::SqlSettings& settings);
  static constexpr const char* kServer = "SQL";  // as messages name its lock table's server

 private:
  // The recipe's named statements in this dialect (sqlcommon/sql_recipe.hpp):
  // all (sql_store.cpp), the exclusive locks' (acquire, renew, release;
  // acquire_statement() the first),
  // and the shared, permit and fair locks' (sql_store_kinds.cpp: each
  // acquisition is part of one compound statement).
  std::vector<SqlStatement> statements() const;
  std::vector<SqlStatement> lock_statements() const;
  SqlStatement acquire_statement() const;
  std::vector<SqlStatement> kind_statements() const;
  // Statements that shrink the lock row's expiry to its latest live holder
  // or waiter, or free it with the last (only while it holds a marker).
  std::string shrink(const std::string& name) const;

  // One statement may name a lock twice; one renew statement per ttl.
  static constexpr sqlcommon::Dialect kDialect{.repeated_names = true, .ttl_per_lease = false};

  const std::string owner_name_;  // the owner name as a hex literal, recorded with each grant
  const std::string waiter_id_;   // random: how this store's waiters name themselves in a mark
  std::string table_;    // quoted
  std::string holders_;  // quoted: the companion table
};

}  // namespace lockwatch::detail
