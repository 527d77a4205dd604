// lib/store/sql/sql_store.hpp: locks in a MariaDB/MySQL table
// (mysql://user:password@host[:port]/database).
//
// One row per lock name: the owner token, the fencing counter and the
// expiry, set and judged on the database's clock only (NOW(6), UTC). Each
// exclusive step is one atomic statement in autocommit, never a read then
// a write:
//   acquire  one INSERT ... ON DUPLICATE KEY UPDATE for the acquisitions
//            asked for in one turn of the loop (a set's keys among them):
//            each free or expired row -> ours, with its fence raised,
//            unless another waiter's mark lives on it (below);
//   renew    UPDATE ... WHERE (lock_name, owner) IN (...) AND unexpired:
//            every renewal due in one tick, one statement per ttl;
//   release  UPDATE ... SET owner = '', expires_at = NOW(6) WHERE ours
//            (the batch's rows in one statement).
// The row is never deleted: the fencing counter lives in it and never goes
// back. A read that classifies an outcome (who holds a busy lock, why a
// renewal missed) only ever follows the write that decided it.
//
// Shared, permit and fair locks (sql_store_kinds.cpp) keep their holders
// in a companion table, `<table>_holders`, one row per (lock_name, owner):
// a reader ('r'), a permit ('p', with its n), a fair holder ('f'), a fair
// waiter ('q', with its arrival number seq) and a writer's mark ('w',
// owner 'lockwatch:writer', with the lock's fence when it was left), each
// with its own expiry. While a holder or a waiter lives, the lock row's
// owner is a marker ('lockwatch:shared', 'lockwatch:permits:<n>',
// 'lockwatch:fair') and its expiry covers the latest of them, so the
// exclusive statements above see the key busy as they see another owner's.
// An exclusive acquire that finds readers leaves the writer's mark in a
// second statement; readers are refused while a mark of the lock's current
// fence lives (a writer's grant raises the fence and voids it). The other
// steps are each one compound statement (BEGIN NOT ATOMIC: a MariaDB
// feature, so these kinds need MariaDB, not MySQL), a transaction that
// first locks the lock's row (an insert of it when missing, then SELECT
// ... FOR UPDATE), so that concurrent callers of one name serialise; it
// leaves its outcome in session variables that the next statement of the
// same round trip reads. The kinds' acquisitions asked for in one turn of
// the loop (a set's keys among them) share one such transaction, each
// lock's decision after the other in name order, each outcome in a
// variable of its own. Renewals of many holders are one multi-table
// UPDATE per ttl (the holder's row and the lock row's expiry together).
//
// Connections (SqlConnection): two for commands and one for renewals, so
// a renewal never queues behind a burst of acquisitions. There are no
// release notices: release_events() is false and waiters retry on the
// runtime's bounded back-off.
//
// The waiter's mark: a process's own waiters are woken at each of its
// releases and retake the key a round trip later, while a waiter in
// another process polls (up to 1 s apart) and would seldom land in the
// short time the key is free. So an exclusive acquisition that waits
// (LockRef::waits) and finds the row busy marks this store next in line
// in the row (waiter = waiter_id_, random per store; waiter_until = 2 s
// on, twice the longest poll interval), when no other store's mark lives
// there, and each attempt renews it. The mark names the store, not the
// acquisition: only the first waiter of a key in a runtime asks, and a
// caller that waits again with a new call (a job's standby, a retry loop)
// keeps the turn. A free or expired row goes to the marked store's
// waiters only; the others are told busy for at most 100 ms (they look
// again, in case the waiter is gone). Its grant clears the mark; a waiter
// that gave up leaves it to run out. All in the acquire statement above:
// no round trip more. Releases, renewals and the other kinds leave marks
// alone; a call without a wait leaves none and never passes one.
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

  // Acquisitions: one statement per batch (see above); no release
  // notices, so waiters poll with the runtime's back-off, keeping their
  // turn by their mark. Every kind (see above).
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  // JobClaims on the database's clock (NOW(6)); OperatorTools on the row.
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  void withdraw(const LockRef& lock, WithdrawDone done) override;

 private:
  using AcquireBatchPtr = sqlcommon::AcquireBatchPtr;
  using RenewBatchPtr = sqlcommon::RenewBatchPtr;
  // RecipeStore's steps (sql_recipe.hpp): a set of keys asked for together
  // is decided by one statement, one transaction.
  void acquire_batch(AcquireBatchPtr batch) override;
  struct ReleaseBatch;  // sqlcommon's, with what the read before the write found
  // The answer to a release batch's update (read again when a lock
  // expired between the read before and the update).
  void release_answered(const std::shared_ptr<ReleaseBatch>& batch, const SqlResult& r, const StoreError* err);
  // The answer to acquire_batch()'s report (what its insert did).
  void acquire_reported(const AcquireBatchPtr& batch, const SqlResult& r, const StoreError* err);
  // Holders of the other kinds renew their own rows (renew_kinds()).
  void renew_group(RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl,
                   bool kinds) override;
  void list_names(std::string pattern, std::size_t limit, RowsDone done) override;
  // Sends `write` then `read` on `conn`, in one round trip: a failed
  // write is answered by `failed` alone; else `answered` gets the read's
  // answer and the rows the write changed.
  using ReadDone = std::function<void(std::uint64_t affected, const SqlResult&, const StoreError*)>;
  static void write_then_read(SqlConnection& conn, std::string write, std::function<void(const StoreError&)> failed,
                              std::string read, ReadDone answered);
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
  // Shared, permit and fair locks (sql_store_kinds.cpp): the kinds'
  // acquisitions of one loop turn (a set's keys among them) are decided in
  // one transaction per group, in name order.
  void send_kind_group(AcquireBatchPtr group) override;
  std::string kind_body(const sqlcommon::PendingAcquire& a) const;
  Acquired kind_outcome(const sqlcommon::PendingAcquire& a, const std::vector<std::string>& fields) const;
  // The refusal of `lock`: its key is held as `owner` says (a marker, or 'x': exclusive).
  StoreError refusal(const sqlcommon::PendingAcquire& lock, std::string_view owner) const;
  void renew_kinds(RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl);
  void release_kinds(std::vector<sqlcommon::PendingRelease> kinds);
  // A compound statement around `body`: one transaction, rolled back (and
  // the error passed on) when any of its statements fails.
  static std::string transaction(const std::string& body);
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
