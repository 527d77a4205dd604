#include "store/postgresql/pg_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "core/loop.hpp"
#include "lockwatch/errors.hpp"
#include "store/kind_rules.hpp"
#include "store/postgresql/pg_error.hpp"
#include "store/sqlcommon/batching.hpp"
#include "store/sqlcommon/claims.hpp"
#include "store/sqlcommon/inspection.hpp"
#include "store/sqlcommon/values.hpp"

namespace lockwatch::detail {

namespace {

// Parameter types (pg_type OIDs).
constexpr unsigned kText = 25, kInt8 = 20, kBool = 16, kTextArray = 1009, kInt8Array = 1016;

// Names and tokens travel as hex text and are decoded by the server
// (sqlcommon/values.hpp).
using sqlcommon::from_micros;
using sqlcommon::micros;
using sqlcommon::to_hex;
using sqlcommon::to_ll;
using sqlcommon::to_micros;
using sqlcommon::unhex;

// A text[] literal of hex strings: {"6b31","6b32"}.
template <class Get>
std::string hex_array(std::size_t n, Get get) {
  std::string out = "{";
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += ',';
    out += '"';
    sqlcommon::append_hex(out, get(i));
    out += '"';
  }
  out += '}';
  return out;
}

// An int8[] literal.
template <class Get>
std::string int_array(std::size_t n, Get get) {
  std::string out = "{";
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += ',';
    out += std::to_string(get(i));
  }
  out += '}';
  return out;
}

// A batch's arrays: the names and tokens of the `n` locks lock(0)..,
// then their ttls in µs (when the locks have one) and (with `markers`)
// their kinds' markers.
template <class Lock>
std::vector<std::string> lock_arrays(std::size_t n, Lock lock, bool markers = false) {
  std::vector<std::string> out{hex_array(n, [&](std::size_t i) -> std::string_view { return lock(i).name; }),
                               hex_array(n, [&](std::size_t i) -> std::string_view { return lock(i).token; })};
  if constexpr (requires { lock(0).ttl; })
    out.push_back(int_array(n, [&](std::size_t i) { return micros(lock(i).ttl); }));
  if (markers) out.push_back(hex_array(n, [&](std::size_t i) { return kinds::marker(lock(i).kind); }));
  return out;
}

// Each of `n` locks' status: `yes`, but those an answer names (its
// 1-based position, whether another owner holds it): `taken` or `gone`.
template <class Status>
std::vector<Status> not_done(const PgRows& rows, std::size_t n, Status yes, Status taken, Status gone) {
  std::vector<Status> status(n, yes);
  for (int r = 0; r < rows.size(); ++r) {
    long long k = to_ll(rows.at(r, 0)) - 1;
    if (k < 0 || k >= static_cast<long long>(n)) continue;
    status[k] = rows.at(r, 1) == "t" ? taken : gone;
  }
  return status;
}

// Runs `call` on `conn` in one transaction after the lock rows of
// `names` (a text[] of hex names) are locked, as every change to a
// name's holders.
void after_lock_rows(PgConnection& conn, std::string names, PgCall call, PgDone done) {
  std::vector<PgCall> calls;
  calls.push_back({"lockwatch_lock_rows", {std::move(names)}});
  calls.push_back(std::move(call));
  conn.execute_all(std::move(calls), std::move(done));
}

using sqlcommon::ms_up;

// Shared, permit and fair locks (see pg_store.hpp). A lock row held by
// them holds a marker instead of an owner token, expiring with the latest
// holder, so that the exclusive statements find it busy as they are.
constexpr std::string_view kPgSharedMarker = "'lockwatch:shared'::bytea";
// A writer's mark outlives its last attempt by this long at most (µs).
constexpr long long kWriterMarkUs = sqlcommon::kWriterMark.count() * 1000;
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
      {"lockwatch_acquire",
       fmt::format("WITH {1}, w AS (INSERT INTO {0} AS l (lock_name, owner, fence, expires_at, owner_name, granted_at) "
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
                   kPgSharedMarker, is_marker("h.owner"), o),
       {kTextArray, kTextArray, kInt8Array}},
      // Answers the pairs it did not renew: taken by another owner, or gone.
      {"lockwatch_renew",
       fmt::format("WITH {1}, u AS (UPDATE {0} AS l SET expires_at = clock_timestamp() + r.ttl_us * interval "
                   "'1 microsecond' FROM r WHERE (l.lock_name, l.owner) = (r.lock_name, r.owner) "
                   "AND l.expires_at > clock_timestamp() RETURNING r.i) "
                   "SELECT r.i, {2} FROM r WHERE r.i NOT IN (SELECT i FROM u)",
                   t, batch, other_holds),
       {kTextArray, kTextArray, kInt8Array}},
      // $3: notify; $4: the channel. Answers the pairs it did not release.
      {"lockwatch_release",
       fmt::format("WITH r AS (SELECT decode(n, 'hex') AS lock_name, decode(o, 'hex') AS owner, i "
                   "FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(n, o, i)), "
                   "u AS (UPDATE {0} AS l SET owner = '', expires_at = clock_timestamp() FROM r "
                   "WHERE (l.lock_name, l.owner) = (r.lock_name, r.owner) AND l.expires_at > clock_timestamp() "
                   "RETURNING r.i, CASE WHEN $3::bool THEN pg_notify($4::text, encode(l.lock_name, 'hex')) END) "
                   "SELECT r.i, {1} FROM r WHERE r.i NOT IN (SELECT i FROM u)",
                   t, other_holds),
       {kTextArray, kTextArray, kBool, kText}},
      {"lockwatch_raise_fence",
       fmt::format("INSERT INTO {0} AS l (lock_name, owner, fence, expires_at) "
                   "VALUES (decode($1::text, 'hex'), '', $2::int8, clock_timestamp()) "
                   "ON CONFLICT (lock_name) DO UPDATE SET fence = greatest(l.fence, excluded.fence)",
                   t),
       {kText, kInt8}},
  };
}

// The clock, the scheduled jobs' claims and the operators' statements
// (statements() below).
std::vector<PgStatement> pg_operator_statements(const std::string& t, const std::string& h) {
  return {
      {"lockwatch_time", "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8", {}},
      // One conditional write; the select after it, in the same
      // statement, reads the clock and, when the write did nothing, why.
      {"lockwatch_claim",
       fmt::format("WITH c AS (UPDATE {0} SET last_period = $3::int8 WHERE lock_name = decode($1::text, 'hex') "
                   "AND owner = decode($2::text, 'hex') AND expires_at > clock_timestamp() "
                   "AND clock_timestamp() >= timestamptz 'epoch' + $4::int8 * interval '1 microsecond' "
                   "AND (last_period IS NULL OR last_period < $3::int8) RETURNING 1) "
                   "SELECT (SELECT count(*) FROM c), (extract(epoch FROM clock_timestamp()) * 1000000)::int8, "
                   "h.owner = decode($2::text, 'hex') AND h.expires_at > clock_timestamp(), "
                   "clock_timestamp() >= timestamptz 'epoch' + $4::int8 * interval '1 microsecond', h.last_period "
                   "FROM (SELECT 1) AS one LEFT JOIN {0} h ON h.lock_name = decode($1::text, 'hex')",
                   t),
       {kText, kText, kInt8, kInt8}},
      {"lockwatch_inspect",
       fmt::format("SELECT {1}, fence, encode(owner, 'hex'), encode(owner_name, 'hex'), {2}, {3} FROM {0} "
                   "WHERE lock_name = decode($1::text, 'hex')",
                   t, remaining("expires_at"), kGrantedUs, kHeldUs),
       {kText}},
      // The live shared, permit or fair holders of a name, first granted first.
      {"lockwatch_holders",
       fmt::format("SELECT encode(owner, 'hex'), encode(owner_name, 'hex'), {2}, {3} FROM {1} "
                   "WHERE lock_name = decode($1::text, 'hex') AND role IN ('s', 'p', 'f') "
                   "AND expires_at > clock_timestamp() ORDER BY granted_at",
                   t, h, kGrantedUs, kHeldUs),
       {kText}},
      // The names under a prefix ($1: a LIKE pattern, hex) whose row is held, in order; at most $2.
      {"lockwatch_list",
       fmt::format("SELECT encode(lock_name, 'hex') FROM {0} WHERE lock_name LIKE decode($1::text, 'hex') "
                   "AND owner <> '' AND expires_at > clock_timestamp() ORDER BY lock_name LIMIT $2::int8",
                   t),
       {kText, kInt8}},
      // The rest run in transactions (execute_all) after
      // lockwatch_lock_rows, which makes the names' lock rows if missing
      // and locks them (ON CONFLICT locks a row even where its WHERE does
      // not update it), in name order: every change to a name's holders
      // is made by one transaction at a time, which reads them afresh (a
      // statement of its own, so a snapshot taken after the lock).
      {"lockwatch_lock_rows",
       fmt::format("INSERT INTO {0} AS l (lock_name, owner, fence, expires_at) "
                   "SELECT n, '', 0, clock_timestamp() FROM (SELECT DISTINCT decode(x, 'hex') AS n "
                   "FROM unnest($1::text[]) AS x) d ORDER BY n "
                   "ON CONFLICT (lock_name) DO UPDATE SET fence = l.fence WHERE false",
                   t),
       {kTextArray}},
      {"lockwatch_force_release",
       fmt::format("WITH d AS (DELETE FROM {1} WHERE lock_name = decode($1::text, 'hex') AND role <> 'q') "
                   "UPDATE {0} SET owner = '', expires_at = clock_timestamp() WHERE lock_name = decode($1::text, "
                   "'hex') AND owner <> '' AND expires_at > clock_timestamp() "
                   "RETURNING pg_notify($2::text, encode(lock_name, 'hex'))",
                   t, h),
       {kText, kText}},
  };
}

// The shared, permit and fair locks' statements (statements() below).
std::vector<PgStatement> pg_kind_statements(const std::string& t, const std::string& h, const std::string& o) {
  return {
      {"lockwatch_acquire_kind", acquire_kind_sql(t, h, o), {kText, kText, kInt8, kText, kInt8}},
      {"lockwatch_acquire_fair", acquire_fair_sql(t, h, o), {kText, kText, kInt8, kText, kText}},
      {"lockwatch_withdraw",
       fmt::format("WITH c AS (SELECT clock_timestamp() AS now, decode($1::text, 'hex') AS name, "
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
                   t, h),
       {kText, kText, kText}},
      {"lockwatch_renew_kind", renew_kind_sql(t, h), {kTextArray, kTextArray, kInt8Array, kTextArray}},
      {"lockwatch_release_kind", release_kind_sql(t, h), {kTextArray, kTextArray, kTextArray, kBool, kText}},
  };
}

// The statements, prepared on every command and renewal connection; `t`
// is the quoted lock table, `h` the quoted holders' table. A batch arrives
// as parallel arrays (names, owners, ttls in µs) unnested WITH ORDINALITY,
// so that an answer names the request by its position (1-based).
// `o`: this store's owner name as a bytea expression, recorded with each grant.
std::vector<PgStatement> statements(const std::string& t, const std::string& h, const std::string& o) {
  auto all = pg_lock_statements(t, h, o);  // first: its first doubles as the table check
  for (auto& more : {pg_operator_statements(t, h), pg_kind_statements(t, h, o)})
    all.insert(all.end(), more.begin(), more.end());
  return all;
}

std::string quoted(const std::string& table) { return "\"" + table + "\""; }

// How a lock row whose owner is `owner` is held, for the refusal of a
// call of another kind.
std::string pg_held_as(std::string_view owner) {
  const LockKind kind = kinds::kind_of_marker(owner);
  if (kind.mode() == LockKind::Mode::kPermits) return fmt::format("a semaphore of {} permit(s)", kind.permit_count());
  return kind.describe();
}

std::string asked_as(LockKind kind) {
  return kind.mode() == LockKind::Mode::kPermits ? fmt::format("{} permit(s)", kind.permit_count()) : kind.describe();
}

}  // namespace

std::string PgStore::table_definition(const std::string& table) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS {} (\n"
      "  lock_name   bytea PRIMARY KEY CHECK (octet_length(lock_name) BETWEEN 1 AND {}),\n"
      "  owner       bytea NOT NULL DEFAULT '',\n"
      "  fence       bigint NOT NULL DEFAULT 0,\n"
      "  expires_at  timestamptz NOT NULL,\n"
      "  last_period bigint,\n"
      "  owner_name  bytea NOT NULL DEFAULT '',\n"
      "  granted_at  timestamptz\n"
      ") WITH (fillfactor = 70)",
      quoted(table), kMaxNameBytes);
}

std::string PgStore::holders_table_definition(const std::string& table) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS {} (\n"
      "  lock_name  bytea NOT NULL,\n"
      "  owner      bytea NOT NULL,\n"
      "  role       char(1) NOT NULL CHECK (role IN ('s', 'p', 'f', 'q', 'w')),\n"
      "  seq        bigint NOT NULL DEFAULT 0,\n"
      "  expires_at timestamptz NOT NULL,\n"
      "  owner_name bytea NOT NULL DEFAULT '',\n"
      "  granted_at timestamptz,\n"
      "  PRIMARY KEY (lock_name, owner)\n"
      ")",
      quoted(table));
}

void PgStore::check_settings(const PgTarget&, const sqlcommon::SqlSettings& settings) {
  if (settings.key_prefix.size() >= kMaxNameBytes)
    throw InvalidArgument("Options::runtime.key_prefix leaves no room for a key in the PostgreSQL lock table's 255-byte lock_name");
}

PgStore::PgStore(Loop& loop, PgTarget target, const sqlcommon::SqlSettings& settings)
    : RecipeStore(loop, settings, kDialect,
                  "the lock name (key_prefix + key) is longer than the 255 bytes the PostgreSQL lock table's "
                  "lock_name takes",
                  true),
      target_(std::move(target)),
      channel_(target_.channel()) {
  offer({.fence_raising = this, .job_claims = this, .operator_tools = this, .lock_listing = this, .fair_queue = this});
  PgSession session;
  session.statements = statements(quoted(target_.table), quoted(target_.holders_table()),
                                  "decode('" + to_hex(settings_.owner_name) + "', 'hex')");
  session.create = {table_definition(target_.table), holders_table_definition(target_.holders_table())};
  // Tables made by versions before get the columns added since.
  for (const std::string& table : {target_.table, target_.holders_table()})
    session.create.push_back(fmt::format("ALTER TABLE {} ADD COLUMN IF NOT EXISTS owner_name bytea NOT NULL DEFAULT "
                                         "'', ADD COLUMN IF NOT EXISTS granted_at timestamptz",
                                         quoted(table)));
  // Planned, not run: ON CONFLICT (lock_name) needs lock_name to be the
  // table's key, which only the planner checks.
  session.plan_check = "EXPLAIN EXECUTE lockwatch_acquire('{}', '{}', '{}')";
  session.table = fmt::format("{}.{}", target_.database, target_.table);
  session.stale = std::make_shared<PgStaleBackends>();
  connections_.make(loop, target_, settings_, session);
}

PgStore::~PgStore() = default;

void PgStore::turn_ended() {
  acquires_.flush();
  send_releases();
}

// ---- acquire

// The kinds' acquisitions of one loop turn (a set's keys among them), in
// name order, go in one transaction per group: their lock rows locked,
// then each one's decision (see statements()), one statement each.
void PgStore::send_kind_group(AcquireBatchPtr group) {
  const auto& l = group->locks;
  std::vector<PgCall> calls;
  calls.reserve(l.size() + 1);
  calls.push_back({"lockwatch_lock_rows", {hex_array(l.size(), [&](std::size_t i) -> std::string_view {
                     return l[i].name;
                   })}});
  for (const auto& a : l) {
    const bool fair = a.kind.mode() == LockKind::Mode::kFair;
    calls.push_back({fair ? "lockwatch_acquire_fair" : "lockwatch_acquire_kind",
                     {to_hex(a.name), to_hex(a.token), std::to_string(micros(a.ttl)), to_hex(kinds::marker(a.kind)),
                      fair ? channel_ : std::to_string(a.kind.permit_count())}});
  }
  auto outcomes = std::make_shared<std::vector<Acquired>>(l.size());
  command_connection().execute_all(
      std::move(calls),
      [this, group, outcomes](std::size_t i, const PgRows& rows) {
        if (i == 0) return;  // the lock rows
        (*outcomes)[i - 1] = kind_outcome(group->locks[i - 1], rows);
      },
      [this, group, outcomes](const PgRows&, const StoreError* err) {
        if (err) {
          if (!kind_group_resent(group, *err)) group->fail(*err);
          return;
        }
        for (std::size_t k = 0; k < group->locks.size(); ++k) group->locks[k].answer((*outcomes)[k]);
      });
}

// One kind decision's row: verdict, fence, busy µs, the lock row's owner.
Acquired PgStore::kind_outcome(const sqlcommon::PendingAcquire& a, const PgRows& rows) const {
  if (rows.size() != 1 || rows.null(0, 0) || rows.null(0, 1)) {
    Acquired out;
    out.error = pg_statement_error(target_.name(), "", "no answer to the acquisition");
    return out;
  }
  using sqlcommon::Verdict;
  const std::string_view v = rows.at(0, 0);
  const Verdict verdict = v == "t" || v == "r" ? Verdict::kTaken : v == "b" ? Verdict::kBusy : Verdict::kRefused;
  return sqlcommon::kind_outcome(
      a, verdict, static_cast<std::uint64_t>(to_ll(rows.at(0, 1))),
      rows.null(0, 2) ? std::nullopt : std::optional<long long>(to_ll(rows.at(0, 2))), [&] {
        std::string owner;
        unhex(rows.at(0, 3), owner);
        return StoreError::invalid(
            target_.name(),
            fmt::format("{} is held as {}; this call asked for it {}", a.name, pg_held_as(owner), asked_as(a.kind)));
      });
}

void PgStore::acquire_batch(AcquireBatchPtr batch) {
  const auto& l = batch->locks;
  auto params = lock_arrays(l.size(), [&](std::size_t i) -> const sqlcommon::PendingAcquire& { return l[i]; });
  command_connection().execute("lockwatch_acquire", std::move(params), [this, batch](const PgRows& rows,
                                                                                     const StoreError* err) {
    if (err) return acquire_failed(batch, *err);
    std::vector<bool> answered(batch->locks.size(), false);
    for (int r = 0; r < rows.size(); ++r) {
      long long i = to_ll(rows.at(r, 0)) - 1;
      if (i < 0 || i >= static_cast<long long>(batch->locks.size()) || answered[i]) continue;
      answered[i] = true;
      Acquired out;
      if (!rows.null(r, 1)) {
        out.status = Acquired::Status::kTaken;
        out.fence = static_cast<std::uint64_t>(to_ll(rows.at(r, 1)));
      } else {
        // Busy. No row in the snapshot (taken meanwhile by a statement
        // that started later): busy for a moment, then asked again.
        out.status = Acquired::Status::kBusy;
        out.busy_for = rows.null(r, 2) ? std::chrono::milliseconds(1) : ms_up(to_ll(rows.at(r, 2)));
        // A kind's marker: readers' (the statement renewed our writer's
        // mark), or another kind's.
        std::string owner;
        const auto& lock = batch->locks[i];
        if (!rows.null(r, 3) && unhex(rows.at(r, 3), owner))
          sqlcommon::exclusive_busy(out, lock, owner, [&] {
            return StoreError::invalid(
                target_.name(),
                fmt::format("{} is held as {}; this call asked for it exclusive", lock.name, pg_held_as(owner)));
          });
      }
      batch->locks[i].answer(out);
    }
    for (std::size_t i = 0; i < answered.size(); ++i) {
      if (answered[i]) continue;
      Acquired out;
      out.error = pg_statement_error(target_.name(), "", "the acquisition's answer left a lock out");
      batch->locks[i].answer(out);
    }
  });
}

// ---- renew

void PgStore::renew_group(sqlcommon::RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds,
                          bool kinds) {
  auto params = lock_arrays(
      members.size(), [&](std::size_t k) -> const LockRef& { return batch->locks[members[k]]; }, kinds);
  auto answered = [batch, members](const PgRows& rows, const StoreError* err) {
    if (err) return batch->answer(members, Renewed::kTransient, err);
    // The answer names those not renewed.
    auto status = not_done(rows, members.size(), Renewed::kYes, Renewed::kTakenByOther, Renewed::kGone);
    for (std::size_t k = 0; k < members.size(); ++k) batch->done(members[k], status[k], nullptr);
  };
  if (!kinds) return connections_.renew->execute("lockwatch_renew", std::move(params), std::move(answered));
  std::string names = params[0];
  after_lock_rows(*connections_.renew, std::move(names), {"lockwatch_renew_kind", std::move(params)},
                  std::move(answered));
}

// ---- release

// The exclusive ones wait for the turn's end; a kind's go at once, in
// one transaction.
void PgStore::release(std::span<const LockRef> locks, bool notify, ReleaseDone done) {
  auto& queue = notify ? releases_ : quiet_releases_;
  auto kinds = std::make_shared<ReleaseBatch>();
  kinds->notify = notify;
  sqlcommon::split_releases(locks, std::move(done), queue, kinds->locks);
  if (!kinds->locks.empty()) {
    sqlcommon::by_name(kinds->locks);
    release_batch(std::move(kinds));
  }
  if (!queue.empty()) turn_end_.request();
}

void PgStore::send_releases() {
  for (bool notify : {true, false}) {
    auto& queue = notify ? releases_ : quiet_releases_;
    if (queue.empty()) continue;
    std::vector<PendingRelease> all = std::move(queue);
    queue.clear();
    // In name order, as the other statements lock rows.
    sqlcommon::by_name(all);
    sqlcommon::in_chunks(all, [this, notify](std::vector<PendingRelease> part) {
      auto batch = std::make_shared<ReleaseBatch>();
      batch->notify = notify;
      batch->locks = std::move(part);
      release_batch(std::move(batch));
    });
  }
}

void PgStore::release_batch(std::shared_ptr<ReleaseBatch> batch) {
  const auto& l = batch->locks;
  const bool of_kinds = !l.empty() && !l.front().kind.exclusive_kind();
  auto params = lock_arrays(l.size(), [&](std::size_t i) -> const PendingRelease& { return l[i]; }, of_kinds);
  params.push_back(batch->notify ? "t" : "f");
  params.push_back(channel_);
  auto answered = [this, batch](const PgRows& rows, const StoreError* err) {
    if (err) {
      if (!sqlcommon::retry_later(batch, *err, [this](std::shared_ptr<ReleaseBatch> b) { release_batch(std::move(b)); }))
        batch->answer(Released::kUnconfirmed, err);
      return;
    }
    // The answer names those not released.
    auto status = not_done(rows, batch->locks.size(), Released::kYes, Released::kTakenByOther, Released::kGone);
    for (std::size_t k = 0; k < status.size(); ++k) batch->locks[k].answer(status[k], nullptr);
  };
  if (!of_kinds) return command_connection().execute("lockwatch_release", std::move(params), std::move(answered));
  std::string names = params[0];
  after_lock_rows(command_connection(), std::move(names), {"lockwatch_release_kind", std::move(params)},
                  std::move(answered));
}

// ---- the rest

void PgStore::raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) {
  command_connection().execute("lockwatch_raise_fence", {to_hex(name), std::to_string(fence)},
                               [done = std::move(done)](const PgRows&, const StoreError* err) { done(!err); });
}

void PgStore::server_time(TimeDone done) {
  command_connection().execute("lockwatch_time", {}, [this, done = std::move(done)](const PgRows& rows,
                                                                                    const StoreError* err) {
    StoreError no_answer;
    if (!err && (rows.size() != 1 || rows.null(0, 0))) {
      no_answer = pg_statement_error(target_.name(), "", "no answer to clock_timestamp()");
      err = &no_answer;
    }
    done(err ? std::chrono::system_clock::time_point{} : from_micros(to_ll(rows.at(0, 0))), err);
  });
}

void PgStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                           std::chrono::system_clock::time_point start, ClaimDone done) {
  std::vector<std::string> params{to_hex(name), to_hex(token), std::to_string(period), std::to_string(to_micros(start))};
  command_connection().execute(
      "lockwatch_claim", std::move(params),
      [this, period, done = std::move(done)](const PgRows& rows, const StoreError* err) {
        ClaimResult out;
        StoreError no_answer;
        if (!err && rows.size() != 1) {
          no_answer = pg_statement_error(target_.name(), "", "no answer to the claim");
          err = &no_answer;
        }
        if (err) {
          out.error = *err;
          done(out);
          return;
        }
        out.store_time = from_micros(to_ll(rows.at(0, 1)));
        sqlcommon::decide_claim(out, rows.at(0, 0) == "1", !rows.null(0, 2) && rows.at(0, 2) == "t",
                                rows.null(0, 4) ? std::nullopt : std::optional<std::int64_t>(to_ll(rows.at(0, 4))),
                                period);
        done(out);
      });
}

namespace {

// A holder from an answer's columns `at`..`at + 3`: token and owner name
// (hex), grant time and age in µs (NULL: none recorded).
HolderInfo holder_of(const PgRows& rows, int row, int at) {
  std::string token, owner_name;
  unhex(rows.at(row, at), token);
  unhex(rows.at(row, at + 1), owner_name);
  if (rows.null(row, at + 2)) return sqlcommon::holder(std::move(token), std::move(owner_name), std::nullopt, 0);
  return sqlcommon::holder(std::move(token), std::move(owner_name), to_ll(rows.at(row, at + 2)),
                           to_ll(rows.at(row, at + 3)));
}

}  // namespace

void PgStore::inspect(std::string_view name, InspectDone done) {
  // The lock row, then (a kind's marker in it) the live holders' rows, in
  // one round trip: both statements go out together.
  auto answer = std::make_shared<sqlcommon::Inspection>(std::move(done));
  PgConnection& conn = command_connection();
  conn.execute("lockwatch_inspect", {to_hex(name)}, [answer](const PgRows& rows, const StoreError* err) {
    if (err) return answer->fail(err);
    if (rows.size() != 1) return;
    std::string owner;
    unhex(rows.at(0, 2), owner);
    answer->lock_row(to_ll(rows.at(0, 0)), static_cast<std::uint64_t>(to_ll(rows.at(0, 1))), std::move(owner),
                     holder_of(rows, 0, 2));
  });
  conn.execute("lockwatch_holders", {to_hex(name)}, [answer](const PgRows& rows, const StoreError* err) {
    if (err) return answer->fail(err);
    if (answer->wants_holders())
      for (int r = 0; r < rows.size(); ++r) answer->add_holder(holder_of(rows, r, 0));
    answer->finish();
  });
}

void PgStore::list_names(std::string pattern, std::size_t limit, NamesDone done) {
  command_connection().execute("lockwatch_list", {to_hex(pattern), std::to_string(limit)},
                               [done = std::move(done)](const PgRows& rows, const StoreError* err) {
                                 std::vector<std::string> names;
                                 for (int r = 0; !err && r < rows.size(); ++r) {
                                   std::string name;
                                   if (unhex(rows.at(r, 0), name)) names.push_back(std::move(name));
                                 }
                                 done(std::move(names), err);
                               });
}

void PgStore::force_release(std::string_view name, ForceDone done) {
  // The holders' rows go too: after the lock row is locked, as every
  // change to them.
  after_lock_rows(command_connection(), hex_array(1, [&](std::size_t) { return name; }),
                  {"lockwatch_force_release", {to_hex(name), channel_}},
                  [done = std::move(done)](const PgRows& rows, const StoreError* err) {
                    done(!err && rows.size() == 1, err);
                  });
}

void PgStore::withdraw(const LockRef& lock, WithdrawDone done) {
  after_lock_rows(command_connection(), hex_array(1, [&](std::size_t) { return lock.name; }),
                  {"lockwatch_withdraw", {to_hex(lock.name), to_hex(lock.token), channel_}},
                  [done = std::move(done)](const PgRows&, const StoreError* err) { done(err); });
}

// ---- release notices

void PgStore::subscribe(std::string_view name) {
  if (closed_) return;
  auto [it, fresh] = subscribed_.emplace(name);
  (void)fresh;
  if (!notices_) {
    start_notices();
    return;
  }
  if (!listening_) return;  // confirmed for every name once LISTEN is
  // Already listening: confirmed on the next turn (never inside the call).
  loop_.post([this, name = *it] {
    if (!closed_ && listening_ && subscribed_.count(name) != 0 && events_.subscribed) events_.subscribed(name);
  });
}

void PgStore::unsubscribe(std::string_view name) {
  // The channel stays: other names share it.
  if (auto it = subscribed_.find(name); it != subscribed_.end()) subscribed_.erase(it);
}

void PgStore::start_notices() {
  PgSession session;
  session.listen = channel_;
  session.table = fmt::format("{}.{}", target_.database, target_.table);
  notices_ = std::make_unique<PgConnection>(loop_, target_, settings_, std::move(session));
  notices_->set_ready_hook([this] {
    listening_ = true;
    if (!events_.subscribed) return;
    std::vector<std::string> names(subscribed_.begin(), subscribed_.end());
    for (const auto& n : names)
      if (!closed_ && subscribed_.count(n) != 0) events_.subscribed(n);
  });
  notices_->set_state_hook([this](bool up, const std::string&) {
    if (up || !listening_) return;
    listening_ = false;
    if (events_.subscriptions_lost) events_.subscriptions_lost();
  });
  notices_->set_notify_hook([this](std::string_view payload) {
    std::string name;
    if (!unhex(payload, name)) return;
    if (subscribed_.count(name) != 0 && events_.released) events_.released(name);
  });
  notices_->start();
}

void PgStore::poll_replies() { connections_.renew->poll_now(); }

void PgStore::close() {
  closed_ = true;
  RecipeStore::close();
  if (notices_) notices_->close();
}

}  // namespace lockwatch::detail
