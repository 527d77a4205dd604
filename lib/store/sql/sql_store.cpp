#include "store/sql/sql_store.hpp"

#include <fmt/format.h>
#include <mysqld_error.h>

#include <algorithm>
#include <charconv>
#include <map>

#include "core/error_values.hpp"
#include "core/loop.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

namespace {

constexpr int kCommandConnections = 2;
// A renewal statement names at most this many locks (its text stays far
// below max_allowed_packet).
constexpr std::size_t kRenewChunk = 512;
// A deadlock or lock-wait timeout on the lock's row: the statement is
// tried again this many times before the acquisition fails.
constexpr int kAcquireAttempts = 3;

// Names and tokens go into statements as hex literals: any bytes, no
// escaping, nothing a key holds can change a statement.
std::string hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(3 + 2 * bytes.size());
  out += "X'";
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  out.push_back('\'');
  return out;
}

long long micros(std::chrono::milliseconds ttl) { return static_cast<long long>(ttl.count()) * 1000; }

long long to_ll(const std::string& s) {
  long long v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

// "1795441148.216002" (UNIX_TIMESTAMP(NOW(6))) as a time point.
std::chrono::system_clock::time_point unix_time(const std::string& s) {
  auto dot = s.find('.');
  long long secs = to_ll(s.substr(0, dot));
  long long us = 0;
  if (dot != std::string::npos) {
    std::string frac = s.substr(dot + 1, 6);
    frac.resize(6, '0');
    us = to_ll(frac);
  }
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(secs) + std::chrono::microseconds(us)));
}

// A time point as a DATETIME(6) literal in UTC (the sessions' time zone).
std::string datetime_literal(std::chrono::system_clock::time_point t) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  if (us < 0) us = 0;
  auto days = std::chrono::floor<std::chrono::days>(std::chrono::sys_time<std::chrono::microseconds>(std::chrono::microseconds(us)));
  std::chrono::year_month_day ymd{days};
  long long in_day = us - std::chrono::duration_cast<std::chrono::microseconds>(days.time_since_epoch()).count();
  long long secs = in_day / 1000000;
  return fmt::format("'{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}'", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()), secs / 3600, secs / 60 % 60,
                     secs % 60, in_day % 1000000);
}

bool retry_worthy(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const SqlError& s) {
    return s.code() == ER_LOCK_DEADLOCK || s.code() == ER_LOCK_WAIT_TIMEOUT;
  } catch (...) {
    return false;
  }
}

}  // namespace

std::string SqlStore::table_definition(const std::string& table) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS `{}` (\n"
      "  lock_name   VARBINARY({}) NOT NULL,\n"
      "  owner       VARBINARY(64) NOT NULL DEFAULT '',\n"
      "  fence       BIGINT UNSIGNED NOT NULL DEFAULT 0,\n"
      "  expires_at  DATETIME(6) NOT NULL,\n"
      "  last_period BIGINT NULL,\n"
      "  PRIMARY KEY (lock_name)\n"
      ") ENGINE=InnoDB",
      table, kMaxNameBytes);
}

SqlStore::SqlStore(Loop& loop, SqlTarget target, const Options& options)
    : options_(options), target_(std::move(target)), table_("`" + target_.table + "`") {
  SqlSession session;
  long long wait_s = std::max<long long>(1, options_.command_timeout.count() / 1000);
  session.setup = {
      fmt::format("SET SESSION time_zone = '+00:00', SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION', "
                  "SESSION autocommit = 1, SESSION innodb_lock_wait_timeout = {}",
                  wait_s),
      "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
  };
  session.check = fmt::format("SELECT lock_name, owner, fence, expires_at, last_period FROM {} LIMIT 0", table_);
  session.create = table_definition(target_.table);
  session.table = fmt::format("{}.{}", target_.database, target_.table);
  for (int i = 0; i < kCommandConnections; ++i)
    commands_.push_back(std::make_unique<SqlConnection>(loop, target_, options_, session));
  renew_ = std::make_unique<SqlConnection>(loop, target_, options_, session);
}

SqlStore::~SqlStore() = default;

std::string SqlStore::encode(std::string_view key) const {
  std::string name;
  name.reserve(options_.key_prefix.size() + key.size());
  name += options_.key_prefix;
  name += key;
  return name;
}

const char* SqlStore::check_key(std::string_view key) const noexcept {
  if (options_.key_prefix.size() + key.size() > kMaxNameBytes)
    return "the lock name (key_prefix + key) is longer than the 255 bytes of the SQL lock table's lock_name column";
  return nullptr;
}

void SqlStore::start(StoreEvents events) {
  events_ = std::move(events);
  // The first command connection speaks for the server.
  commands_.front()->set_state_hook([this](bool up, const std::string& why) {
    if (events_.connection) events_.connection(commands_.front()->name(), up, why);
  });
  for (auto& c : commands_) c->start();
  renew_->start();
}

SqlConnection& SqlStore::command_connection() {
  SqlConnection* best = commands_.front().get();
  for (auto& c : commands_)
    if (c->pending() < best->pending()) best = c.get();
  return *best;
}

void SqlStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto shared_done = std::make_shared<AcquireDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i)
    acquire_one(std::string(locks[i].name), std::string(locks[i].token), locks[i].ttl, i, shared_done, 1);
}

void SqlStore::acquire_one(std::string name, std::string token, std::chrono::milliseconds ttl, std::size_t index,
                           std::shared_ptr<AcquireDone> done, int attempt) {
  // One statement decides. `fence` is assigned first, while owner and
  // expires_at still hold the old row; then owner; then expires_at, which
  // sees the new owner. Affected rows: 1 a new row (fence 1), 2 ours now
  // (LAST_INSERT_ID holds the fence), 0 someone else's.
  std::string n = hex(name);
  std::string acquire_sql = fmt::format(
      "INSERT INTO {0} (lock_name, owner, fence, expires_at) VALUES ({1}, {2}, 1, NOW(6) + INTERVAL {3} MICROSECOND) "
      "ON DUPLICATE KEY UPDATE "
      "fence = IF(expires_at <= NOW(6), LAST_INSERT_ID(fence + 1), IF(owner = VALUES(owner), LAST_INSERT_ID(fence), fence)), "
      "owner = IF(expires_at <= NOW(6), VALUES(owner), owner), "
      "expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at)",
      table_, n, hex(token), micros(ttl));
  // In the same round trip: how long a busy lock stays busy.
  std::string busy_sql = fmt::format(
      "SELECT GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at), 0) FROM {} WHERE lock_name = {}", table_, n);
  struct State {
    Acquired out;
    bool decided = false;  // the insert answered: the select's answer counts
    bool retried = false;
  };
  auto state = std::make_shared<State>();
  SqlConnection& conn = command_connection();
  conn.query(std::move(acquire_sql), [this, state, name, token, ttl, index, done, attempt](const SqlResult& r,
                                                                                          std::exception_ptr err) mutable {
    if (err && retry_worthy(err) && attempt < kAcquireAttempts) {
      state->retried = true;
      acquire_one(std::move(name), std::move(token), ttl, index, std::move(done), attempt + 1);
      return;
    }
    state->decided = true;
    if (err) {
      state->out.error = err;
    } else if (r.affected == 1) {
      state->out.status = Acquired::Status::kTaken;
      state->out.fence = 1;
    } else if (r.affected == 2) {
      state->out.status = Acquired::Status::kTaken;
      state->out.fence = r.insert_id;
    } else {
      state->out.status = Acquired::Status::kBusy;
      return;  // the select says for how long
    }
    (*done)(index, state->out);
  });
  conn.query(std::move(busy_sql), [state, index, done](const SqlResult& r, std::exception_ptr) {
    if (state->retried || !state->decided || state->out.status != Acquired::Status::kBusy) return;
    long long us = r.rows.empty() || r.rows[0].empty() ? 0 : to_ll(r.rows[0][0]);
    state->out.busy_for = std::chrono::milliseconds((us + 999) / 1000);
    (*done)(index, state->out);
  });
}

struct SqlStore::RenewBatch {
  std::vector<LockRef> locks;  // views, valid while keepalive lives
  std::shared_ptr<const void> keepalive;
  RenewDone done;
};

std::size_t SqlStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) {
  auto batch = std::make_shared<RenewBatch>();
  batch->locks.assign(locks.begin(), locks.end());
  batch->keepalive = std::move(keepalive);
  batch->done = std::move(done);
  // One statement per ttl (a tick's renewals mostly share one), in chunks.
  std::map<long long, std::vector<std::size_t>> by_ttl;
  for (std::size_t i = 0; i < locks.size(); ++i) by_ttl[locks[i].ttl.count()].push_back(i);
  std::size_t statements = 0;
  for (auto& [ttl_ms, members] : by_ttl) {
    for (std::size_t from = 0; from < members.size(); from += kRenewChunk) {
      std::size_t to = std::min(members.size(), from + kRenewChunk);
      renew_group(batch, std::vector<std::size_t>(members.begin() + from, members.begin() + to),
                  std::chrono::milliseconds(ttl_ms));
      ++statements;
    }
  }
  return statements;
}

void SqlStore::renew_group(std::shared_ptr<RenewBatch> batch, std::vector<std::size_t> members,
                           std::chrono::milliseconds ttl) {
  std::string sql = fmt::format(
      "UPDATE {} SET expires_at = NOW(6) + INTERVAL {} MICROSECOND WHERE expires_at > NOW(6) AND (lock_name, owner) IN (",
      table_, micros(ttl));
  for (std::size_t k = 0; k < members.size(); ++k) {
    const LockRef& l = batch->locks[members[k]];
    if (k > 0) sql += ',';
    sql += '(';
    sql += hex(l.name);
    sql += ',';
    sql += hex(l.token);
    sql += ')';
  }
  sql += ')';
  renew_->query(std::move(sql), [this, batch, members = std::move(members)](const SqlResult& r,
                                                                           std::exception_ptr err) mutable {
    if (err) {
      std::string why = what_of(err);
      for (std::size_t i : members) batch->done(i, Renewed::kTransient, why);
      return;
    }
    if (r.affected == members.size()) {
      for (std::size_t i : members) batch->done(i, Renewed::kYes, {});
      return;
    }
    classify_renewals(std::move(batch), std::move(members));
  });
}

void SqlStore::classify_renewals(std::shared_ptr<RenewBatch> batch, std::vector<std::size_t> members) {
  // Some were not renewed: after the write that decided, read who holds
  // each. A row that is ours and unexpired now was renewed (only our
  // token extends it); another owner's unexpired row was taken; anything
  // else expired.
  std::string sql = fmt::format("SELECT lock_name, owner, expires_at > NOW(6) FROM {} WHERE lock_name IN (", table_);
  for (std::size_t k = 0; k < members.size(); ++k) {
    if (k > 0) sql += ',';
    sql += hex(batch->locks[members[k]].name);
  }
  sql += ')';
  renew_->query(std::move(sql), [batch, members = std::move(members)](const SqlResult& r, std::exception_ptr err) {
    if (err) {
      std::string why = what_of(err);
      for (std::size_t i : members) batch->done(i, Renewed::kTransient, why);
      return;
    }
    std::map<std::string_view, const std::vector<std::string>*> rows;
    for (const auto& row : r.rows)
      if (row.size() == 3) rows[row[0]] = &row;
    for (std::size_t i : members) {
      const LockRef& l = batch->locks[i];
      auto it = rows.find(l.name);
      if (it == rows.end()) {
        batch->done(i, Renewed::kGone, {});
        continue;
      }
      const auto& row = *it->second;
      bool live = row[2] == "1";
      if (live && row[1] == l.token)
        batch->done(i, Renewed::kYes, {});
      else if (live && !row[1].empty())
        batch->done(i, Renewed::kTakenByOther, {});
      else
        batch->done(i, Renewed::kGone, {});
    }
  });
}

void SqlStore::release(std::span<const LockRef> locks, bool /*notify: no release notices on SQL*/, ReleaseDone done) {
  auto shared_done = std::make_shared<ReleaseDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    std::string n = hex(locks[i].name);
    std::string t = hex(locks[i].token);
    SqlConnection& conn = command_connection();
    auto released = std::make_shared<int>(-1);  // -1 unknown, 0 not by this statement, 1 released
    conn.query(fmt::format("UPDATE {} SET owner = '', expires_at = NOW(6) WHERE lock_name = {} AND owner = {} "
                           "AND expires_at > NOW(6)",
                           table_, n, t),
               [i, shared_done, released](const SqlResult& r, std::exception_ptr err) {
                 if (err) {
                   *released = -1;
                   (*shared_done)(i, Released::kUnconfirmed, what_of(err));
                   return;
                 }
                 *released = r.affected == 1 ? 1 : 0;
                 if (*released == 1) (*shared_done)(i, Released::kYes, {});
               });
    // In the same round trip: who holds it, for a release that found it
    // no longer ours.
    conn.query(fmt::format("SELECT owner <> '' AND owner <> {} AND expires_at > NOW(6) FROM {} WHERE lock_name = {}", t,
                           table_, n),
               [i, shared_done, released](const SqlResult& r, std::exception_ptr) {
                 if (*released != 0) return;
                 bool other = !r.rows.empty() && !r.rows[0].empty() && r.rows[0][0] == "1";
                 (*shared_done)(i, other ? Released::kTakenByOther : Released::kGone, {});
               });
  }
}

void SqlStore::raise_fence(std::string_view name, std::uint64_t fence, std::function<void(bool)> done) {
  command_connection().query(
      fmt::format("INSERT INTO {} (lock_name, owner, fence, expires_at) VALUES ({}, '', {}, NOW(6)) "
                  "ON DUPLICATE KEY UPDATE fence = GREATEST(fence, VALUES(fence))",
                  table_, hex(name), fence),
      [done = std::move(done)](const SqlResult&, std::exception_ptr err) { done(!err); });
}

void SqlStore::server_time(std::function<void(std::chrono::system_clock::time_point, std::exception_ptr)> done) {
  command_connection().query("SELECT UNIX_TIMESTAMP(NOW(6))",
                             [this, done = std::move(done)](const SqlResult& r, std::exception_ptr err) {
                               if (!err && (r.rows.empty() || r.rows[0].empty()))
                                 err = std::make_exception_ptr(SqlError(target_.name(), 0, "no answer to NOW(6)"));
                               done(err ? std::chrono::system_clock::time_point{} : unix_time(r.rows[0][0]), err);
                             });
}

void SqlStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                            std::chrono::system_clock::time_point start, std::function<void(const ClaimResult&)> done) {
  // The claim is one conditional write: the lease is ours and unexpired,
  // the store's clock has reached the period's start, and no period as
  // late was run. The select after it (same round trip) reads the clock
  // and, when the write did nothing, which condition failed.
  std::string n = hex(name);
  std::string t = hex(token);
  auto claimed = std::make_shared<int>(-1);
  SqlConnection& conn = command_connection();
  conn.query(fmt::format("UPDATE {} SET last_period = {} WHERE lock_name = {} AND owner = {} AND expires_at > NOW(6) "
                         "AND NOW(6) >= {} AND (last_period IS NULL OR last_period < {})",
                         table_, period, n, t, datetime_literal(start), period),
             [claimed, done](const SqlResult& r, std::exception_ptr err) {
               if (err) {
                 ClaimResult out;
                 out.error = err;
                 done(out);
                 return;
               }
               *claimed = r.affected == 1 ? 1 : 0;
             });
  conn.query(fmt::format("SELECT UNIX_TIMESTAMP(NOW(6)), owner = {} AND expires_at > NOW(6), NOW(6) >= {}, "
                         "IFNULL(last_period, '') FROM {} WHERE lock_name = {}",
                         t, datetime_literal(start), table_, n),
             [this, claimed, period, done](const SqlResult& r, std::exception_ptr err) {
               if (*claimed < 0) return;  // the claim failed and said so
               ClaimResult out;
               if (!err && (r.rows.empty() || r.rows[0].size() != 4)) {
                 // No row: the job's lock is not there at all.
                 if (*claimed == 0) {
                   out.status = ClaimResult::Status::kNotLeader;
                   out.store_time = std::chrono::system_clock::now();
                   done(out);
                   return;
                 }
                 err = std::make_exception_ptr(SqlError(target_.name(), 0, "the claimed period's row is gone"));
               }
               if (err) {
                 out.error = err;
                 done(out);
                 return;
               }
               const auto& row = r.rows[0];
               out.store_time = unix_time(row[0]);
               out.last = row[3].empty() ? 0 : to_ll(row[3]);
               if (*claimed == 1) {
                 out.status = ClaimResult::Status::kClaimed;
                 out.last = period;
               } else if (row[1] != "1") {
                 out.status = ClaimResult::Status::kNotLeader;
               } else if (!row[3].empty() && out.last >= period) {
                 out.status = ClaimResult::Status::kAlreadyRun;
               } else {
                 out.status = ClaimResult::Status::kNotDue;
               }
               done(out);
             });
}

void SqlStore::inspect(std::string_view name, std::function<void(const LockInfo&, std::exception_ptr)> done) {
  command_connection().query(
      fmt::format("SELECT GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at), 0), fence, owner FROM {} "
                  "WHERE lock_name = {}",
                  table_, hex(name)),
      [done = std::move(done)](const SqlResult& r, std::exception_ptr err) {
        LockInfo info;
        if (!err && !r.rows.empty() && r.rows[0].size() == 3) {
          const auto& row = r.rows[0];
          long long us = to_ll(row[0]);
          info.held = us > 0 && !row[2].empty();
          info.ttl = info.held ? std::chrono::milliseconds((us + 999) / 1000) : std::chrono::milliseconds(0);
          info.fence_counter = static_cast<std::uint64_t>(to_ll(row[1]));
          if (info.held) info.owner = row[2];
        }
        done(info, err);
      });
}

void SqlStore::force_release(std::string_view name, std::function<void(bool, std::exception_ptr)> done) {
  command_connection().query(
      fmt::format("UPDATE {} SET owner = '', expires_at = NOW(6) WHERE lock_name = {} AND owner <> '' "
                  "AND expires_at > NOW(6)",
                  table_, hex(name)),
      [done = std::move(done)](const SqlResult& r, std::exception_ptr err) { done(!err && r.affected == 1, err); });
}

void SqlStore::close() {
  for (auto& c : commands_) c->close();
  renew_->close();
}

}  // namespace lockwatch::detail
