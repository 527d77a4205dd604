// SqlStore's shared, permit and fair locks: their rows in the companion
// table (see sql_store.hpp). Each decision is one compound statement, a
// transaction that locks the lock's own row before it reads anything, so
// that the callers of one name take turns; its outcome is read from
// session variables by the next statement on the same connection.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "store/sql/sql_error.hpp"
#include "store/sql/sql_literals.hpp"
#include "store/sql/sql_store.hpp"

namespace lockwatch::detail {

using namespace sql;  // the statements' literals (sql_literals.hpp)
using sqlcommon::to_hex;

std::string SqlStore::transaction(const std::string& body) {
  return "BEGIN NOT ATOMIC DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END; START TRANSACTION; " +
         body + " COMMIT; END";
}

std::string SqlStore::shrink(const std::string& name) const {
  return fmt::format(
      "SELECT MAX(expires_at) INTO @lw_last FROM {1} WHERE lock_name = {2} AND role IN ('r', 'p', 'f', 'q') "
      "AND expires_at > NOW(6); "
      "UPDATE {0} SET owner = IF(@lw_last IS NULL, '', owner), expires_at = IFNULL(@lw_last, NOW(6)) "
      "WHERE lock_name = {2} AND owner LIKE '{3}%'; ",
      table_, holders_, name, sql::kMarkerPrefix);
}

// One transaction for the group: each lock's decision in turn (its lock
// row locked first), its outcome kept in a session variable of its own
// (@lw_o<k>), all read by the next statement of the same round trip.
void SqlStore::send_kind_group(AcquireBatchPtr group) {
  std::string body;
  std::string read = "SELECT ";
  for (std::size_t k = 0; k < group->locks.size(); ++k) {
    body += kind_body(group->locks[k]);
    body += fmt::format(
        " SET @lw_o{} = CONCAT_WS(',', IFNULL(@lw_status, ''), IFNULL(@lw_fence, 0), IFNULL(@lw_wait, 0), "
        "IFNULL(@lw_held_as, '')); ",
        k);
    read += fmt::format("{}@lw_o{}", k == 0 ? "" : ", ", k);
  }
  command_connection().run(
      {transaction(body), std::move(read)}, [this, group](const SqlResult& r, const StoreError* err) {
        if (err) {
          if (kind_group_resent(group, *err)) return;
          for (const auto& a : group->locks) {
            Acquired out;
            out.error = *err;
            if (err->code == mariadb_code(1064))
              // A server without MariaDB's compound statements (MySQL): say
              // what is missing rather than only where the syntax broke.
              out.error.message = a.kind.describe() + " locks need MariaDB's compound statements (BEGIN NOT " +
                                  "ATOMIC), which this server does not take: " + err->message;
            a.answer(out);
          }
          return;
        }
        if (r.rows.empty() || r.rows[0].size() != group->locks.size())
          return group->fail(StoreError::unavailable(target_.name(), "the outcome of a lock's transaction was lost "
                                                                     "with its connection"));
        for (std::size_t k = 0; k < group->locks.size(); ++k) {
          std::vector<std::string> fields;
          std::string_view text = r.rows[0][k];
          for (std::size_t at = 0; at <= text.size();) {
            auto comma = std::min(text.find(',', at), text.size());
            fields.emplace_back(text.substr(at, comma - at));
            at = comma + 1;
          }
          group->locks[k].answer(kind_outcome(group->locks[k], fields));
        }
      });
}

// What a shared, permit or fair acquisition does once kind_body()'s common
// part has read the lock (fmt named arguments: m marker, h holders table,
// l lock table, n name, t token, d deadline, cover the lock row's update
// after a grant, o owner name, count permits).

// A reader waits for the writer that holds it, and for a writer's
// mark left since the last writer's grant (the fence it carries).
constexpr std::string_view kSharedAcquireSql =
    "IF @lw_held_as = 'x' THEN "
    "  SET @lw_wait = TIMESTAMPDIFF(MICROSECOND, @lw_now, @lw_expires); "
    "ELSEIF @lw_held_as NOT IN ('', '{m}') THEN "
    "  SET @lw_status = 'invalid'; "
    "ELSEIF @lw_mine = 'r' THEN "
    "  UPDATE {h} SET expires_at = {d} WHERE lock_name = {n} AND owner = {t}; "
    "  UPDATE {l} SET {cover} WHERE lock_name = {n}; "
    "  SET @lw_status = 'taken'; "
    "ELSEIF EXISTS (SELECT 1 FROM {h} WHERE lock_name = {n} AND role = 'w' AND n = @lw_fence) THEN "
    "  SELECT TIMESTAMPDIFF(MICROSECOND, @lw_now, MAX(expires_at)) INTO @lw_wait FROM {h} "
    "  WHERE lock_name = {n} AND role = 'w'; "
    "ELSE "
    "  INSERT INTO {h} (lock_name, owner, role, n, seq, expires_at, owner_name, granted_at) "
    "  VALUES ({n}, {t}, 'r', 0, 0, {d}, {o}, NOW(6)); "
    "  UPDATE {l} SET {cover} WHERE lock_name = {n}; "
    "  SET @lw_status = 'taken'; "
    "END IF;";

// Every grant raises the fence; a retry after a lost answer is the
// same grant, with the fence as it stands.
constexpr std::string_view kPermitsAcquireSql =
    "IF @lw_held_as NOT IN ('', '{m}') THEN "
    "  SET @lw_status = 'invalid'; "
    "ELSEIF @lw_mine = 'p' THEN "
    "  UPDATE {h} SET expires_at = {d} WHERE lock_name = {n} AND owner = {t}; "
    "  UPDATE {l} SET {cover} WHERE lock_name = {n}; "
    "  SET @lw_status = 'taken'; "
    "ELSEIF (SELECT COUNT(*) FROM {h} WHERE lock_name = {n} AND role = 'p') >= {count} THEN "
    "  SELECT TIMESTAMPDIFF(MICROSECOND, @lw_now, MIN(expires_at)) INTO @lw_wait FROM {h} "
    "  WHERE lock_name = {n} AND role = 'p'; "
    "ELSE "
    "  INSERT INTO {h} (lock_name, owner, role, n, seq, expires_at, owner_name, granted_at) "
    "  VALUES ({n}, {t}, 'p', {count}, 0, {d}, {o}, NOW(6)); "
    "  UPDATE {l} SET fence = fence + 1, {cover} WHERE lock_name = {n}; "
    "  SET @lw_fence = @lw_fence + 1, @lw_status = 'taken'; "
    "END IF;";

// The caller takes a place at the end of the queue (the last
// number plus one) or refreshes its own, and is granted only when
// nobody holds the lock and its place is the first. A waiter told
// busy tries again within a third of its ttl, which keeps its place.
constexpr std::string_view kFairAcquireSql =
    "IF @lw_held_as NOT IN ('', '{m}') THEN "
    "  SET @lw_status = 'invalid'; "
    "ELSEIF @lw_mine = 'f' THEN "
    "  UPDATE {h} SET expires_at = {d} WHERE lock_name = {n} AND owner = {t}; "
    "  UPDATE {l} SET {cover} WHERE lock_name = {n}; "
    "  SET @lw_status = 'taken'; "
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
    "    SET @lw_fence = @lw_fence + 1, @lw_status = 'taken'; "
    "  ELSEIF @lw_holder IS NOT NULL THEN "
    "    SET @lw_wait = TIMESTAMPDIFF(MICROSECOND, @lw_now, @lw_holder); "
    "  ELSE "
    "    SELECT TIMESTAMPDIFF(MICROSECOND, @lw_now, expires_at) INTO @lw_wait FROM {h} "
    "    WHERE lock_name = {n} AND role = 'q' ORDER BY seq LIMIT 1; "
    "  END IF; "
    "END IF;";

std::string SqlStore::kind_body(const sqlcommon::PendingAcquire& lock) const {
  const std::string n = hex(lock.name);
  const std::string t = hex(lock.token);
  const std::string m = kinds::marker(lock.kind);
  const std::string deadline = fmt::format("@lw_now + INTERVAL {} MICROSECOND", micros(lock.ttl));
  // The lock row (made when missing) is locked first; then, on the
  // database's clock, the rows whose time ran out are dropped, and the key
  // is found free (''), held exclusively ('x') or held as the marker says.
  // The lock row's expiry always covers its latest holder or waiter.
  std::string body = fmt::format(
      "SET @lw_status = 'busy', @lw_fence = 0, @lw_wait = 0, @lw_held_as = ''; "
      "INSERT INTO {0} (lock_name, owner, fence, expires_at) VALUES ({2}, '', 0, NOW(6)) "
      "ON DUPLICATE KEY UPDATE fence = fence; "
      "SELECT owner, expires_at, fence INTO @lw_owner, @lw_expires, @lw_fence FROM {0} WHERE lock_name = {2} "
      "FOR UPDATE; "
      "SET @lw_now = NOW(6); "
      "DELETE FROM {1} WHERE lock_name = {2} AND expires_at <= @lw_now; "
      "SELECT COUNT(*) INTO @lw_held FROM {1} WHERE lock_name = {2} AND role IN ('r', 'p', 'f', 'q'); "
      "SET @lw_held_as = IF(@lw_expires <= @lw_now OR @lw_owner = '', '', "
      "IF(@lw_owner LIKE '{3}%', IF(@lw_held > 0, @lw_owner, ''), 'x')); "
      "SET @lw_mine = (SELECT role FROM {1} WHERE lock_name = {2} AND owner = {4}); ",
      table_, holders_, n, sql::kMarkerPrefix, t);
  // The lock row after a grant (or a fair waiter's new place): the marker,
  // and an expiry that covers this deadline too.
  const std::string cover = fmt::format(
      "owner = '{}', expires_at = IF(@lw_held_as = '', {}, GREATEST(expires_at, {}))", m, deadline, deadline);
  std::string_view text;
  switch (lock.kind.mode()) {
    case LockKind::Mode::kShared: text = kSharedAcquireSql; break;
    case LockKind::Mode::kPermits: text = kPermitsAcquireSql; break;
    case LockKind::Mode::kFair: text = kFairAcquireSql; break;
    case LockKind::Mode::kExclusive: return body;
  }
  body += fmt::format(fmt::runtime(text), fmt::arg("m", m), fmt::arg("h", holders_), fmt::arg("l", table_),
                      fmt::arg("n", n), fmt::arg("t", t), fmt::arg("d", deadline), fmt::arg("cover", cover),
                      fmt::arg("o", owner_name_), fmt::arg("count", lock.kind.permit_count()));
  return body;
}

// One lock's outcome as the group's read gives it: status, fence, wait
// (µs), what it is held as.
Acquired SqlStore::kind_outcome(const sqlcommon::PendingAcquire& a, const std::vector<std::string>& row) const {
  if (row.size() != 4 || row[0].empty()) {
    // The variables were not set in this session: the connection was made
    // anew between the two statements, and what the transaction decided is
    // not known.
    Acquired out;
    out.error = StoreError::unavailable(target_.name(), "the outcome of a lock's transaction was lost with its "
                                                        "connection");
    return out;
  }
  using sqlcommon::Verdict;
  const Verdict verdict = row[0] == "taken" ? Verdict::kTaken : row[0] == "invalid" ? Verdict::kRefused : Verdict::kBusy;
  return sqlcommon::kind_outcome(a, verdict, static_cast<std::uint64_t>(to_ll(row[1])), to_ll(row[2]),
                                 [&] { return sqlcommon::refusal(target_.name(), a, row[3]); });
}

void SqlStore::renew_kinds(RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl) {
  // One statement extends each holder's own row and its lock row's expiry
  // together (the lock row first, as every transaction takes them); a
  // holder whose time ran out is not extended: its lease is gone. The read
  // after it names which were.
  const RenewalLists lists(batch->locks, members);
  connections_.renew->run(
      {fmt::format("UPDATE {0} l STRAIGHT_JOIN {1} h ON h.lock_name = l.lock_name "
                   "SET h.expires_at = NOW(6) + INTERVAL {2} MICROSECOND, "
                   "l.expires_at = GREATEST(l.expires_at, NOW(6) + INTERVAL {2} MICROSECOND) "
                   "WHERE l.lock_name IN ({3}) AND (h.lock_name, h.owner) IN ({4}) AND h.role IN ('r', 'p', 'f') "
                   "AND h.expires_at > NOW(6)",
                   table_, holders_, micros(ttl), lists.names, lists.pairs),
       fmt::format("SELECT lock_name, owner FROM {} WHERE lock_name IN ({}) AND (lock_name, owner) IN ({}) "
                   "AND role IN ('r', 'p', 'f') AND expires_at > NOW(6)",
                   holders_, lists.names, lists.pairs)},
      [batch, members](const SqlResult& r, const StoreError* err) {
        if (err) return batch->answer(members, Renewed::kTransient, err);
        std::set<std::pair<std::string_view, std::string_view>> live;
        for (const auto& row : r.rows)
          if (row.size() == 2) live.emplace(row[0], row[1]);
        for (std::size_t i : members) {
          const LockRef& l = batch->locks[i];
          batch->done(i, live.count({l.name, l.token}) ? Renewed::kYes : Renewed::kGone, nullptr);
        }
      });
}

void SqlStore::release_kinds(const std::vector<sqlcommon::PendingRelease>& kinds) {
  SqlConnection& conn = command_connection();
  for (const auto& l : kinds)
    conn.execute("lockwatch_release_holder", {to_hex(l.name), to_hex(l.token)},
                 [this, l](const SqlResult& r, const StoreError* err) {
                   if (err) return l.answer(Released::kUnconfirmed, err);
                   if (r.null(0, 0)) {  // a new session: what the transaction did is not known
                     const auto lost = StoreError::unavailable(target_.name(), "the outcome of a release was lost "
                                                                               "with its connection");
                     return l.answer(Released::kUnconfirmed, &lost);
                   }
                   l.answer(to_ll(r.at(0, 0)) > 0 ? Released::kYes : Released::kGone, nullptr);
                 });
}

}  // namespace lockwatch::detail
