#include "store/sql/sql_store.hpp"

#include <fmt/format.h>

#include "core/token.hpp"
#include "store/sql/sql_error.hpp"
#include "store/sql/sql_kind.hpp"
#include "store/sql/sql_literals.hpp"

namespace lockwatch::detail {

constinit const StoreKind kSqlStore = sqlcommon::sql_store_kind<SqlStore, SqlTarget>(kSqlSchemes, kSqlUsage);

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

// The tables as created when missing (also in docs/stores.md): the lock
// table, and its companion for shared, permit and fair holders; then what
// tables made by earlier versions are altered with (columns added since:
// owner names and grant times, then the waiter's mark of the lock table).
std::vector<std::string> table_statements(const std::string& table) {
  std::vector<std::string> out{fmt::format(
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
      table, SqlStore::kMaxNameBytes), fmt::format(
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
      table, SqlStore::kMaxNameBytes)};
  for (const std::string& t : {table, table + "_holders"})
    out.push_back(fmt::format("ALTER TABLE `{}` ADD COLUMN IF NOT EXISTS owner_name VARBINARY(128) NOT NULL DEFAULT '', "
                              "ADD COLUMN IF NOT EXISTS granted_at DATETIME(6) NULL",
                              t));
  out.push_back(fmt::format("ALTER TABLE `{}` ADD COLUMN IF NOT EXISTS waiter VARBINARY(64) NOT NULL DEFAULT '', "
                            "ADD COLUMN IF NOT EXISTS waiter_until DATETIME(6) NULL",
                            table));
  return out;
}

}  // namespace

SqlStore::SqlStore(Loop& loop, SqlTarget target, const sqlcommon::SqlSettings& settings)
    : RecipeStore(loop, settings, kDialect,
                  "the lock name (key_prefix + key) is longer than the 255 bytes of the SQL lock table's lock_name "
                  "column",
                  ""),
      owner_name_(sql::hex(settings.owner_name)), waiter_id_(TokenGenerator().next().str()),
      table_("`" + target.table + "`"), holders_("`" + target.table + "_holders`") {
  offer({.job_claims = this, .operator_tools = this, .lock_listing = this, .fair_queue = this});
  SqlSession session;
  session.setup = {
      fmt::format("SET SESSION time_zone = '+00:00', SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION', "
                  "SESSION autocommit = 1, SESSION innodb_lock_wait_timeout = {}",
                  std::max<long long>(1, settings_.command_timeout.count() / 1000)),
      "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
  };
  // One statement checks both tables (a missing one is 1146, a missing
  // column 1054); existing installs get the companion table made here.
  session.check = fmt::format(
      "SELECT l.lock_name, l.owner, l.fence, l.expires_at, l.last_period, l.owner_name, l.granted_at, l.waiter, "
      "l.waiter_until, h.lock_name, h.owner, h.role, h.n, h.seq, h.expires_at, h.owner_name, h.granted_at "
      "FROM {} l, {} h LIMIT 0",
      table_, holders_);
  session.create = table_statements(target.table);
  session.missing = {mariadb_code(1146), mariadb_code(1054)};  // ER_NO_SUCH_TABLE, ER_BAD_FIELD_ERROR
  session.statements = statements();
  connections_.make(loop, target, settings_, std::move(session));
}

SqlStatement SqlStore::acquire_statement() const {
  // One statement decides for the whole batch, row by row: a
  // free or expired row becomes ours with its fence raised, unless another
  // runtime's mark on it lives; a row held by another owner is left as it
  // is. In each row `fence` is assigned first, while owner, expires_at and
  // the mark still hold the old values; then owner; then expires_at, which
  // sees the new owner; then the mark (waiter, then waiter_until, which
  // sees the new waiter): cleared by our grant, left when another's lives,
  // else ours (new or renewed) when we are busy and wait. VALUES(waiter)
  // carries this store's waiter_id_ when the acquisition waits, '' when it
  // does not (so a call without a wait never passes a mark, even ours); a
  // row we insert is ours, its mark dead (waiter_until NULL). A name twice
  // in the batch is two rows of the statement, in order, the second seeing
  // what the first did. One commit for the batch.
  const std::string waiter = hex(waiter_id_);
  // No mark lives but ours (NULL-safe: waiter_until may be NULL).
  constexpr std::string_view unmarked = "(waiter_until IS NULL OR waiter_until <= NOW(6) OR waiter = VALUES(waiter))";
  const std::string insert = fmt::format(
      "INSERT INTO {0} (lock_name, owner, fence, expires_at, owner_name, granted_at, waiter) VALUES "
      "$[, |($1, $2, 1, NOW(6) + INTERVAL $3 MICROSECOND, {1}, NOW(6), IF($4 = 1, {2}, ''))$] "
      "ON DUPLICATE KEY UPDATE "
      "fence = IF(expires_at <= NOW(6) AND {3}, fence + 1, fence), "
      "owner_name = IF(expires_at <= NOW(6) AND {3}, VALUES(owner_name), owner_name), "
      "granted_at = IF(expires_at <= NOW(6) AND {3}, VALUES(granted_at), granted_at), "
      "owner = IF(expires_at <= NOW(6) AND {3}, VALUES(owner), owner), "
      "expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at), "
      "waiter = IF({3}, IF(owner = VALUES(owner), '', IF(VALUES(waiter) = '', waiter, VALUES(waiter))), waiter), "
      "waiter_until = IF(waiter = '', NULL, IF(waiter = VALUES(waiter), NOW(6) + INTERVAL {4} MICROSECOND, "
      "waiter_until))",
      table_, owner_name_, waiter, unmarked, micros(kWaiterMarkLife));
  // A row readers hold gets the writer's mark (sqlcommon::exclusive_busy()),
  // carrying the lock's fence: a writer's grant raises it, and so ends the
  // mark however long it had to run. It is left only while readers still
  // hold the row.
  const std::string mark = fmt::format(
      "INSERT INTO {0} (lock_name, owner, role, n, seq, expires_at) SELECT l.lock_name, '{1}', 'w', l.fence, 0, "
      "NOW(6) + INTERVAL LEAST(r.ttl, {2}) MICROSECOND FROM {3} JOIN {4} l ON l.lock_name = r.nm "
      "WHERE l.owner = '{5}' AND l.expires_at > NOW(6) "
      "ON DUPLICATE KEY UPDATE n = VALUES(n), expires_at = VALUES(expires_at)",
      holders_, kWriterOwner, micros(kinds::kWriterMark), batch_rows(", $3 AS ttl"), table_, kSharedMarker);
  // What the write did (sqlcommon::answer_acquisitions()): a row whose
  // owner is our token (unique to this acquisition) is ours, with the fence
  // the write gave it; any other row is busy for its remaining time, or,
  // free but marked by another, for a short while (the marked waiter goes
  // first; we look again soon, in case it never comes). The read decides
  // nothing: only our own write can have put our token there.
  const std::string report = fmt::format(
      "SELECT r.i, IF(l.owner = r.tk AND l.expires_at > NOW(6), l.fence, NULL), "
      "IF(l.expires_at <= NOW(6) AND l.waiter_until > NOW(6) AND NOT (r.waits = 1 AND l.waiter = {0}), "
      "LEAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), l.waiter_until), {1}), "
      "GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), l.expires_at), 0)), "
      "IF(l.owner = '{2}' OR (l.expires_at > NOW(6) AND l.owner LIKE '{3}%'), l.owner, NULL) "
      "FROM {4} LEFT JOIN {5} l ON l.lock_name = r.nm",
      waiter, micros(kMarkedRowRetry), kSharedMarker, kMarkerPrefix, batch_rows(", $4 AS waits"), table_);
  return {"lockwatch_acquire", "XXNN", {insert, mark, report}};
}

std::vector<SqlStatement> SqlStore::lock_statements() const {
  // Who holds a lock we did not renew or release: taken by another owner,
  // or gone (expired, or never ours), as of `now`.
  const auto undone = [this](std::string_view now) {
    return fmt::format("SELECT r.i, IFNULL(l.owner <> '' AND l.owner <> r.tk AND l.expires_at > {0}, 0) FROM {1} "
                       "LEFT JOIN {2} l ON l.lock_name = r.nm "
                       "WHERE l.lock_name IS NULL OR l.owner <> r.tk OR l.expires_at <= {0}",
                       now, batch_rows(), table_);
  };
  return {
      acquire_statement(),
      // Renew: only our unexpired rows are extended (only our token extends
      // a row); the read after names the others.
      {"lockwatch_renew",
       "XXN",
       {fmt::format("UPDATE {} SET expires_at = NOW(6) + INTERVAL $3 MICROSECOND WHERE lock_name IN ({}) "
                    "AND expires_at > NOW(6) AND (lock_name, owner) IN ({})",
                    table_, kNames, kPairs),
        undone("NOW(6)")}},
      // Release: the rows locked, in name order, then read (naming the
      // outcome) and written (deciding it: only rows still ours are freed)
      // on one reading of the clock, in one transaction.
      {"lockwatch_release",
       "XX",
       {"START TRANSACTION",
        fmt::format("SELECT COUNT(*) INTO @lw_rows FROM {} WHERE lock_name IN ({}) FOR UPDATE", table_, kNames),
        "SET @lw_now = NOW(6)", undone("@lw_now"),
        fmt::format("UPDATE {} SET owner = '', expires_at = NOW(6) WHERE lock_name IN ({}) AND expires_at > @lw_now "
                    "AND (lock_name, owner) IN ({})",
                    table_, kNames, kPairs),
        "COMMIT"}},
  };
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
  for (auto& more : lock_statements()) all.push_back(std::move(more));
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
      {"lockwatch_withdraw",
       "xx",
       {transaction(fmt::format("SELECT COUNT(*) INTO @lw_row FROM {0} WHERE lock_name = $1 FOR UPDATE; "
                                "DELETE FROM {1} WHERE lock_name = $1 AND owner = $2 AND role = 'q'; {2}",
                                table_, holders_, shrink("$1")))}},
  });
  return all;
}

}  // namespace lockwatch::detail
