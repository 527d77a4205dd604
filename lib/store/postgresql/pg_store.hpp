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
// Shared, permit and fair locks keep their holders in a second table,
// <table>_holders (holders_table_definition(), created when missing
// beside an existing lock table): one row per (lock_name, owner) with a
// role ('s' reader, 'p' permit, 'f' fair holder, 'q' fair waiter with its
// place `seq`, 'w' a writer's mark) and its own expires_at. The lock row
// then holds a marker instead of an owner token ('lockwatch:shared',
// 'lockwatch:permits:<n>', 'lockwatch:fair') with an expiry covering its
// latest holder, so the exclusive statements above find it busy as they
// are; the acquire statement only adds the writer's mark (a busy row held
// shared: readers stay out while it lives, 2 s or the ttl after the
// writer's last attempt), its deletion at the grant, and the marker in a
// busy answer (another family: InvalidArgument). The kinds' steps are
// short transactions (PgConnection::execute_all, one sync): the first
// statement locks the names' lock rows in name order (INSERT ... ON
// CONFLICT DO UPDATE ... WHERE false: made when missing, locked either
// way), the second reads afresh and decides and writes in one statement:
//   acquire  the calls of one loop turn (a set's keys among them) in one
//            transaction, one statement each after the rows' lock:
//            refused as another family or n; a reader busy
//            behind a writer or a live mark, a permit behind n live
//            holders, a fair caller unless the lock is free and it is the
//            first live waiter (else it takes or keeps its place); a grant
//            writes its row, the marker and the expiry, and raises the
//            fence (permits, fair; a reader gets the last writer's);
//   renew    a tick's leases: the holder's row and the lock row's expiry;
//   release  the holder's row goes, the lock row's expiry shrinks to the
//            latest remaining holder's, or the row is freed with the last;
//   withdraw a fair waiter's row goes (FairQueue).
// Each acquisition also deletes the name's rows whose time ran out, and
// holders' rows under a lock row without a marker. Every change to a name's
// holders' rows comes after its lock row is locked (the exclusive
// statement's too), so these never deadlock each other.
//
// Release notices: LISTEN on a channel named after the table, on a
// connection of its own made at the first subscribe(); the payload is
// the lock's name in hex (also for a permit's or fair holder's release, a
// last reader's, and a fair waiter leaving a free lock to the next one).
// release_events() is true: waiters sleep until a notice or the holder's
// ttl. `subscribed` is reported for every name once
// LISTEN is confirmed (again after each reconnect), `subscriptions_lost`
// when that connection drops (notices sent meanwhile are lost).
//
// Connections (PgConnection): two for commands, one for renewals, one for
// notices.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "store/postgresql/pg_connection.hpp"
#include "store/postgresql/pg_target.hpp"
#include "store/sqlcommon/sql_recipe.hpp"

namespace lockwatch::detail {

class PgStore final : public sqlcommon::RecipeStore<PgConnection>, public FenceRaising {
 public:
  PgStore(Loop& loop, PgTarget target, const sqlcommon::SqlSettings& settings);
  ~PgStore() override;

  // The tables as created when they are missing (also in docs/stores.md).
  static std::string table_definition(const std::string& table);
  static std::string holders_table_definition(const std::string& table);

  // Every kind: exclusive, shared, permits(n) and fair (see above).
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  void poll_replies() override;
  // FenceRaising, JobClaims on the database's clock (clock_timestamp()),
  // OperatorTools: on the row.
  void raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) override;
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  // FairQueue: the waiter's row goes, in a transaction that locks the
  // lock row first; a first waiter that leaves a free lock notifies.
  void withdraw(const LockRef& lock, WithdrawDone done) override;

 private:
  using AcquireBatchPtr = sqlcommon::AcquireBatchPtr;
  using ReleaseBatch = sqlcommon::ReleaseBatch;
  using PendingRelease = sqlcommon::PendingRelease;
  // The turn's end: its acquisitions, then its releases.
  void turn_ended() override;
  void send_releases();
  // RecipeStore's steps (sql_recipe.hpp), each one statement, or for the
  // other kinds one transaction, its lock rows locked first.
  void acquire_batch(AcquireBatchPtr batch) override;
  void send_kind_group(AcquireBatchPtr group) override;
  Acquired kind_outcome(const sqlcommon::PendingAcquire& a, const PgRows& rows) const;
  // The refusal of `lock`: its key is held as the lock row's `owner` says.
  StoreError refusal(const sqlcommon::PendingAcquire& lock, std::string_view owner) const;
  void renew_group(sqlcommon::RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl,
                   bool kinds) override;
  void list_names(std::string pattern, std::size_t limit, RowsDone done) override;
  void release_batch(std::shared_ptr<ReleaseBatch> batch);
  void start_notices();

  // ON CONFLICT updates a row once per statement; arrays carry a ttl per lease.
  static constexpr sqlcommon::Dialect kDialect{.repeated_names = false, .ttl_per_lease = true};

  const PgTarget target_;
  const std::string channel_;
  std::unique_ptr<PgConnection> notices_;  // made at the first subscribe()
  std::set<std::string, std::less<>> subscribed_;
  // Releases asked for in this loop turn, sent together at its end.
  std::vector<PendingRelease> releases_;        // with release notices
  std::vector<PendingRelease> quiet_releases_;  // without
  bool listening_ = false;  // LISTEN is confirmed on notices_
  bool closed_ = false;
};

}  // namespace lockwatch::detail
