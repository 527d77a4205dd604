// lib/store/postgresql/pg_store.hpp: locks in a PostgreSQL table
// (postgresql://user:password@host[:port]/database).
//
// One row per lock name: the owner token, the fencing counter, the expiry
// (set and judged on the database's clock only, clock_timestamp()) and a
// scheduled job's last period. Each step is one statement, its own
// transaction, never a read then a write:
//   acquire  INSERT ... ON CONFLICT (lock_name) DO UPDATE ... WHERE expired
//            (or ours) ... RETURNING the fence, for every acquisition asked
//            for in a loop turn (calls of one name or a few coalesced): each
//            free or expired row becomes ours with its fence raised;
//   renew    UPDATE ... FROM (the batch's (name, owner) pairs) WHERE
//            unexpired: every renewal due in one tick, in chunks, on a
//            connection of its own so that it never queues behind
//            acquisitions;
//   release  UPDATE ... SET owner = '', expires_at = clock_timestamp()
//            WHERE ours, with pg_notify() for each row released (a lock
//            given back unused notifies nobody), for every release of a
//            loop turn.
// Each statement is its own transaction (pipeline mode, a sync each):
// coalescing calls into one statement is what saves the server a
// transaction per lock when many callers lock at once.
// A statement answers with what it decided (RETURNING); a read that says
// why a row was not ours (who holds it, for how long) comes from the same
// statement and decides nothing. The row is never deleted: the fencing
// counter lives in it and never goes back.
//
// Release notices: LISTEN on a channel named after the table, on a
// connection of its own made at the first subscribe(); the payload is
// the lock's name in hex. release_events() is true: waiters sleep until a
// notice or the holder's ttl. `subscribed` is reported for every name once
// LISTEN is confirmed (again after each reconnect), `subscriptions_lost`
// when that connection drops (notices sent meanwhile are lost).
//
// Connections (PgConnection): two for commands, one for renewals, one for
// notices.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <uv.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lockwatch/options.hpp"
#include "store/capabilities.hpp"
#include "store/postgresql/pg_connection.hpp"
#include "store/postgresql/pg_target.hpp"
#include "store/store_base.hpp"

namespace lockwatch::detail {

class Loop;

class PgStore final : public StoreBase, public FenceRaising, public JobClaims, public OperatorTools {
 public:
  // The lock_name column's limit (a CHECK in the table): longer names
  // (prefix + key) are refused before anything is sent.
  static constexpr std::size_t kMaxNameBytes = 255;

  PgStore(Loop& loop, PgTarget target, const Options& options);
  ~PgStore() override;

  // Any thread. InvalidArgument if the options do not suit this store.
  static void check_options(const PgTarget& target, const Options& options);
  // The table as created when it is missing (also in docs/stores.md).
  static std::string table_definition(const std::string& table);

  // One statement per batch (see above); release notices by LISTEN.
  // Exclusive locks only (no shared, permit or fair ones).
  const char* check_kind(LockKind kind) const noexcept override {
    if (kind.exclusive_kind()) return nullptr;
    if (kind.mode() == LockKind::Mode::kFair)
      return "the lock table keeps no queue of waiters: fair locks are not kept on PostgreSQL yet";
    return "the lock table keeps one owner per key: shared and permit locks are not kept on PostgreSQL yet";
  }
  LOCKWATCH_STORE_OPERATIONS;
  LOCKWATCH_STORE_NOTICES;
  void poll_replies() override;
  // FenceRaising, JobClaims on the database's clock (clock_timestamp()),
  // OperatorTools: on the row.
  LOCKWATCH_FENCE_RAISING_OPERATIONS;
  LOCKWATCH_JOB_CLAIMS_OPERATIONS;
  LOCKWATCH_OPERATOR_TOOLS_OPERATIONS;

 private:
  void started() override;
  struct AcquireBatch;
  struct RenewBatch;
  struct ReleaseBatch;
  struct PendingAcquire;
  struct PendingRelease;
  PgConnection& command_connection();
  void coalesce();
  static void on_coalesce(uv_idle_t* idle);
  void send_acquisitions();
  void send_releases();
  void acquire_batch(std::shared_ptr<AcquireBatch> batch);
  void renew_group(std::shared_ptr<RenewBatch> batch, std::vector<std::size_t> members);
  void release_batch(std::shared_ptr<ReleaseBatch> batch);
  void start_notices();

  Loop& loop_;
  const Options options_;
  const PgTarget target_;
  const std::string channel_;
  std::vector<std::unique_ptr<PgConnection>> commands_;
  std::unique_ptr<PgConnection> renew_;
  std::unique_ptr<PgConnection> notices_;  // made at the first subscribe()
  std::set<std::string, std::less<>> subscribed_;
  // Acquisitions and releases asked for in this loop turn, sent together
  // by coalesce_ (an idle handle: the turn's end).
  std::vector<PendingAcquire> acquires_;
  std::vector<PendingRelease> releases_;        // with release notices
  std::vector<PendingRelease> quiet_releases_;  // without
  uv_idle_t coalesce_{};
  bool coalescing_ = false;
  bool started_ = false;
  bool listening_ = false;  // LISTEN is confirmed on notices_
  bool closed_ = false;
};

}  // namespace lockwatch::detail
