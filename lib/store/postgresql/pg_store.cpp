#include "store/postgresql/pg_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>

#include "core/loop.hpp"
#include "lockwatch/errors.hpp"
#include "store/postgresql/pg_error.hpp"

namespace lockwatch::detail {

namespace {

constexpr int kCommandConnections = 2;
// An acquire, renew or release statement names at most this many locks.
constexpr std::size_t kChunk = 512;
// A deadlock, a serialization failure or a lock wait past lock_timeout:
// the statement is tried again this many times before it fails.
constexpr int kAttempts = 3;

// Parameter types (pg_type OIDs).
constexpr unsigned kText = 25, kInt8 = 20, kBool = 16, kTextArray = 1009, kInt8Array = 1016;

// Names and tokens travel as hex text and are decoded by the server: any
// bytes, no escaping, and nothing a key holds can change a statement.
void append_hex(std::string& out, std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
}

std::string hex(std::string_view bytes) {
  std::string out;
  out.reserve(2 * bytes.size());
  append_hex(out, bytes);
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Hex text back to bytes; false if it is not hex.
bool unhex(std::string_view text, std::string& out) {
  if (text.size() % 2 != 0) return false;
  out.clear();
  out.reserve(text.size() / 2);
  for (std::size_t i = 0; i < text.size(); i += 2) {
    int hi = hex_digit(text[i]), lo = hex_digit(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

// A text[] literal of hex strings: {"6b31","6b32"}.
template <class Get>
std::string hex_array(std::size_t n, Get get) {
  std::string out = "{";
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += ',';
    out += '"';
    append_hex(out, get(i));
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

long long micros(std::chrono::milliseconds ttl) { return static_cast<long long>(ttl.count()) * 1000; }

long long to_ll(std::string_view s) {
  long long v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

std::chrono::system_clock::time_point from_micros(long long us) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(us)));
}

long long to_micros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::chrono::milliseconds ceil_ms(long long us) { return std::chrono::milliseconds((std::max(us, 0LL) + 999) / 1000); }

// The statements, prepared on every command and renewal connection; `t`
// is the quoted table. A batch arrives as parallel arrays (names, owners,
// ttls in µs) unnested WITH ORDINALITY, so that an answer names the
// request by its position (1-based).
std::vector<PgStatement> statements(const std::string& t) {
  const std::string batch =
      "r AS (SELECT decode(n, 'hex') AS lock_name, decode(o, 'hex') AS owner, u AS ttl_us, i "
      "FROM unnest($1::text[], $2::text[], $3::int8[]) WITH ORDINALITY AS x(n, o, u, i))";
  // Who holds a row we did not get, from the statement's snapshot: it
  // names the outcome and decides nothing.
  const std::string other_holds = fmt::format(
      "coalesce((SELECT h.owner <> '' AND h.owner <> r.owner AND h.expires_at > clock_timestamp() FROM {} h "
      "WHERE h.lock_name = r.lock_name), false)",
      t);
  const std::string remaining_us = "greatest(ceil(extract(epoch FROM {} - clock_timestamp()) * 1000000), 0)::int8";
  return {
      // The first doubles as the table check (pg_connection.hpp). A free
      // or expired row becomes ours with its fence raised; our own row
      // (the same token: a repeated request) keeps its fence and gets the
      // new ttl; another owner's live row is left alone. Rows are taken
      // in name order, so that batches cannot deadlock each other.
      {"lockwatch_acquire",
       fmt::format("WITH {1}, w AS (INSERT INTO {0} AS l (lock_name, owner, fence, expires_at) "
                   "SELECT lock_name, owner, 1, clock_timestamp() + ttl_us * interval '1 microsecond' FROM r "
                   "ORDER BY lock_name "
                   "ON CONFLICT (lock_name) DO UPDATE SET "
                   "fence = CASE WHEN l.expires_at <= clock_timestamp() THEN l.fence + 1 ELSE l.fence END, "
                   "owner = excluded.owner, expires_at = excluded.expires_at "
                   "WHERE l.expires_at <= clock_timestamp() OR l.owner = excluded.owner "
                   "RETURNING l.lock_name, l.fence) "
                   "SELECT r.i, w.fence, (SELECT {2} FROM {0} h WHERE h.lock_name = r.lock_name AND w.fence IS NULL) "
                   "FROM r LEFT JOIN w ON w.lock_name = r.lock_name",
                   t, batch, fmt::format(fmt::runtime(remaining_us), "h.expires_at")),
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
       fmt::format("SELECT {1}, fence, encode(owner, 'hex') FROM {0} WHERE lock_name = decode($1::text, 'hex')", t,
                   fmt::format(fmt::runtime(remaining_us), "expires_at")),
       {kText}},
      {"lockwatch_force_release",
       fmt::format("UPDATE {0} SET owner = '', expires_at = clock_timestamp() WHERE lock_name = decode($1::text, "
                   "'hex') AND owner <> '' AND expires_at > clock_timestamp() "
                   "RETURNING pg_notify($2::text, encode(lock_name, 'hex'))",
                   t),
       {kText, kText}},
  };
}

std::string quoted(const std::string& table) { return "\"" + table + "\""; }

}  // namespace

std::string PgStore::table_definition(const std::string& table) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS {} (\n"
      "  lock_name   bytea PRIMARY KEY CHECK (octet_length(lock_name) BETWEEN 1 AND {}),\n"
      "  owner       bytea NOT NULL DEFAULT '',\n"
      "  fence       bigint NOT NULL DEFAULT 0,\n"
      "  expires_at  timestamptz NOT NULL,\n"
      "  last_period bigint\n"
      ") WITH (fillfactor = 70)",
      quoted(table), kMaxNameBytes);
}

void PgStore::check_options(const PgTarget&, const Options& options) {
  if (options.min_replicas > 0)
    throw InvalidArgument("Options::min_replicas applies to Redis replicas; a postgresql:// store takes its "
                          "durability from the database's own settings (synchronous_commit, synchronous replication)");
  if (options.key_prefix.size() >= kMaxNameBytes)
    throw InvalidArgument("Options::key_prefix leaves no room for a key in the PostgreSQL lock table's 255-byte lock_name");
}

PgStore::PgStore(Loop& loop, PgTarget target, const Options& options)
    : StoreBase(KeyRules{options.key_prefix, KeyRules::plain,
                         [](std::string_view prefix, std::string_view key) noexcept -> const char* {
                           if (prefix.size() + key.size() > kMaxNameBytes)
                             return "the lock name (key_prefix + key) is longer than the 255 bytes the PostgreSQL "
                                    "lock table's lock_name takes";
                           return nullptr;
                         }},
                /*release_events=*/true),
      loop_(loop),
      options_(options),
      target_(std::move(target)),
      channel_(target_.channel()) {
  PgSession session;
  session.statements = statements(quoted(target_.table));
  session.create = table_definition(target_.table);
  // Planned, not run: ON CONFLICT (lock_name) needs lock_name to be the
  // table's key, which only the planner checks.
  session.plan_check = "EXPLAIN EXECUTE lockwatch_acquire('{}', '{}', '{}')";
  session.table = fmt::format("{}.{}", target_.database, target_.table);
  session.stale = std::make_shared<PgStaleBackends>();
  for (int i = 0; i < kCommandConnections; ++i)
    commands_.push_back(std::make_unique<PgConnection>(loop, target_, options_, session));
  renew_ = std::make_unique<PgConnection>(loop, target_, options_, session);
}

PgStore::~PgStore() = default;

void PgStore::started() {
  uv_idle_init(loop_.uv(), &coalesce_);
  coalesce_.data = this;
  started_ = true;
  // The first command connection speaks for the server.
  commands_.front()->set_state_hook([this](bool up, const std::string& why) {
    if (events_.connection) events_.connection(commands_.front()->name(), up, why);
  });
  for (auto& c : commands_) c->start();
  renew_->start();
}

PgConnection& PgStore::command_connection() {
  PgConnection* best = commands_.front().get();
  for (auto& c : commands_)
    if (c->pending() < best->pending()) best = c.get();
  return *best;
}

// ---- acquire

// One lock of an acquire() call, kept until its statement goes out (owned
// copies: the caller's views end with the call).
struct PgStore::PendingAcquire {
  std::string name;
  std::string token;
  std::chrono::milliseconds ttl;
  std::size_t index;                  // in its call's batch
  std::shared_ptr<AcquireDone> done;  // its call's callback
};

// The locks one acquire statement carries: distinct names, sorted.
struct PgStore::AcquireBatch {
  std::vector<PendingAcquire> locks;
  int attempt = 1;
};

void PgStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto shared_done = std::make_shared<AcquireDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i)
    acquires_.push_back({std::string(locks[i].name), std::string(locks[i].token), locks[i].ttl, i, shared_done});
  coalesce();
}

void PgStore::coalesce() {
  if (coalescing_) return;
  if (!started_) {  // closed: out at once, to be failed by the connections
    send_acquisitions();
    send_releases();
    return;
  }
  coalescing_ = true;
  uv_idle_start(&coalesce_, on_coalesce);
}

void PgStore::on_coalesce(uv_idle_t* idle) {
  auto* self = static_cast<PgStore*>(idle->data);
  uv_idle_stop(idle);
  self->coalescing_ = false;
  self->send_acquisitions();
  self->send_releases();
}

void PgStore::send_acquisitions() {
  if (acquires_.empty()) return;
  std::vector<PendingAcquire> all = std::move(acquires_);
  acquires_.clear();
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  // ON CONFLICT updates a row once per statement: the k-th request for a
  // name in this turn goes in the k-th statement.
  std::vector<std::vector<PendingAcquire>> rounds;
  for (std::size_t i = 0; i < all.size();) {
    std::size_t j = i;
    while (j < all.size() && all[j].name == all[i].name) {
      std::size_t round = j - i;
      if (rounds.size() <= round) rounds.emplace_back();
      rounds[round].push_back(std::move(all[j]));
      ++j;
    }
    i = j;
  }
  for (auto& round : rounds) {
    for (std::size_t from = 0; from < round.size(); from += kChunk) {
      auto batch = std::make_shared<AcquireBatch>();
      auto to = std::min(round.size(), from + kChunk);
      batch->locks.assign(std::make_move_iterator(round.begin() + from), std::make_move_iterator(round.begin() + to));
      acquire_batch(std::move(batch));
    }
  }
}

void PgStore::acquire_batch(std::shared_ptr<AcquireBatch> batch) {
  const auto& l = batch->locks;
  std::vector<std::string> params{
      hex_array(l.size(), [&](std::size_t i) -> std::string_view { return l[i].name; }),
      hex_array(l.size(), [&](std::size_t i) -> std::string_view { return l[i].token; }),
      int_array(l.size(), [&](std::size_t i) { return micros(l[i].ttl); }),
  };
  command_connection().execute("lockwatch_acquire", std::move(params), [this, batch](const PgRows& rows,
                                                                                     const StoreError* err) {
    if (err) {
      if (err->kind == StoreError::Kind::kRetryLater && batch->attempt < kAttempts) {
        ++batch->attempt;
        acquire_batch(batch);
        return;
      }
      if (batch->locks.size() > 1 && err->kind == StoreError::Kind::kRefused) {
        // The server refused the statement for one of its rows (a name
        // the table's own CHECK refuses, say): each lock again on its
        // own, so that only that one fails.
        for (auto& lock : batch->locks) {
          auto single = std::make_shared<AcquireBatch>();
          single->locks.push_back(std::move(lock));
          acquire_batch(std::move(single));
        }
        return;
      }
      Acquired out;
      out.error = *err;
      for (const auto& lock : batch->locks) (*lock.done)(lock.index, out);
      return;
    }
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
        out.busy_for = rows.null(r, 2) ? std::chrono::milliseconds(1) : ceil_ms(to_ll(rows.at(r, 2)));
      }
      const auto& lock = batch->locks[i];
      (*lock.done)(lock.index, out);
    }
    for (std::size_t i = 0; i < answered.size(); ++i) {
      if (answered[i]) continue;
      Acquired out;
      out.error = pg_statement_error(target_.name(), "", "the acquisition's answer left a lock out");
      const auto& lock = batch->locks[i];
      (*lock.done)(lock.index, out);
    }
  });
}

// ---- renew

struct PgStore::RenewBatch {
  std::vector<LockRef> locks;  // views, valid while keepalive lives
  std::shared_ptr<const void> keepalive;
  RenewDone done;
};

std::size_t PgStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) {
  auto batch = std::make_shared<RenewBatch>();
  batch->locks.assign(locks.begin(), locks.end());
  batch->keepalive = std::move(keepalive);
  batch->done = std::move(done);
  // In name order, in chunks; one statement per chunk whatever the ttls.
  std::vector<std::size_t> order(locks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return batch->locks[a].name < batch->locks[b].name; });
  std::size_t statements = 0;
  for (std::size_t from = 0; from < order.size(); from += kChunk) {
    std::size_t to = std::min(order.size(), from + kChunk);
    renew_group(batch, std::vector<std::size_t>(order.begin() + from, order.begin() + to));
    ++statements;
  }
  return statements;
}

void PgStore::renew_group(std::shared_ptr<RenewBatch> batch, std::vector<std::size_t> members) {
  const auto& l = batch->locks;
  std::vector<std::string> params{
      hex_array(members.size(), [&](std::size_t k) { return l[members[k]].name; }),
      hex_array(members.size(), [&](std::size_t k) { return l[members[k]].token; }),
      int_array(members.size(), [&](std::size_t k) { return micros(l[members[k]].ttl); }),
  };
  renew_->execute("lockwatch_renew", std::move(params),
                  [batch, members = std::move(members)](const PgRows& rows, const StoreError* err) {
                    if (err) {
                      for (std::size_t i : members) batch->done(i, Renewed::kTransient, err);
                      return;
                    }
                    // The answer names those not renewed.
                    std::vector<Renewed> status(members.size(), Renewed::kYes);
                    for (int r = 0; r < rows.size(); ++r) {
                      long long k = to_ll(rows.at(r, 0)) - 1;
                      if (k < 0 || k >= static_cast<long long>(members.size())) continue;
                      status[k] = rows.at(r, 1) == "t" ? Renewed::kTakenByOther : Renewed::kGone;
                    }
                    for (std::size_t k = 0; k < members.size(); ++k) batch->done(members[k], status[k], nullptr);
                  });
}

// ---- release

// One lock of a release() call, kept until its statement goes out.
struct PgStore::PendingRelease {
  std::string name;
  std::string token;
  std::size_t index;                  // in its call's batch
  std::shared_ptr<ReleaseDone> done;  // its call's callback
};

// The locks one release statement carries (all with notices, or none).
struct PgStore::ReleaseBatch {
  std::vector<PendingRelease> locks;
  bool notify = false;
  int attempt = 1;
};

void PgStore::release(std::span<const LockRef> locks, bool notify, ReleaseDone done) {
  auto shared_done = std::make_shared<ReleaseDone>(std::move(done));
  auto& queue = notify ? releases_ : quiet_releases_;
  for (std::size_t i = 0; i < locks.size(); ++i)
    queue.push_back({std::string(locks[i].name), std::string(locks[i].token), i, shared_done});
  coalesce();
}

void PgStore::send_releases() {
  for (bool notify : {true, false}) {
    auto& queue = notify ? releases_ : quiet_releases_;
    if (queue.empty()) continue;
    std::vector<PendingRelease> all = std::move(queue);
    queue.clear();
    // In name order, as the other statements lock rows.
    std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    for (std::size_t from = 0; from < all.size(); from += kChunk) {
      auto batch = std::make_shared<ReleaseBatch>();
      batch->notify = notify;
      auto to = std::min(all.size(), from + kChunk);
      batch->locks.assign(std::make_move_iterator(all.begin() + from), std::make_move_iterator(all.begin() + to));
      release_batch(std::move(batch));
    }
  }
}

void PgStore::release_batch(std::shared_ptr<ReleaseBatch> batch) {
  const auto& l = batch->locks;
  std::vector<std::string> params{
      hex_array(l.size(), [&](std::size_t i) -> std::string_view { return l[i].name; }),
      hex_array(l.size(), [&](std::size_t i) -> std::string_view { return l[i].token; }),
      batch->notify ? "t" : "f",
      channel_,
  };
  command_connection().execute("lockwatch_release", std::move(params), [this, batch](const PgRows& rows,
                                                                                     const StoreError* err) {
    if (err) {
      if (err->kind == StoreError::Kind::kRetryLater && batch->attempt < kAttempts) {
        ++batch->attempt;
        release_batch(batch);
        return;
      }
      for (const auto& lock : batch->locks) (*lock.done)(lock.index, Released::kUnconfirmed, err);
      return;
    }
    // The answer names those not released.
    std::vector<Released> status(batch->locks.size(), Released::kYes);
    for (int r = 0; r < rows.size(); ++r) {
      long long k = to_ll(rows.at(r, 0)) - 1;
      if (k < 0 || k >= static_cast<long long>(status.size())) continue;
      status[k] = rows.at(r, 1) == "t" ? Released::kTakenByOther : Released::kGone;
    }
    for (std::size_t k = 0; k < status.size(); ++k) (*batch->locks[k].done)(batch->locks[k].index, status[k], nullptr);
  });
}

// ---- the rest

void PgStore::raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) {
  command_connection().execute("lockwatch_raise_fence", {hex(name), std::to_string(fence)},
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
  std::vector<std::string> params{hex(name), hex(token), std::to_string(period), std::to_string(to_micros(start))};
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
        const bool claimed = rows.at(0, 0) == "1";
        const bool ours = !rows.null(0, 2) && rows.at(0, 2) == "t";
        const bool ran = !rows.null(0, 4);
        out.last = ran ? to_ll(rows.at(0, 4)) : 0;
        if (claimed) {
          out.status = ClaimResult::Status::kClaimed;
          out.last = period;
        } else if (!ours) {
          out.status = ClaimResult::Status::kNotLeader;
        } else if (ran && out.last >= period) {
          out.status = ClaimResult::Status::kAlreadyRun;
        } else {
          out.status = ClaimResult::Status::kNotDue;
        }
        done(out);
      });
}

void PgStore::inspect(std::string_view name, InspectDone done) {
  command_connection().execute("lockwatch_inspect", {hex(name)},
                               [done = std::move(done)](const PgRows& rows, const StoreError* err) {
                                 LockInfo info;
                                 if (!err && rows.size() == 1) {
                                   long long us = to_ll(rows.at(0, 0));
                                   std::string owner;
                                   unhex(rows.at(0, 2), owner);
                                   info.held = us > 0 && !owner.empty();
                                   info.ttl = info.held ? ceil_ms(us) : std::chrono::milliseconds(0);
                                   info.fencing_token = static_cast<std::uint64_t>(to_ll(rows.at(0, 1)));
                                   if (info.held) info.owner = std::move(owner);
                                 }
                                 done(info, err);
                               });
}

void PgStore::force_release(std::string_view name, ForceDone done) {
  command_connection().execute("lockwatch_force_release", {hex(name), channel_},
                               [done = std::move(done)](const PgRows& rows, const StoreError* err) {
                                 done(!err && rows.size() == 1, err);
                               });
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
  notices_ = std::make_unique<PgConnection>(loop_, target_, options_, std::move(session));
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

void PgStore::poll_replies() { renew_->poll_now(); }

void PgStore::close() {
  closed_ = true;
  // What is queued goes to the connections, which fail it as they close:
  // every callback runs.
  if (started_) {
    uv_idle_stop(&coalesce_);
    uv_close(reinterpret_cast<uv_handle_t*>(&coalesce_), nullptr);
    started_ = false;
    coalescing_ = false;
  }
  send_acquisitions();
  send_releases();
  for (auto& c : commands_) c->close();
  renew_->close();
  if (notices_) notices_->close();
}

}  // namespace lockwatch::detail
