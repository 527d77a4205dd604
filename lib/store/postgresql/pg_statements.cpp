#include "store/postgresql/pg_statements.hpp"

#include <fmt/format.h>

#include "store/sqlcommon/sql_recipe.hpp"

namespace lockwatch::detail {

namespace {

// Shared, permit and fair locks (see pg_store.hpp). A lock row held by
// them holds a marker instead of an owner token, expiring with the latest
// holder, so that the exclusive statements find it busy as they are.
constexpr std::string_view kPgSharedMarker = "'lockwatch:shared'::bytea";
// A writer's mark outlives its last attempt by this long at most (µs).
constexpr long long kWriterMarkUs = kinds::kWriterMark.count() * 1000;
// A holder's grant time in µs since the epoch, and how long ago that was
// on the server's clock (NULL where none was recorded).
constexpr std::string_view kGrantedUs = "(extract(epoch FROM granted_at) * 1000000)::int8";
constexpr std::string_view kHeldUs = "greatest((extract(epoch FROM clock_timestamp() - granted_at) * 1000000)::int8, 0)";

// Whether the bytea `column` is a marker: no owner token starts so.
std::string is_marker(std::string_view column) {
  return fmt::format("substr({}, 1, 10) = 'lockwatch:'::bytea", column);
}

// Microseconds from now to `at` (a timestamptz expression), at least 0.
std::string remaining(std::string_view at, std::string_view now = "clock_timestamp()") {
  return fmt::format("greatest(ceil(extract(epoch FROM {} - {}) * 1000000), 0)::int8", at, now);
}

// What every kind's decision starts from, read after the lock row was
// locked: one clock reading (c.now), the lock row (l, with whether it is
// held now) and its name, token and marker. $1 name, $2 token, $3 ttl in
// µs, $4 the kind's marker, all but the ttl in hex.
std::string kind_context(const std::string& t) {
  return fmt::format(
      "c AS (SELECT clock_timestamp() AS now, decode($1::text, 'hex') AS name, decode($2::text, 'hex') AS token, "
      "$3::int8 * interval '1 microsecond' AS ttl, decode($4::text, 'hex') AS marker), "
      "l AS (SELECT t.owner, t.fence, t.expires_at, t.owner <> '' AND t.expires_at > c.now AS live "
      "FROM {} t, c WHERE t.lock_name = c.name)",
      t);
}

// Rows of the name no one holds any more, deleted: any whose time ran
// out, and holders' rows while the lock row holds no marker now (an
// exclusive holder took it, or it is free). Never the caller's own row,
// which the statement writes.
std::string prune(const std::string& h) {
  return fmt::format("p AS (DELETE FROM {} x USING c, l WHERE x.lock_name = c.name AND x.owner <> c.token "
                     "AND (x.expires_at <= c.now OR (x.role IN ('s', 'p', 'f') AND NOT (l.live AND {}))))",
                     h, is_marker("l.owner"));
}

// A share ($5 = 0) or a permit of $5. Refused (e) while held by the
// other family or another n; busy (b) behind a writer (its remaining
// ttl), a live writer's mark (a reader), or n live holders (a permit:
// until the soonest one's deadline); taken (t), or taken again (r: the
// caller's token holds it already, a retry). A grant writes the holder's
// row and the lock row: the marker, an expiry covering every holder, and
// the fence raised for a permit (a reader is answered the last writer's).
// Answers one row: verdict, fence, busy µs, the lock row's owner (hex).
std::string acquire_kind_sql(const std::string& t, const std::string& h, const std::string& o) {
  return fmt::format(
      "WITH {2}, "
      "k AS (SELECT x.owner, x.expires_at FROM {1} x, c, l WHERE x.lock_name = c.name "
      "AND x.role IN ('s', 'p', 'f') AND x.expires_at > c.now AND l.live AND l.owner = c.marker), "
      "m AS (SELECT max(x.expires_at) AS until FROM {1} x, c WHERE x.lock_name = c.name AND x.role = 'w' "
      "AND x.expires_at > c.now), "
      "d AS (SELECT CASE "
      "WHEN l.live AND l.owner <> c.marker AND ($5::int8 > 0 OR {3}) THEN 'e' "
      "WHEN l.live AND l.owner <> c.marker THEN 'b' "
      "WHEN EXISTS (SELECT 1 FROM k WHERE k.owner = c.token) THEN 'r' "
      "WHEN $5::int8 = 0 AND (SELECT until FROM m) IS NOT NULL THEN 'b' "
      "WHEN $5::int8 > 0 AND (SELECT count(*) FROM k) >= $5::int8 THEN 'b' "
      "ELSE 't' END AS verdict FROM c, l), "
      "g AS (INSERT INTO {1} (lock_name, owner, role, expires_at, owner_name, granted_at) "
      "SELECT c.name, c.token, CASE WHEN $5::int8 = 0 THEN 's' ELSE 'p' END, c.now + c.ttl, {8}, c.now FROM c, d "
      "WHERE d.verdict IN ('t', 'r') "
      "ON CONFLICT (lock_name, owner) DO UPDATE SET role = excluded.role, expires_at = excluded.expires_at), "
      "u AS (UPDATE {0} t SET owner = c.marker, "
      "fence = CASE WHEN d.verdict = 't' AND $5::int8 > 0 THEN t.fence + 1 ELSE t.fence END, "
      "expires_at = CASE WHEN l.live THEN greatest(t.expires_at, c.now + c.ttl) ELSE c.now + c.ttl END "
      "FROM c, d, l WHERE t.lock_name = c.name AND d.verdict IN ('t', 'r')), "
      "{4} "
      "SELECT d.verdict, CASE WHEN d.verdict = 't' AND $5::int8 > 0 THEN l.fence + 1 ELSE l.fence END, "
      "CASE WHEN d.verdict <> 'b' THEN NULL "
      "WHEN l.live AND l.owner <> c.marker THEN {5} "
      "WHEN $5::int8 = 0 THEN {6} "
      "ELSE {7} END, encode(l.owner, 'hex') FROM c, d, l",
      t, h, kind_context(t), is_marker("l.owner"), prune(h), remaining("l.expires_at", "c.now"),
      remaining("(SELECT until FROM m)", "c.now"), remaining("(SELECT min(expires_at) FROM k)", "c.now"), o);
}

// A fair lock ($4 its marker): refused (e) while held as another kind;
// taken again (r) by its holder; taken (t) by the first live waiter (or
// a caller with nobody queued) while no one holds it; else busy (b): the
// caller keeps its place, or takes the next one, for a ttl from now. A
// grant makes the caller's row the holder's ('f') and raises the fence.
// Busy answers the holder's remaining ttl, or with the lock free the
// first waiter's place; when waiters whose place ran out were dropped
// and the lock is free, the new first is woken ($5: the channel).
// Answers one row: verdict, fence, busy µs, the lock row's owner (hex),
// and the notice's (ignored) result.
std::string acquire_fair_sql(const std::string& t, const std::string& h, const std::string& o) {
  return fmt::format(
      "WITH {2}, "
      "k AS (SELECT x.owner, x.expires_at FROM {1} x, c, l WHERE x.lock_name = c.name AND x.role = 'f' "
      "AND x.expires_at > c.now AND l.live AND l.owner = c.marker), "
      "q AS (SELECT x.owner, x.seq, x.expires_at FROM {1} x, c WHERE x.lock_name = c.name AND x.role = 'q' "
      "AND x.expires_at > c.now), "
      "f AS (SELECT owner, expires_at FROM q ORDER BY seq LIMIT 1), "
      "d AS (SELECT CASE "
      "WHEN l.live AND l.owner <> c.marker THEN 'e' "
      "WHEN EXISTS (SELECT 1 FROM k WHERE k.owner = c.token) THEN 'r' "
      "WHEN NOT EXISTS (SELECT 1 FROM k) AND coalesce((SELECT owner FROM f), c.token) = c.token THEN 't' "
      "ELSE 'b' END AS verdict, "
      "EXISTS (SELECT 1 FROM {1} x WHERE x.lock_name = c.name AND x.role = 'q' AND x.expires_at <= c.now) "
      "AS dropped FROM c, l), "
      "g AS (INSERT INTO {1} AS hx (lock_name, owner, role, seq, expires_at, owner_name, granted_at) "
      "SELECT c.name, c.token, CASE WHEN d.verdict = 'b' THEN 'q' ELSE 'f' END, "
      "CASE WHEN d.verdict = 'b' THEN coalesce((SELECT seq FROM q WHERE q.owner = c.token), "
      "(SELECT max(seq) FROM q) + 1, 1) ELSE 0 END, c.now + c.ttl, {5}, c.now FROM c, d WHERE d.verdict <> 'e' "
      "ON CONFLICT (lock_name, owner) DO UPDATE SET role = excluded.role, seq = excluded.seq, "
      "expires_at = excluded.expires_at, granted_at = CASE WHEN excluded.role = 'f' AND hx.role <> 'f' "
      "THEN excluded.granted_at ELSE hx.granted_at END), "
      "u AS (UPDATE {0} t SET owner = c.marker, "
      "fence = CASE WHEN d.verdict = 't' THEN t.fence + 1 ELSE t.fence END, expires_at = c.now + c.ttl "
      "FROM c, d WHERE t.lock_name = c.name AND d.verdict IN ('t', 'r')), "
      "{3} "
      "SELECT d.verdict, CASE WHEN d.verdict = 't' THEN l.fence + 1 ELSE l.fence END, "
      "CASE WHEN d.verdict = 'b' THEN {4} END, encode(l.owner, 'hex'), "
      "CASE WHEN d.verdict = 'b' AND d.dropped AND NOT EXISTS (SELECT 1 FROM k) "
      "THEN pg_notify($5::text, $1::text) END FROM c, d, l",
      t, h, kind_context(t), prune(h),
      remaining("coalesce((SELECT max(expires_at) FROM k), (SELECT expires_at FROM f))", "c.now"), o);
}

// Renews shares, permits and fair holders (one statement for all those
// due in a tick, after their lock rows are locked): a holder's row not
// past its deadline, under a lock row that holds its marker, gets a new
// deadline, and the lock row's expiry is raised to cover it. Answers the
// pairs it did not renew, and whether the lock is held otherwise now.
// $1 names, $2 tokens, $3 ttls in µs, $4 markers (hex).
std::string renew_kind_sql(const std::string& t, const std::string& h) {
  return fmt::format(
      "WITH c AS (SELECT clock_timestamp() AS now), "
      "r AS (SELECT decode(n, 'hex') AS lock_name, decode(o, 'hex') AS owner, u AS ttl_us, "
      "decode(m, 'hex') AS marker, i FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[]) "
      "WITH ORDINALITY AS x(n, o, u, m, i)), "
      "u AS (UPDATE {1} x SET expires_at = c.now + r.ttl_us * interval '1 microsecond' FROM r, c, {0} t "
      "WHERE (x.lock_name, x.owner) = (r.lock_name, r.owner) AND x.role IN ('s', 'p', 'f') "
      "AND x.expires_at > c.now AND t.lock_name = r.lock_name AND t.owner = r.marker AND t.expires_at > c.now "
      "RETURNING r.i, x.lock_name, x.expires_at), "
      "e AS (UPDATE {0} t SET expires_at = greatest(t.expires_at, m.last) "
      "FROM (SELECT lock_name, max(expires_at) AS last FROM u GROUP BY lock_name) m "
      "WHERE t.lock_name = m.lock_name) "
      "SELECT r.i, coalesce((SELECT t.owner <> '' AND t.owner <> r.marker AND t.expires_at > c.now FROM {0} t "
      "WHERE t.lock_name = r.lock_name), false) FROM r, c WHERE r.i NOT IN (SELECT i FROM u)",
      t, h);
}

// Releases shares, permits and fair holders (after their lock rows are
// locked): each holder's row goes; the lock row's expiry shrinks to the
// latest remaining holder's deadline, or with the last one the row is
// free. With $4, a permit's or a fair holder's release notifies (a
// waiter may take it), a reader's only when it was the last (a writer
// waits for that). Answers the pairs it did not release (as
// lockwatch_release). $1 names, $2 tokens, $3 markers (hex), $5 the
// channel.
std::string release_kind_sql(const std::string& t, const std::string& h) {
  return fmt::format(
      "WITH c AS (SELECT clock_timestamp() AS now), "
      "r AS (SELECT decode(n, 'hex') AS lock_name, decode(o, 'hex') AS owner, decode(m, 'hex') AS marker, i "
      "FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS x(n, o, m, i)), "
      "ok AS (SELECT r.* FROM r, c, {0} t WHERE t.lock_name = r.lock_name AND t.owner = r.marker "
      "AND t.expires_at > c.now), "
      "g AS (DELETE FROM {1} x USING ok, c WHERE (x.lock_name, x.owner) = (ok.lock_name, ok.owner) "
      "AND x.role IN ('s', 'p', 'f') RETURNING ok.i, x.expires_at > c.now AS live), "
      "rest AS (SELECT x.lock_name, max(x.expires_at) AS last FROM {1} x, c "
      "WHERE x.lock_name IN (SELECT lock_name FROM ok) AND x.role IN ('s', 'p', 'f') AND x.expires_at > c.now "
      "AND (x.lock_name, x.owner) NOT IN (SELECT lock_name, owner FROM ok) GROUP BY x.lock_name), "
      "s AS (UPDATE {0} t SET owner = CASE WHEN rest.last IS NULL THEN ''::bytea ELSE t.owner END, "
      "expires_at = coalesce(rest.last, c.now) "
      "FROM c, (SELECT DISTINCT lock_name, marker FROM ok) o LEFT JOIN rest ON rest.lock_name = o.lock_name "
      "WHERE t.lock_name = o.lock_name "
      "RETURNING CASE WHEN $4::bool AND (rest.last IS NULL OR o.marker <> {2}) "
      "THEN pg_notify($5::text, encode(t.lock_name, 'hex')) END) "
      "SELECT r.i, coalesce((SELECT t.owner <> '' AND t.owner <> r.marker AND t.expires_at > c.now FROM {0} t "
      "WHERE t.lock_name = r.lock_name), false) FROM r, c WHERE r.i NOT IN (SELECT i FROM g WHERE live)",
      t, h, kPgSharedMarker);
}

// The exclusive locks' statements (statements() below).
std::vector<PgStatement> pg_lock_statements(const std::string& t, const std::string& h, const std::string& o) {
  const std::string batch =
      "r AS (SELECT decode(n, 'hex') AS lock_name, decode(o, 'hex') AS owner, u AS ttl_us, i "
      "FROM unnest($1::text[], $2::text[], $3::int8[]) WITH ORDINALITY AS x(n, o, u, i))";
  // Who holds a row we did not get, from the statement's snapshot: it
  // names the outcome and decides nothing.
  const std::string other_holds = fmt::format(
      "coalesce((SELECT h.owner <> '' AND h.owner <> r.owner AND h.expires_at > clock_timestamp() FROM {} h "
      "WHERE h.lock_name = r.lock_name), false)",
      t);
  return {
      // The first doubles as the table check (pg_connection.hpp). A free
      // or expired row becomes ours with its fence raised; our own row
      // (the same token: a repeated request) keeps its fence and gets the
      // new ttl; another owner's live row is left alone. Rows are taken
      // in name order, so that batches cannot deadlock each other.
      // An exclusive acquisition also reads (from the snapshot, deciding
      // nothing) whether a busy row holds a kind's marker: a shared one
      // gets the writer's mark (readers stay out while it lives), the
      // others are refused by the caller. A grant deletes the writer's
      // own mark. Both touch a holders' row only after the name's lock
      // row is locked (the mark needs all of w first), as the kinds'
      // transactions do, so that they cannot deadlock each other.
      {"lockwatch_acquire", "XXNN",
       {fmt::format("WITH {1}, w AS (INSERT INTO {0} AS l (lock_name, owner, fence, expires_at, owner_name, granted_at) "
                    "SELECT lock_name, owner, 1, clock_timestamp() + ttl_us * interval '1 microsecond', {7}, "
                    "clock_timestamp() FROM r ORDER BY lock_name "
                    "ON CONFLICT (lock_name) DO UPDATE SET "
                    "fence = CASE WHEN l.expires_at <= clock_timestamp() THEN l.fence + 1 ELSE l.fence END, "
                    "owner = excluded.owner, expires_at = excluded.expires_at, owner_name = excluded.owner_name, "
                    "granted_at = CASE WHEN l.expires_at <= clock_timestamp() THEN excluded.granted_at "
                    "ELSE l.granted_at END "
                    "WHERE l.expires_at <= clock_timestamp() OR l.owner = excluded.owner "
                    "RETURNING l.lock_name, l.fence), "
                    "x AS (DELETE FROM {3} m USING r WHERE m.lock_name = r.lock_name AND m.owner = r.owner "
                    "AND m.role = 'w' AND r.lock_name IN (SELECT lock_name FROM w)), "
                    "k AS (INSERT INTO {3} (lock_name, owner, role, expires_at) "
                    "SELECT r.lock_name, r.owner, 'w', clock_timestamp() + least(r.ttl_us, {4}) * interval "
                    "'1 microsecond' FROM r, LATERAL (SELECT 1 FROM {0} s WHERE s.lock_name = r.lock_name "
                    "AND s.owner = {5} AND s.expires_at > clock_timestamp()) s "
                    "WHERE r.lock_name NOT IN (SELECT lock_name FROM w) "
                    "ON CONFLICT (lock_name, owner) DO UPDATE SET expires_at = excluded.expires_at) "
                    "SELECT r.i, w.fence, b.left_us, b.marker FROM r LEFT JOIN w ON w.lock_name = r.lock_name "
                    "LEFT JOIN LATERAL (SELECT {2} AS left_us, "
                    "CASE WHEN {6} AND h.expires_at > clock_timestamp() THEN encode(h.owner, 'hex') END AS marker "
                    "FROM {0} h WHERE h.lock_name = r.lock_name AND w.fence IS NULL) b ON true",
                    t, batch, remaining("h.expires_at"), h, kWriterMarkUs,
                    kPgSharedMarker, is_marker("h.owner"), o)}},  // $4 (whether each waits) is MariaDB's
      // Answers the pairs it did not renew: taken by another owner, or gone.
      {"lockwatch_renew", "XXN",
       {fmt::format("WITH {1}, u AS (UPDATE {0} AS l SET expires_at = clock_timestamp() + r.ttl_us * interval "
                    "'1 microsecond' FROM r WHERE (l.lock_name, l.owner) = (r.lock_name, r.owner) "
                    "AND l.expires_at > clock_timestamp() RETURNING r.i) "
                    "SELECT r.i, {2} FROM r WHERE r.i NOT IN (SELECT i FROM u)",
                    t, batch, other_holds)}},
      // $3: notify; $4: the channel. Answers the pairs it did not release.
      {"lockwatch_release", "XXbx",
       {fmt::format("WITH r AS (SELECT decode(n, 'hex') AS lock_name, decode(o, 'hex') AS owner, i "
                    "FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(n, o, i)), "
                    "u AS (UPDATE {0} AS l SET owner = '', expires_at = clock_timestamp() FROM r "
                    "WHERE (l.lock_name, l.owner) = (r.lock_name, r.owner) AND l.expires_at > clock_timestamp() "
                    "RETURNING r.i, CASE WHEN $3::bool THEN pg_notify($4::text, encode(l.lock_name, 'hex')) END) "
                    "SELECT r.i, {1} FROM r WHERE r.i NOT IN (SELECT i FROM u)",
                    t, other_holds)}},
      {"lockwatch_raise_fence", "xn",
       {fmt::format("INSERT INTO {0} AS l (lock_name, owner, fence, expires_at) "
                    "VALUES (decode($1::text, 'hex'), '', $2::int8, clock_timestamp()) "
                    "ON CONFLICT (lock_name) DO UPDATE SET fence = greatest(l.fence, excluded.fence)",
                    t)}},
  };
}

// The clock, the scheduled jobs' claims and the operators' statements
// (statements() below).
std::vector<PgStatement> pg_operator_statements(const std::string& t, const std::string& h) {
  constexpr std::string_view lock_rows =
      "INSERT INTO {0} AS l (lock_name, owner, fence, expires_at) "
      "SELECT n, '', 0, clock_timestamp() FROM (SELECT DISTINCT decode(x, 'hex') AS n "
      "FROM unnest({1}) AS x) d ORDER BY n ON CONFLICT (lock_name) DO UPDATE SET fence = l.fence WHERE false";
  return {
      {"lockwatch_time", "", {"SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8"}},
      // One conditional write; the select after it, in the same
      // statement, reads the clock and, when the write did nothing, why.
      {"lockwatch_claim", "xxnn",
       {fmt::format("WITH c AS (UPDATE {0} SET last_period = $3::int8 WHERE lock_name = decode($1::text, 'hex') "
                    "AND owner = decode($2::text, 'hex') AND expires_at > clock_timestamp() "
                    "AND clock_timestamp() >= timestamptz 'epoch' + $4::int8 * interval '1 microsecond' "
                    "AND (last_period IS NULL OR last_period < $3::int8) RETURNING 1) "
                    "SELECT (SELECT count(*) FROM c), (extract(epoch FROM clock_timestamp()) * 1000000)::int8, "
                    "h.owner = decode($2::text, 'hex') AND h.expires_at > clock_timestamp(), "
                    "clock_timestamp() >= timestamptz 'epoch' + $4::int8 * interval '1 microsecond', h.last_period "
                    "FROM (SELECT 1) AS one LEFT JOIN {0} h ON h.lock_name = decode($1::text, 'hex')",
                    t)}},
      {"lockwatch_inspect", "x",
       {fmt::format("SELECT {1}, fence, encode(owner, 'hex'), encode(owner_name, 'hex'), {2}, {3} FROM {0} "
                    "WHERE lock_name = decode($1::text, 'hex')",
                    t, remaining("expires_at"), kGrantedUs, kHeldUs)}},
      // The live shared, permit or fair holders of a name, first granted first.
      {"lockwatch_holders", "x",
       {fmt::format("SELECT encode(owner, 'hex'), encode(owner_name, 'hex'), {2}, {3} FROM {1} "
                    "WHERE lock_name = decode($1::text, 'hex') AND role IN ('s', 'p', 'f') "
                    "AND expires_at > clock_timestamp() ORDER BY granted_at",
                    t, h, kGrantedUs, kHeldUs)}},
      // The names under a prefix ($1: a LIKE pattern, hex) whose row is held, in order; at most $2.
      {"lockwatch_list", "xn",
       {fmt::format("SELECT encode(lock_name, 'hex') FROM {0} WHERE lock_name LIKE decode($1::text, 'hex') "
                    "AND owner <> '' AND expires_at > clock_timestamp() ORDER BY lock_name LIMIT $2::int8",
                    t)}},
      // The rest run in transactions after lockwatch_lock_rows (of $1's
      // names) or lockwatch_lock_row (of the name $1), which make the lock
      // rows if missing and lock them (ON CONFLICT locks a row even where
      // its WHERE does not update it), in name order: every change to a
      // name's holders is made by one transaction at a time, which reads
      // them afresh (a statement of its own, so a snapshot taken after the
      // lock). PgStatement::first names which.
      {"lockwatch_lock_rows", "X", {fmt::format(fmt::runtime(lock_rows), t, "$1::text[]")}},
      {"lockwatch_lock_row", "x", {fmt::format(fmt::runtime(lock_rows), t, "ARRAY[$1::text]")}},
      {"lockwatch_force_release", "xx",
       {fmt::format("WITH d AS (DELETE FROM {1} WHERE lock_name = decode($1::text, 'hex') AND role <> 'q') "
                    "UPDATE {0} SET owner = '', expires_at = clock_timestamp() WHERE lock_name = decode($1::text, "
                    "'hex') AND owner <> '' AND expires_at > clock_timestamp() "
                    "RETURNING pg_notify($2::text, encode(lock_name, 'hex'))",
                    t, h)}, {}, "lockwatch_lock_row"},
  };
}

// The shared, permit and fair locks' statements (statements() below).
std::vector<PgStatement> pg_kind_statements(const std::string& t, const std::string& h, const std::string& o) {
  return {
      {"lockwatch_acquire_kind", "xxnxn", {acquire_kind_sql(t, h, o)}},
      {"lockwatch_acquire_fair", "xxnxx", {acquire_fair_sql(t, h, o)}},
      {"lockwatch_withdraw", "xxx",
       {fmt::format("WITH c AS (SELECT clock_timestamp() AS now, decode($1::text, 'hex') AS name, "
                    "decode($2::text, 'hex') AS token), "
                    "l AS (SELECT t.owner <> '' AND t.expires_at > c.now AS live FROM {0} t, c "
                    "WHERE t.lock_name = c.name), "
                    "q AS (SELECT h.owner, h.seq FROM {1} h, c WHERE h.lock_name = c.name AND h.role = 'q' "
                    "AND h.expires_at > c.now), "
                    "g AS (DELETE FROM {1} h USING c WHERE h.lock_name = c.name AND h.owner = c.token "
                    "AND h.role = 'q' RETURNING 1) "
                    "SELECT (SELECT count(*) FROM g), CASE WHEN EXISTS (SELECT 1 FROM g) "
                    "AND NOT coalesce((SELECT live FROM l), false) "
                    "AND (SELECT owner FROM q ORDER BY seq LIMIT 1) = c.token AND (SELECT count(*) FROM q) > 1 "
                    "THEN pg_notify($3::text, $1::text) END FROM c",
                    t, h)}, {}, "lockwatch_lock_row"},
      {"lockwatch_renew_kind", "XXNX", {renew_kind_sql(t, h)}, {}, "lockwatch_lock_rows"},
      {"lockwatch_release_kind", "XXXbx", {release_kind_sql(t, h)}, {}, "lockwatch_lock_rows"},
  };
}

}  // namespace

std::vector<PgStatement> pg_statements(const std::string& t, const std::string& h, const std::string& o) {
  auto all = pg_lock_statements(t, h, o);  // first: its first doubles as the table check
  for (auto& more : {pg_operator_statements(t, h), pg_kind_statements(t, h, o)})
    all.insert(all.end(), more.begin(), more.end());
  return all;
}

}  // namespace lockwatch::detail
