// lib/store/sql/sql_store.hpp: locks in a MariaDB/MySQL table
// (mysql://user:password@host[:port]/database).
//
// The design is in docs/stores.md (#sql-mariadb-or-mysql: the lock row,
// each exclusive step one statement in autocommit, the waiter's mark) and
// docs/kinds.md (#mariadb-mysql: the holders' table, each other kind's
// step one compound statement); the recipe it shares with PostgreSQL is
// sqlcommon/sql_recipe.hpp. What the code adds to them:
//   - the row is never deleted, and a read that classifies an outcome
//     (who holds a busy lock, why a renewal missed) only ever follows the
//     write that decided it;
//   - the kinds' acquisitions of one loop turn share one transaction,
//     each lock's decision after the other in name order, each outcome in
//     a session variable of its own, read by the next statement;
//   - the waiter's mark names the store (waiter_id_, random per store),
//     not the acquisition: only the first waiter of a key in a runtime
//     asks, and a caller that waits again with a new call keeps the turn.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "store/sql/sql_connection.hpp"
#include "store/sql/sql_target.hpp"
#include "store/sqlcommon/sql_recipe.hpp"

namespace lockwatch::detail {

// Every kind; no release notices, so waiters poll with the runtime's
// back-off, keeping their turn by their mark. JobClaims (on the database's
// clock, NOW(6)), OperatorTools and FairQueue are RecipeStore's flows over
// statements().
class SqlStore final : public sqlcommon::RecipeStore<SqlConnection> {
 public:
  SqlStore(Loop& loop, SqlTarget target, const sqlcommon::SqlSettings& settings);
  ~SqlStore() override;

  // The tables as created when missing (also in docs/stores.md): the lock
  // table, and its companion for shared, permit and fair holders.
  static std::string table_definition(const std::string& table);
  static std::string holders_definition(const std::string& table);
  // What tables made by earlier versions are altered with (columns added since).
  static std::vector<std::string> migrations(const std::string& table);

 private:
  using AcquireBatchPtr = sqlcommon::AcquireBatchPtr;
  using RenewBatchPtr = sqlcommon::RenewBatchPtr;
  // RecipeStore's steps (sql_recipe.hpp): a set of keys asked for together
  // is decided by one statement, one transaction.
  void acquire_batch(AcquireBatchPtr batch) override;
  // Exclusive releases: the rows read, then released, in one round trip
  // (before: each lock's Standing); a kind's holders leave each in a
  // transaction of its own (release_kinds()).
  using ReleaseBatch = sqlcommon::ReleaseBatch;
  void release_batch(std::shared_ptr<ReleaseBatch> batch) override;
  // The answer to a release batch's update (read again when a lock
  // expired between the read before and the update).
  void release_answered(const std::shared_ptr<ReleaseBatch>& batch, const SqlResult& r, const StoreError* err);
  // The answer to acquire_batch()'s report (what its insert did).
  void acquire_reported(const AcquireBatchPtr& batch, const SqlResult& r);
  // Holders of the other kinds renew their own rows (renew_kinds()).
  void renew_group(RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl,
                   bool kinds) override;
  // The recipe's named statements in this dialect (sqlcommon/sql_recipe.hpp).
  std::vector<SqlStatement> statements() const;
  // Who holds lock rows, as read after a write: the owner (token or
  // marker) and whether the row is unexpired, by name.
  struct RowHolder {
    std::string owner;
    bool live = false;
  };
  using RowHolders = std::map<std::string, RowHolder, std::less<>>;
  void read_holders(SqlConnection& conn, const std::string& names,
                    std::function<void(const RowHolders&, const StoreError*)> done);
  // How a row stands for `token`: live and ours, live and another's, or neither.
  enum class Standing { kOurs, kOther, kNone };
  static Standing standing(const RowHolders& rows, std::string_view name, std::string_view token);
  void classify_renewals(RenewBatchPtr batch, std::vector<std::size_t> members);
  // The exclusive acquisitions of a batch that found readers leave the
  // writer's mark; `done` runs once it is written (or failed).
  void mark_writers(std::vector<std::pair<std::string, std::chrono::milliseconds>> names, std::function<void()> done);
  // Shared, permit and fair locks (sql_store_kinds.cpp): their
  // acquisitions' statements (the recipe decides a group of them in one
  // transaction), renewals and releases.
  std::vector<SqlStatement> kind_statements() const;
  void renew_kinds(RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl);
  void release_kinds(const std::vector<sqlcommon::PendingRelease>& kinds);
  // Statements that shrink the lock row's expiry to its latest live holder
  // or waiter, or free it with the last (only while it holds a marker).
  std::string shrink(const std::string& name) const;

  // One statement may name a lock twice; one renew statement per ttl.
  static constexpr sqlcommon::Dialect kDialect{.repeated_names = true, .ttl_per_lease = false};

  const std::string owner_name_;  // the owner name as a hex literal, recorded with each grant
  const std::string waiter_id_;   // random: how this store's waiters name themselves in a mark
  const SqlTarget target_;
  std::string table_;    // quoted
  std::string holders_;  // quoted: the companion table
};

}  // namespace lockwatch::detail
