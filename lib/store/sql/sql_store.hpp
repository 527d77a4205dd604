// lib/store/sql/sql_store.hpp: locks in a MariaDB/MySQL table
// (mysql://user:password@host[:port]/database).
//
// One row per lock name: the owner token, the fencing counter and the
// expiry, set and judged on the database's clock only (NOW(6), UTC). Each
// step is one atomic statement in autocommit, never a read then a write:
//   acquire  one INSERT ... ON DUPLICATE KEY UPDATE for the batch: each
//            free or expired row -> ours, with its fence raised;
//   renew    UPDATE ... WHERE (lock_name, owner) IN (...) AND unexpired:
//            every renewal due in one tick, one statement per ttl;
//   release  UPDATE ... SET owner = '', expires_at = NOW(6) WHERE ours
//            (the batch's rows in one statement).
// The row is never deleted: the fencing counter lives in it and never goes
// back. A read that classifies an outcome (who holds a busy lock, why a
// renewal missed) only ever follows the write that decided it.
//
// Connections (SqlConnection): two for commands and one for renewals, so
// a renewal never queues behind a burst of acquisitions. There are no
// release notices: release_events() is false and waiters retry on the
// runtime's bounded back-off.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockwatch/options.hpp"
#include "store/capabilities.hpp"
#include "store/store_base.hpp"
#include "store/sql/sql_connection.hpp"
#include "store/sql/sql_target.hpp"

namespace lockwatch::detail {

class Loop;

class SqlStore final : public StoreBase, public JobClaims, public OperatorTools {
 public:
  // The lock_name column's size: longer names (prefix + key) are refused.
  static constexpr std::size_t kMaxNameBytes = 255;

  SqlStore(Loop& loop, SqlTarget target, const Options& options);
  ~SqlStore() override;

  // The table as created when it is missing (also in docs/stores.md).
  static std::string table_definition(const std::string& table);

  // One statement per batch (see above); no release notices, so waiters
  // poll with the runtime's back-off.
  // Exclusive locks only (no shared, permit or fair ones).
  const char* check_kind(LockKind kind) const noexcept override {
    if (kind.exclusive_kind()) return nullptr;
    if (kind.mode() == LockKind::Mode::kFair)
      return "the lock table keeps no queue of waiters: fair locks are not kept on MariaDB yet";
    return "the lock table keeps one owner per key: shared and permit locks are not kept on MariaDB yet";
  }
  LOCKWATCH_STORE_OPERATIONS;
  // JobClaims on the database's clock (NOW(6)); OperatorTools on the row.
  LOCKWATCH_JOB_CLAIMS_OPERATIONS;
  LOCKWATCH_OPERATOR_TOOLS_OPERATIONS;

 private:
  void started() override;
  struct RenewBatch;
  struct AcquireBatch;
  SqlConnection& command_connection();
  void acquire_batch(std::shared_ptr<AcquireBatch> batch);
  void renew_group(std::shared_ptr<RenewBatch> batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl);
  void classify_renewals(std::shared_ptr<RenewBatch> batch, std::vector<std::size_t> members);

  const Options options_;
  const SqlTarget target_;
  std::string table_;  // quoted
  std::vector<std::unique_ptr<SqlConnection>> commands_;
  std::unique_ptr<SqlConnection> renew_;
};

}  // namespace lockwatch::detail
