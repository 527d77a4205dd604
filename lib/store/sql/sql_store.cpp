#include "store/sql/sql_store.hpp"

#include <fmt/format.h>

#include <map>
#include <numeric>

#include "core/token.hpp"
#include "store/sql/sql_literals.hpp"
#include "store/sqlcommon/claims.hpp"
#include "store/sql/sql_error.hpp"

namespace lockwatch::detail {

using namespace sql;  // the statements' literals (sql_literals.hpp)

namespace {

// A waiter's mark on the lock row lives this long after its last attempt:
// twice the runtime's longest poll interval (1 s), so a waiter keeps its
// place from poll to poll, and one that gave up frees it within this time.
constexpr std::chrono::milliseconds kWaiterMarkLife{2000};
// A caller kept from a free row by another's mark tries again within this
// (or when the mark runs out, if sooner), so the row does not sit unused
// for long if the marked waiter is gone.
constexpr std::chrono::milliseconds kMarkedRowRetry{100};

}  // namespace

std::string SqlStore::table_definition(const std::string& table) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS `{}` (\n"
      "  lock_name   VARBINARY({}) NOT NULL,\n"
      "  owner       VARBINARY(64) NOT NULL DEFAULT '',\n"
      "  fence       BIGINT UNSIGNED NOT NULL DEFAULT 0,\n"
      "  expires_at  DATETIME(6) NOT NULL,\n"
      "  last_period BIGINT NULL,\n"
      "  owner_name  VARBINARY(128) NOT NULL DEFAULT '',\n"
      "  granted_at  DATETIME(6) NULL,\n"
      "  waiter      VARBINARY(64) NOT NULL DEFAULT '',\n"
      "  waiter_until DATETIME(6) NULL,\n"
      "  PRIMARY KEY (lock_name)\n"
      ") ENGINE=InnoDB",
      table, kMaxNameBytes);
}

std::vector<std::string> SqlStore::migrations(const std::string& table) {
  // Owner names and grant times, then the waiter's mark of the lock
  // table: tables made by versions before.
  std::vector<std::string> out;
  for (const std::string& t : {table, table + "_holders"})
    out.push_back(fmt::format("ALTER TABLE `{}` ADD COLUMN IF NOT EXISTS owner_name VARBINARY(128) NOT NULL DEFAULT '', "
                              "ADD COLUMN IF NOT EXISTS granted_at DATETIME(6) NULL",
                              t));
  out.push_back(fmt::format("ALTER TABLE `{}` ADD COLUMN IF NOT EXISTS waiter VARBINARY(64) NOT NULL DEFAULT '', "
                            "ADD COLUMN IF NOT EXISTS waiter_until DATETIME(6) NULL",
                            table));
  return out;
}

std::string SqlStore::holders_definition(const std::string& table) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS `{}_holders` (\n"
      "  lock_name   VARBINARY({}) NOT NULL,\n"
      "  owner       VARBINARY(64) NOT NULL,\n"
      "  role        CHAR(1) NOT NULL,\n"
      "  n           BIGINT UNSIGNED NOT NULL DEFAULT 0,\n"
      "  seq         BIGINT UNSIGNED NOT NULL DEFAULT 0,\n"
      "  expires_at  DATETIME(6) NOT NULL,\n"
      "  owner_name  VARBINARY(128) NOT NULL DEFAULT '',\n"
      "  granted_at  DATETIME(6) NULL,\n"
      "  PRIMARY KEY (lock_name, owner)\n"
      ") ENGINE=InnoDB",
      table, kMaxNameBytes);
}

SqlStore::SqlStore(Loop& loop, SqlTarget target, const sqlcommon::SqlSettings& settings)
    : RecipeStore(loop, settings, kDialect,
                  "the lock name (key_prefix + key) is longer than the 255 bytes of the SQL lock table's lock_name "
                  "column",
                  ""),
      owner_name_(sql::hex(settings.owner_name)), waiter_id_(TokenGenerator().next().str()),
      target_(std::move(target)), table_("`" + target_.table + "`"),
      holders_("`" + target_.table + "_holders`") {
  offer({.job_claims = this, .operator_tools = this, .lock_listing = this, .fair_queue = this});
  SqlSession session;
  long long wait_s = std::max<long long>(1, settings_.command_timeout.count() / 1000);
  session.setup = {
      fmt::format("SET SESSION time_zone = '+00:00', SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION', "
                  "SESSION autocommit = 1, SESSION innodb_lock_wait_timeout = {}",
                  wait_s),
      "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
  };
  // One statement checks both tables (a missing one is 1146, a missing
  // column 1054); existing installs get the companion table made here.
  session.check = fmt::format(
      "SELECT l.lock_name, l.owner, l.fence, l.expires_at, l.last_period, l.owner_name, l.granted_at, l.waiter, "
      "l.waiter_until, h.lock_name, h.owner, h.role, h.n, h.seq, h.expires_at, h.owner_name, h.granted_at "
      "FROM {} l, {} h LIMIT 0",
      table_, holders_);
  session.create = {table_definition(target_.table), holders_definition(target_.table)};
  session.migrate = migrations(target_.table);
  session.table = fmt::format("{}.{}", target_.database, target_.table);
  session.stale = std::make_shared<SqlStaleThreads>();
  session.statements = statements();
  connections_.make(loop, target_, settings_, session);
}

SqlStore::~SqlStore() = default;

void SqlStore::read_holders(SqlConnection& conn, const std::string& names,
                            std::function<void(const RowHolders&, const StoreError*)> done) {
  conn.query(fmt::format("SELECT lock_name, owner, expires_at > NOW(6) FROM {} WHERE lock_name IN ({})", table_, names),
             [done = std::move(done)](const SqlResult& r, const StoreError* err) {
               RowHolders rows;
               if (!err)
                 for (const auto& row : r.rows)
                   if (row.size() == 3) rows[row[0]] = {row[1], row[2] == "1"};
               done(rows, err);
             });
}

void SqlStore::acquire_batch(AcquireBatchPtr batch) {
  // One statement decides for the whole batch, row by row: a free or
  // expired row becomes ours with its fence raised, unless another
  // runtime's mark on it lives; a row held by another owner is left as it
  // is. In each row `fence` is assigned first, while owner, expires_at
  // and the mark still hold the old values; then owner; then expires_at,
  // which sees the new owner; then the mark (waiter, then waiter_until,
  // which sees the new waiter): cleared by our grant, left when another's
  // lives, else ours (new or renewed) when we are busy and wait.
  // VALUES(waiter) carries this store's waiter_id_ when the acquisition
  // waits, '' when it does not (so a call without a wait never passes a
  // mark, even ours); a row we insert is ours, its mark dead (waiter_until
  // NULL). A name twice in the batch is two rows of the statement, in
  // order, the second seeing what the first did. One commit for the batch.
  std::string insert = fmt::format(
      "INSERT INTO {} (lock_name, owner, fence, expires_at, owner_name, granted_at, waiter) VALUES ", table_);
  std::string names;
  for (std::size_t k = 0; k < batch->locks.size(); ++k) {
    const auto& l = batch->locks[k];
    if (k > 0) {
      insert += ',';
      names += ',';
    }
    std::string n = hex(l.name);
    std::string t = hex(l.token);
    insert += fmt::format("({}, {}, 1, NOW(6) + INTERVAL {} MICROSECOND, {}, NOW(6), {})", n, t, micros(l.ttl),
                          owner_name_, l.waits ? hex(waiter_id_) : std::string("''"));
    names += n;
  }
  // No mark lives but ours (NULL-safe: waiter_until may be NULL).
  constexpr std::string_view unmarked =
      "(waiter_until IS NULL OR waiter_until <= NOW(6) OR waiter = VALUES(waiter))";
  insert += fmt::format(
      " ON DUPLICATE KEY UPDATE "
      "fence = IF(expires_at <= NOW(6) AND {0}, fence + 1, fence), "
      "owner_name = IF(expires_at <= NOW(6) AND {0}, VALUES(owner_name), owner_name), "
      "granted_at = IF(expires_at <= NOW(6) AND {0}, VALUES(granted_at), granted_at), "
      "owner = IF(expires_at <= NOW(6) AND {0}, VALUES(owner), owner), "
      "expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at), "
      "waiter = IF({0}, IF(owner = VALUES(owner), '', IF(VALUES(waiter) = '', waiter, VALUES(waiter))), waiter), "
      "waiter_until = IF(waiter = '', NULL, IF(waiter = VALUES(waiter), NOW(6) + INTERVAL {1} MICROSECOND, "
      "waiter_until))",
      unmarked, micros(kWaiterMarkLife));
  // In the same round trip, what the write did: a row whose owner is our
  // token (unique to this acquisition) is ours, with the fence the write
  // gave it; any other row is busy for its remaining time, or, free but
  // marked by another, for a short while. The read decides nothing: only
  // our own write can have put our token there.
  std::string report = fmt::format(
      "SELECT lock_name, owner, fence, GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at), 0), waiter, "
      "IFNULL(GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), waiter_until), 0), 0) FROM {} WHERE lock_name IN ({})",
      table_, names);
  // A failure answers the batch (or sends it again); the report answers
  // it otherwise.
  command_connection().run({std::move(insert), std::move(report)},
                           [this, batch](const SqlResult& r, const StoreError* err) {
                             if (err) return acquire_failed(batch, *err);
                             acquire_reported(batch, r);
                           });
}

void SqlStore::acquire_reported(const AcquireBatchPtr& batch, const SqlResult& r) {
  std::map<std::string_view, const std::vector<std::string>*> rows;
  for (const auto& row : r.rows)
    if (row.size() == 6) rows[row[0]] = &row;
  auto answers = std::make_shared<std::vector<Acquired>>(batch->locks.size());
  std::vector<std::pair<std::string, std::chrono::milliseconds>> marks;
  for (std::size_t k = 0; k < batch->locks.size(); ++k) {
    const auto& l = batch->locks[k];
    Acquired& out = (*answers)[k];
    auto it = rows.find(l.name);
    if (it == rows.end()) {
      out.status = Acquired::Status::kBusy;  // cannot be: the insert made the row
      continue;
    }
    const auto& row = *it->second;
    long long us = to_ll(row[3]);
    if (row[1] == l.token && us > 0) {
      out.status = Acquired::Status::kTaken;
      out.fence = static_cast<std::uint64_t>(to_ll(row[2]));
      continue;
    }
    out.status = Acquired::Status::kBusy;
    out.busy_for = sql::ms_up(us);
    const long long mark_us = to_ll(row[5]);
    if (us == 0 && mark_us > 0 && !(l.waits && row[4] == waiter_id_))
      // Free, but another's mark lives: the marked waiter goes first;
      // we look again soon, in case it never comes.
      out.busy_for = std::min(sql::ms_up(mark_us), kMarkedRowRetry);
    // Readers hold it (the writer leaves its mark), or another kind does.
    const std::string_view owner = row[1];
    if (owner == kSharedMarker || (us > 0 && (owner == kFairMarker || owner.starts_with(kPermitsMarker)))) {
      auto mark = sqlcommon::exclusive_busy(out, l, owner, target_.name());
      if (mark) marks.emplace_back(l.name, *mark);
    }
  }
  auto answer = [batch, answers] {
    for (std::size_t k = 0; k < batch->locks.size(); ++k) batch->locks[k].answer((*answers)[k]);
  };
  if (marks.empty()) return answer();
  mark_writers(std::move(marks), std::move(answer));
}

void SqlStore::mark_writers(std::vector<std::pair<std::string, std::chrono::milliseconds>> names,
                            std::function<void()> done) {
  // The mark carries the lock's fence: a writer's grant raises it, and so
  // ends the mark however long it had to run. It is left only while
  // readers still hold the row; a mark that fails to be written leaves
  // the writer to try again (and mark again) on its back-off.
  auto left = std::make_shared<std::size_t>(names.size());
  auto shared_done = std::make_shared<std::function<void()>>(std::move(done));
  SqlConnection& conn = command_connection();
  for (const auto& [name, mark] : names) {
    conn.query(fmt::format("INSERT INTO {} (lock_name, owner, role, n, seq, expires_at) "
                           "SELECT lock_name, '{}', 'w', fence, 0, NOW(6) + INTERVAL {} MICROSECOND FROM {} "
                           "WHERE lock_name = {} AND owner = '{}' AND expires_at > NOW(6) "
                           "ON DUPLICATE KEY UPDATE n = VALUES(n), expires_at = VALUES(expires_at)",
                           holders_, kWriterOwner, micros(mark), table_, hex(name), kSharedMarker),
               [left, shared_done](const SqlResult&, const StoreError*) {
                 if (--*left == 0) (*shared_done)();
               });
  }
}

void SqlStore::renew_group(RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl,
                           bool kinds) {
  if (kinds) return renew_kinds(std::move(batch), std::move(members), ttl);
  const RenewalLists lists(batch->locks, members);
  std::string sql = fmt::format(
      "UPDATE {} SET expires_at = NOW(6) + INTERVAL {} MICROSECOND WHERE lock_name IN ({}) AND expires_at > NOW(6) "
      "AND (lock_name, owner) IN ({})",
      table_, micros(ttl), lists.names, lists.pairs);
  connections_.renew->query(std::move(sql), [this, batch, members = std::move(members)](
                                                const SqlResult& r, const StoreError* err) mutable {
    if (err) return batch->answer(members, Renewed::kTransient, err);
    if (r.affected == members.size()) return batch->answer(members, Renewed::kYes, nullptr);
    classify_renewals(std::move(batch), std::move(members));
  });
}

void SqlStore::classify_renewals(RenewBatchPtr batch, std::vector<std::size_t> members) {
  // Some were not renewed: after the write that decided, read who holds
  // each. A row that is ours and unexpired now was renewed (only our
  // token extends it); another owner's unexpired row was taken; anything
  // else expired.
  const RenewalLists lists(batch->locks, members);
  read_holders(*connections_.renew, lists.names,
               [batch, members = std::move(members)](const RowHolders& rows, const StoreError* err) {
                 if (err) return batch->answer(members, Renewed::kTransient, err);
                 for (std::size_t i : members) {
                   const LockRef& l = batch->locks[i];
                   const Standing s = standing(rows, l.name, l.token);
                   batch->done(i,
                               s == Standing::kOurs    ? Renewed::kYes
                               : s == Standing::kOther ? Renewed::kTakenByOther
                                                       : Renewed::kGone,
                               nullptr);
                 }
               });
}

SqlStore::Standing SqlStore::standing(const RowHolders& rows, std::string_view name, std::string_view token) {
  auto it = rows.find(name);
  if (it == rows.end() || !it->second.live || it->second.owner.empty()) return Standing::kNone;
  return it->second.owner == token ? Standing::kOurs : Standing::kOther;
}

void SqlStore::release_batch(std::shared_ptr<ReleaseBatch> batch) {
  if (!batch->locks.front().kind.exclusive_kind()) return release_kinds(batch->locks);
  std::vector<std::size_t> all(batch->locks.size());
  std::iota(all.begin(), all.end(), 0);
  const RenewalLists lists(batch->locks, all);
  SqlConnection& conn = command_connection();
  // In one round trip: who holds each lock, then the release of those
  // that are ours. The read before only names the outcome; the write
  // decides (only rows still ours and unexpired are released).
  read_holders(conn, lists.names, [batch](const RowHolders& rows, const StoreError* err) {
    if (err) return;  // the update fails too and answers
    for (const auto& l : batch->locks) batch->before.push_back(static_cast<int>(standing(rows, l.name, l.token)));
  });
  conn.query(fmt::format("UPDATE {} SET owner = '', expires_at = NOW(6) WHERE lock_name IN ({}) "
                         "AND expires_at > NOW(6) AND (lock_name, owner) IN ({})",
                         table_, lists.names, lists.pairs),
             [this, batch](const SqlResult& r, const StoreError* err) { release_answered(batch, r, err); });
}

void SqlStore::release_answered(const std::shared_ptr<ReleaseBatch>& batch, const SqlResult& r, const StoreError* err) {
  if (err) return batch->answer(Released::kUnconfirmed, err);
  auto before = [&](std::size_t k) {
    return k < batch->before.size() ? static_cast<Standing>(batch->before[k]) : Standing::kNone;
  };
  std::size_t ours = 0;
  for (std::size_t k = 0; k < batch->locks.size(); ++k) ours += before(k) == Standing::kOurs;
  if (r.affected == ours) {
    for (std::size_t k = 0; k < batch->locks.size(); ++k)
      batch->locks[k].answer(before(k) == Standing::kOurs    ? Released::kYes
                             : before(k) == Standing::kOther ? Released::kTakenByOther
                                                             : Released::kGone,
                             nullptr);
    return;
  }
  // A lock expired between the read and the write: read again. A row
  // still ours was not released (it expired); another owner's took it
  // since; an emptied row was released by us.
  std::vector<std::size_t> all(batch->locks.size());
  std::iota(all.begin(), all.end(), 0);
  read_holders(command_connection(), RenewalLists(batch->locks, all).names, [batch](const RowHolders& rows,
                                                                                  const StoreError* e2) {
    for (const auto& l : batch->locks) {
      auto it = rows.find(l.name);
      Released st = Released::kGone;
      if (e2)
        st = Released::kUnconfirmed;
      else if (it != rows.end() && it->second.owner.empty())
        st = Released::kYes;
      else if (it != rows.end() && it->second.owner != l.token && it->second.live)
        st = Released::kTakenByOther;
      l.answer(st, e2);
    }
  });
}

std::vector<SqlStatement> SqlStore::statements() const {
  // The claim's start, in µs since the epoch, on the sessions' UTC clock.
  constexpr std::string_view start = "TIMESTAMP '1970-01-01 00:00:00' + INTERVAL $4 MICROSECOND";
  // A key held by shared, permit or fair holders shows their latest
  // deadline, its owner the marker; fair waiters alone do not hold it.
  // Force release: whether anyone held it, then the holders and the
  // writer's mark gone and the row freed. Fair waiters keep their places
  // (and the row its marker while they wait). Withdraw: no notices to
  // send on SQL, the next waiter finds itself first at its next attempt.
  std::vector<SqlStatement> all = kind_statements();
  all.insert(all.end(), {
      {"lockwatch_time", "", {"SELECT UNIX_TIMESTAMP(NOW(6))"}},
      {"lockwatch_claim",
       "xxnn",
       {fmt::format("UPDATE {} SET last_period = $3 WHERE lock_name = $1 AND owner = $2 AND expires_at > NOW(6) "
                    "AND NOW(6) >= {} AND (last_period IS NULL OR last_period < $3)",
                    table_, start),
        fmt::format("SELECT ROW_COUNT(), UNIX_TIMESTAMP(NOW(6)), h.owner = $2 AND h.expires_at > NOW(6), "
                    "NOW(6) >= {}, h.last_period FROM (SELECT 1) AS one LEFT JOIN {} h ON h.lock_name = $1",
                    start, table_)}},
      {"lockwatch_inspect",
       "x",
       {fmt::format("SELECT GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), IF(owner LIKE '{}%', (SELECT "
                    "MAX(h.expires_at) FROM {} h WHERE h.lock_name = l.lock_name AND h.role IN ('r', 'p', 'f')), "
                    "expires_at)), 0), fence, owner, owner_name, UNIX_TIMESTAMP(granted_at), "
                    "TIMESTAMPDIFF(MICROSECOND, granted_at, NOW(6)) FROM {} l WHERE lock_name = $1",
                    sql::kMarkerPrefix, holders_, table_)}},
      {"lockwatch_holders",
       "x",
       {fmt::format("SELECT owner, owner_name, UNIX_TIMESTAMP(granted_at), TIMESTAMPDIFF(MICROSECOND, granted_at, "
                    "NOW(6)) FROM {} WHERE lock_name = $1 AND role IN ('r', 'p', 'f') AND expires_at > NOW(6) "
                    "ORDER BY granted_at",
                    holders_)}},
      {"lockwatch_list",
       "xn",
       {fmt::format("SELECT lock_name FROM {} WHERE lock_name LIKE $1 AND owner <> '' AND expires_at > NOW(6) "
                    "ORDER BY lock_name LIMIT $2",
                    table_)}},
      {"lockwatch_force_release",
       "x",
       {transaction(fmt::format(
            "SET @lw_was = 0; "
            "SELECT COUNT(*) INTO @lw_row FROM {0} WHERE lock_name = $1 FOR UPDATE; "
            "SELECT COUNT(*) INTO @lw_holders FROM {1} WHERE lock_name = $1 AND role IN ('r', 'p', 'f') "
            "AND expires_at > NOW(6); "
            "SELECT COUNT(*) INTO @lw_was FROM {0} WHERE lock_name = $1 AND owner <> '' AND expires_at > NOW(6) "
            "AND (owner NOT LIKE '{2}%' OR @lw_holders > 0); "
            "DELETE FROM {1} WHERE lock_name = $1 AND role IN ('r', 'p', 'f', 'w'); "
            "UPDATE {0} SET owner = '', expires_at = NOW(6) WHERE lock_name = $1 AND owner NOT LIKE '{2}%'; {3}",
            table_, holders_, sql::kMarkerPrefix, shrink("$1"))),
        "SELECT 1 FROM DUAL WHERE @lw_was > 0"}},
      // A shared, permit or fair holder leaves: its row goes, and the lock
      // row's expiry shrinks to the latest holder left, or the row is freed
      // with the last (a writer may take it then).
      {"lockwatch_release_holder",
       "xx",
       {transaction(fmt::format(
            "SELECT COUNT(*) INTO @lw_row FROM {0} WHERE lock_name = $1 FOR UPDATE; "
            "DELETE FROM {1} WHERE lock_name = $1 AND owner = $2 AND role IN ('r', 'p', 'f') AND expires_at > NOW(6); "
            "SET @lw_released = ROW_COUNT(); "
            "DELETE FROM {1} WHERE lock_name = $1 AND owner = $2 AND role IN ('r', 'p', 'f'); {2}",
            table_, holders_, shrink("$1"))),
        "SELECT @lw_released"}},
      {"lockwatch_withdraw",
       "xx",
       {transaction(fmt::format("SELECT COUNT(*) INTO @lw_row FROM {0} WHERE lock_name = $1 FOR UPDATE; "
                                "DELETE FROM {1} WHERE lock_name = $1 AND owner = $2 AND role = 'q'; {2}",
                                table_, holders_, shrink("$1")))}},
  });
  return all;
}

}  // namespace lockwatch::detail
