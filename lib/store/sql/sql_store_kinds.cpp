// SqlStore's shared, permit and fair locks: their rows in the companion
// table (see sql_store.hpp). Each decision is part of one compound
// statement, a transaction that locks the lock's own row before it reads
// anything, so that the callers of one name take turns; its outcome is
// read from session variables by the next statement on the same
// connection (SqlConnection::execute_all()).
#include <fmt/format.h>

#include "store/sql/sql_literals.hpp"
#include "store/sql/sql_store.hpp"

namespace lockwatch::detail {

using namespace sql;  // the statements' literals (sql_literals.hpp)

std::string SqlStore::shrink(const std::string& name) const {
  return fmt::format(
      "SELECT MAX(expires_at) INTO @lw_last FROM {1} WHERE lock_name = {2} AND role IN ('r', 'p', 'f', 'q') "
      "AND expires_at > NOW(6); "
      "UPDATE {0} SET owner = IF(@lw_last IS NULL, '', owner), expires_at = IFNULL(@lw_last, NOW(6)) "
      "WHERE lock_name = {2} AND owner LIKE '{3}%'; ",
      table_, holders_, name, sql::kMarkerPrefix);
}

// What a shared, permit or fair acquisition does once kind_statements()'
// read of the lock has run (fmt named arguments: m marker, h holders table,
// l lock table, n name, t token, d deadline, cover the lock row's update
// after a grant, again the caller's own grant taken again, o owner name,
// count permits).

// A reader waits for the writer that holds it, and for a writer's
// mark left since the last writer's grant (the fence it carries).
constexpr std::string_view kSharedAcquireSql =
    "IF @lw_held_as = 'x' THEN "
    "  SET @lw_wait = TIMESTAMPDIFF(MICROSECOND, @lw_now, @lw_expires); "
    "ELSEIF @lw_held_as NOT IN ('', {m}) THEN "
    "  SET @lw_status = 'e'; "
    "ELSEIF @lw_mine = 'r' THEN {again}"
    "ELSEIF EXISTS (SELECT 1 FROM {h} WHERE lock_name = {n} AND role = 'w' AND n = @lw_fence) THEN "
    "  SELECT TIMESTAMPDIFF(MICROSECOND, @lw_now, MAX(expires_at)) INTO @lw_wait FROM {h} "
    "  WHERE lock_name = {n} AND role = 'w'; "
    "ELSE "
    "  INSERT INTO {h} (lock_name, owner, role, n, seq, expires_at, owner_name, granted_at) "
    "  VALUES ({n}, {t}, 'r', 0, 0, {d}, {o}, NOW(6)); "
    "  UPDATE {l} SET {cover} WHERE lock_name = {n}; "
    "  SET @lw_status = 't'; "
    "END IF;";

// Every grant raises the fence; a retry after a lost answer is the
// same grant, with the fence as it stands.
constexpr std::string_view kPermitsAcquireSql =
    "IF @lw_held_as NOT IN ('', {m}) THEN "
    "  SET @lw_status = 'e'; "
    "ELSEIF @lw_mine = 'p' THEN {again}"
    "ELSEIF (SELECT COUNT(*) FROM {h} WHERE lock_name = {n} AND role = 'p') >= {count} THEN "
    "  SELECT TIMESTAMPDIFF(MICROSECOND, @lw_now, MIN(expires_at)) INTO @lw_wait FROM {h} "
    "  WHERE lock_name = {n} AND role = 'p'; "
    "ELSE "
    "  INSERT INTO {h} (lock_name, owner, role, n, seq, expires_at, owner_name, granted_at) "
    "  VALUES ({n}, {t}, 'p', {count}, 0, {d}, {o}, NOW(6)); "
    "  UPDATE {l} SET fence = fence + 1, {cover} WHERE lock_name = {n}; "
    "  SET @lw_fence = @lw_fence + 1, @lw_status = 't'; "
    "END IF;";

// The caller takes a place at the end of the queue (the last
// number plus one) or refreshes its own, and is granted only when
// nobody holds the lock and its place is the first. A waiter told
// busy tries again within a third of its ttl, which keeps its place.
constexpr std::string_view kFairAcquireSql =
    "IF @lw_held_as NOT IN ('', {m}) THEN "
    "  SET @lw_status = 'e'; "
    "ELSEIF @lw_mine = 'f' THEN {again}"
    "ELSE "
    "  IF @lw_mine = 'q' THEN "
    "    UPDATE {h} SET expires_at = {d} WHERE lock_name = {n} AND owner = {t}; "
    "  ELSE "
    "    SELECT IFNULL(MAX(seq), 0) + 1 INTO @lw_seq FROM {h} WHERE lock_name = {n}; "
    "    INSERT INTO {h} (lock_name, owner, role, n, seq, expires_at) VALUES ({n}, {t}, 'q', 0, @lw_seq, {d}); "
    "  END IF; "
    "  UPDATE {l} SET {cover} WHERE lock_name = {n}; "
    "  SET @lw_holder = (SELECT MAX(expires_at) FROM {h} WHERE lock_name = {n} AND role = 'f'); "
    "  SET @lw_first = (SELECT owner FROM {h} WHERE lock_name = {n} AND role = 'q' ORDER BY seq LIMIT 1); "
    "  IF @lw_holder IS NULL AND @lw_first = {t} THEN "
    "    UPDATE {h} SET role = 'f', owner_name = {o}, granted_at = NOW(6) WHERE lock_name = {n} AND owner = {t}; "
    "    UPDATE {l} SET fence = fence + 1 WHERE lock_name = {n}; "
    "    SET @lw_fence = @lw_fence + 1, @lw_status = 't'; "
    "  ELSEIF @lw_holder IS NOT NULL THEN "
    "    SET @lw_wait = TIMESTAMPDIFF(MICROSECOND, @lw_now, @lw_holder); "
    "  ELSE "
    "    SELECT TIMESTAMPDIFF(MICROSECOND, @lw_now, expires_at) INTO @lw_wait FROM {h} "
    "    WHERE lock_name = {n} AND role = 'q' ORDER BY seq LIMIT 1; "
    "  END IF; "
    "END IF;";

std::vector<SqlStatement> SqlStore::kind_statements() const {
  // $1 name, $2 token, $3 ttl in µs, $4 the kind's marker, $5 n (0: shared).
  const std::string deadline = "@lw_now + INTERVAL $3 MICROSECOND";
  // The lock row (made when missing) is locked first; then, on the
  // database's clock, the rows whose time ran out are dropped, and the key
  // is found free (''), held exclusively ('x') or held as the marker says.
  // The lock row's expiry always covers its latest holder or waiter.
  const std::string read = fmt::format(
      "SET @lw_status = 'b', @lw_fence = 0, @lw_wait = NULL, @lw_held_as = ''; "
      "INSERT INTO {0} (lock_name, owner, fence, expires_at) VALUES ($1, '', 0, NOW(6)) "
      "ON DUPLICATE KEY UPDATE fence = fence; "
      "SELECT owner, expires_at, fence INTO @lw_owner, @lw_expires, @lw_fence FROM {0} WHERE lock_name = $1 "
      "FOR UPDATE; "
      "SET @lw_now = NOW(6); "
      "DELETE FROM {1} WHERE lock_name = $1 AND expires_at <= @lw_now; "
      "SELECT COUNT(*) INTO @lw_held FROM {1} WHERE lock_name = $1 AND role IN ('r', 'p', 'f', 'q'); "
      "SET @lw_held_as = IF(@lw_expires <= @lw_now OR @lw_owner = '', '', "
      "IF(@lw_owner LIKE '{2}%', IF(@lw_held > 0, @lw_owner, ''), 'x')); "
      "SET @lw_mine = (SELECT role FROM {1} WHERE lock_name = $1 AND owner = $2); ",
      table_, holders_, sql::kMarkerPrefix);
  // The lock row after a grant (or a fair waiter's new place): the marker,
  // and an expiry that covers this deadline too.
  const std::string cover =
      fmt::format("owner = $4, expires_at = IF(@lw_held_as = '', {0}, GREATEST(expires_at, {0}))", deadline);
  // A caller that holds it already (a retry after a lost answer): the same
  // grant, its row and the lock row's expiry extended.
  const std::string again = fmt::format(
      "  UPDATE {0} SET expires_at = {1} WHERE lock_name = $1 AND owner = $2; "
      "  UPDATE {2} SET {3} WHERE lock_name = $1; "
      "  SET @lw_status = 't'; ",
      holders_, deadline, table_, cover);
  const auto decide = [&](std::string_view text) {
    return fmt::format(fmt::runtime(text), fmt::arg("m", "$4"), fmt::arg("h", holders_), fmt::arg("l", table_),
                       fmt::arg("n", "$1"), fmt::arg("t", "$2"), fmt::arg("d", deadline), fmt::arg("cover", cover),
                       fmt::arg("again", again), fmt::arg("o", owner_name_), fmt::arg("count", "$5"));
  };
  const std::vector<std::string> answer{"@lw_status", "@lw_fence", "@lw_wait", "@lw_held_as"};
  return {
      {"lockwatch_lock_rows", "", {""}},  // each decision locks its own row first
      {"lockwatch_acquire_kind",
       "xxnxn",
       {read + "IF $5 = 0 THEN " + decide(kSharedAcquireSql) + " ELSE " + decide(kPermitsAcquireSql) + " END IF;"},
       answer},
      {"lockwatch_acquire_fair", "xxnx", {read + decide(kFairAcquireSql)}, answer},
      // Renew: one statement extends each holder's own row and its lock
      // row's expiry together (the lock row first, as every transaction
      // takes them); a holder whose time ran out is not extended: its lease
      // is gone. The read after it names which were.
      {"lockwatch_renew_kind",
       "XXNX",
       {fmt::format("UPDATE {0} l STRAIGHT_JOIN {1} h ON h.lock_name = l.lock_name "
                    "SET h.expires_at = NOW(6) + INTERVAL $3 MICROSECOND, "
                    "l.expires_at = GREATEST(l.expires_at, NOW(6) + INTERVAL $3 MICROSECOND) "
                    "WHERE l.lock_name IN ({2}) AND (h.lock_name, h.owner) IN ({3}) "
                    "AND h.role IN ('r', 'p', 'f') AND h.expires_at > NOW(6)",
                    table_, holders_, kNames, kPairs),
        fmt::format("SELECT r.i, 0 FROM {} WHERE NOT EXISTS (SELECT 1 FROM {} h WHERE h.lock_name = r.nm "
                    "AND h.owner = r.tk AND h.role IN ('r', 'p', 'f') AND h.expires_at > NOW(6))",
                    batch_rows(), holders_)}},
      // Release: in one transaction, each holder leaves in name order, its
      // lock's row locked first: its row goes, and the lock row's expiry
      // shrinks to the latest holder left, or the row is freed with the
      // last (a writer may take it then). Answers those that held nothing.
      {"lockwatch_release_kind",
       "XX",
       {transaction(fmt::format(
            "$[ |SELECT COUNT(*) INTO @lw_row FROM {0} WHERE lock_name = $1 FOR UPDATE; "
            "DELETE FROM {1} WHERE lock_name = $1 AND owner = $2 AND role IN ('r', 'p', 'f') AND expires_at > NOW(6); "
            "SET @lw_released$0 = ROW_COUNT(); "
            "DELETE FROM {1} WHERE lock_name = $1 AND owner = $2 AND role IN ('r', 'p', 'f'); {2}$]",
            table_, holders_, shrink("$1"))),
        "SELECT i, 0 FROM ($[ UNION ALL |SELECT $0 AS i, @lw_released$0 AS released$]) r WHERE released = 0"}},
  };
}

}  // namespace lockwatch::detail
