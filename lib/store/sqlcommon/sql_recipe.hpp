// lib/store/sqlcommon/sql_recipe.hpp: the lock recipe the SQL stores
// (MariaDB in store/sql/, PostgreSQL in store/postgresql/) share, written
// once over a dialect and a driver.
//
// Both keep one lock row per name (owner token or a kind's marker, fence,
// expiry) and a holders' table for shared, permit and fair holders. What
// is the same logic in both lives here:
//   - coalescing: the acquisitions asked for in one loop turn are queued
//     (AcquireQueue) and cut at its end into statements: the exclusive
//     ones in name order, kChunk a statement, and the other kinds in name
//     order, kKindGroup a transaction;
//   - retrying: a statement the server answered "retry later" (deadlock,
//     lock wait timeout) goes again, up to kAttempts; an exclusive
//     statement refused for one of its rows goes again lock by lock, so
//     that only that one fails (resend());
//   - outcomes: what an exclusive acquisition that found the row busy is
//     told (a reader's marker: the writer's mark; another kind's marker:
//     refused), and a kind's verdict (taken, busy, refused) as an Acquired;
//   - renewals: the leases of one renew() call cut into statements
//     (renewal_groups()) and answered from what the statement says was not
//     renewed;
//   - connections: two for commands (the least busy takes a statement) and
//     one for renewals, so that a renewal never queues behind a burst of
//     acquisitions (Connections);
//   - the store's flow (RecipeStore): acquire() queues for the turn's end,
//     renew() cuts a call into statements, close() sends what is queued
//     before the connections close; the clock, claims, inspection,
//     listing, withdrawal and forced release are each a named statement
//     of the dialect, run and answered here (below);
//   - answers: a claim's (claims.hpp), an inspection's and a listing's
//     (inspection.hpp), read from the driver's result as Rows
//     (values.hpp), whichever server wrote it.
// The Dialect is data: what the statements of a server can and cannot do.
// The driver is the store's connection type (Connections' parameter, with
// start(), close(), pending(), name(), set_state_hook() and
// execute(name, params, done)) and the store's own steps that write a
// batch's statements and read their answers (RecipeStore's virtual steps).
//
// The named statements each store defines (its dialect's text; MariaDB's
// in sql_store.cpp, PostgreSQL's in pg_statements.cpp): parameters are
// text, names and tokens in hex, numbers in decimal; each answers one
// result, as a transaction where it writes more than one row:
//   lockwatch_time            ()                  -> the clock, µs
//   lockwatch_claim           (name, token, period, start µs)
//                             -> claimed (1), then read_claim()'s columns
//   lockwatch_inspect         (name)              -> Inspection::lock_answer()
//   lockwatch_holders         (name)              -> Inspection::holders_answer()
//   lockwatch_list            (LIKE pattern, limit) -> the held names
//   lockwatch_force_release   (name, channel)     -> a row when it was held
//   lockwatch_withdraw        (name, token, channel)
//   lockwatch_lock_rows       (names)             -> the lock rows locked, in
//                             a transaction's first statement (execute_all())
//   lockwatch_acquire_kind    (name, token, ttl µs, marker, n: 0 shared)
//   lockwatch_acquire_fair    (name, token, ttl µs, marker, channel)
//                             -> kind_answer()'s row
//
// Threading: the store's loop thread, as the stores. Costs: the queued
// acquisitions' names and tokens are copied once (the caller's views end
// with its call); one virtual call a statement.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/loop.hpp"
#include "core/turn_end.hpp"
#include "lockwatch/errors.hpp"
#include "store/capabilities.hpp"
#include "store/kind_rules.hpp"
#include "store/lock_store.hpp"
#include "store/sqlcommon/batching.hpp"
#include "store/sqlcommon/claims.hpp"
#include "store/sqlcommon/connection_core.hpp"
#include "store/sqlcommon/inspection.hpp"
#include "store/sqlcommon/settings.hpp"
#include "store/store_base.hpp"

namespace lockwatch::detail::sqlcommon {

// A statement the server answered "retry later" goes out at most this often.
inline constexpr int kAttempts = 3;
// The kinds' acquisitions one transaction carries at most (a whole set of
// lockwatch::max_set_keys fits).
inline constexpr std::size_t kKindGroup = 64;
// How long a writer's mark stops new readers after its last attempt (the
// writer's ttl if shorter), as on Redis.
inline constexpr std::chrono::milliseconds kWriterMark{2000};

// What the recipe asks of a server's statements.
struct Dialect {
  // One acquire statement may name a lock twice, its rows applied in
  // order (MariaDB's INSERT ... ON DUPLICATE KEY UPDATE). Without it
  // (PostgreSQL's ON CONFLICT updates a row once per statement) the k-th
  // request for a name in a turn goes in the k-th statement.
  bool repeated_names = false;
  // One renew statement carries a ttl per lease (PostgreSQL's arrays);
  // without it, one statement per ttl.
  bool ttl_per_lease = false;
};

// One acquisition, kept until its statement is answered: owned copies.
struct PendingAcquire {
  std::string name;
  std::string token;
  std::chrono::milliseconds ttl;
  LockKind kind;
  bool waits;                                    // LockRef::waits
  std::size_t index;                             // in its call's batch
  std::shared_ptr<LockStore::AcquireDone> done;  // its call's callback

  void answer(const Acquired& out) const { (*done)(index, out); }
};

// The acquisitions one statement (or one kind's transaction) carries, in
// name order: every statement locks rows in one order.
struct AcquireBatch {
  std::vector<PendingAcquire> locks;
  int attempt = 1;

  // Every lock of the batch answered with `error`.
  void fail(const StoreError& error) const;
};
using AcquireBatchPtr = std::shared_ptr<AcquireBatch>;
using SendBatch = std::function<void(AcquireBatchPtr)>;

// The acquisitions of one loop turn, queued by acquire() and cut into
// statements by flush() at the turn's end (the other kinds first).
class AcquireQueue {
 public:
  AcquireQueue(Dialect dialect, SendBatch exclusive, SendBatch kinds)
      : dialect_(dialect), exclusive_(std::move(exclusive)), kinds_(std::move(kinds)) {}
  // Queues each lock of an acquire() call; false when there was none.
  bool add(std::span<const LockRef> locks, LockStore::AcquireDone done);
  // Sends what was queued.
  void flush();

 private:
  Dialect dialect_;
  SendBatch exclusive_;
  SendBatch kinds_;
  std::vector<PendingAcquire> exclusive_queue_;
  std::vector<PendingAcquire> kind_queue_;
};

// A batch (anything with an `attempt` count) whose statement the server
// answered "retry later" (a deadlock, a lock wait timeout) goes to `send`
// again while attempts are left: true when it went.
template <class Batch, class Send>
bool retry_later(const std::shared_ptr<Batch>& batch, const StoreError& error, const Send& send) {
  if (error.kind != StoreError::Kind::kRetryLater || batch->attempt >= kAttempts) return false;
  ++batch->attempt;
  send(batch);
  return true;
}

// A batch whose statement failed with `error`: sent again through `send`
// (true) when the server asked to retry later and attempts are left, or,
// with `split` and several locks, refused (each lock again on its own, so
// that only the one at fault fails); false when the batch is to fail.
bool resend(const AcquireBatchPtr& batch, const StoreError& error, const SendBatch& send, bool split);

// An exclusive acquisition (`out` busy) found its row held by `marker`, a
// kind's marker. Readers': the writer's mark holds new ones back; it lives
// min(kWriterMark, ttl) (returned: the store writes or renews it) and the
// writer comes back within half of that, so it keeps the mark while it
// waits and one that stops waiting holds readers back briefly. Another
// kind's: the call is refused (refusal(), by `server`; none returned).
std::optional<std::chrono::milliseconds> exclusive_busy(Acquired& out, const PendingAcquire& lock,
                                                        std::string_view marker, const std::string& server);

// The refusal of `lock` by `server`: its key is held as the lock row's
// `owner` says (a kind's marker; anything else: exclusive).
StoreError refusal(const std::string& server, const PendingAcquire& lock, std::string_view owner);

// The Acquired of a kind's `lock` from its decision's row (no row: no
// answer from `server`): the verdict (t, or r for a retry: taken, with
// the fence; b: busy for the µs given (none: a moment), at least 1 ms, a
// fair waiter within a third of its ttl, which keeps its place; e:
// refused, the key held as the owner says), the fence, the µs, the lock
// row's owner.
Acquired kind_answer(const PendingAcquire& lock, const Rows& rows, const std::string& server);

// One lock of a release() call, kept until its statement is answered.
struct PendingRelease {
  std::string name;
  std::string token;
  std::size_t index;                             // in its call's batch
  std::shared_ptr<LockStore::ReleaseDone> done;  // its call's callback
  LockKind kind{};

  void answer(Released status, const StoreError* error) const { (*done)(index, status, error); }
};

// The releases one statement carries (all with notices, or none; all
// exclusive, or none: a kind's go in a transaction of their own).
struct ReleaseBatch {
  std::vector<PendingRelease> locks;
  bool notify = false;
  int attempt = 1;
  std::vector<int> before;  // how each lock stood before the write, for a store that reads first

  // Every lock answered `status`.
  void answer(Released status, const StoreError* error) const {
    for (const auto& l : locks) l.answer(status, error);
  }
};

// The locks of one release() call, kept (owned copies), each added to
// `exclusive` or to `kinds` as its kind is, in the call's order.
void split_releases(std::span<const LockRef> locks, LockStore::ReleaseDone done,
                    std::vector<PendingRelease>& exclusive, std::vector<PendingRelease>& kinds);

// The leases of one renew() call, kept until every one was answered.
struct RenewBatch {
  std::vector<LockRef> locks;  // views, valid while keepalive lives
  std::shared_ptr<const void> keepalive;
  LockStore::RenewDone done;

  // Each of `members` answered `status`.
  void answer(const std::vector<std::size_t>& members, Renewed status, const StoreError* error) const {
    for (std::size_t i : members) done(i, status, error);
  }
};
using RenewBatchPtr = std::shared_ptr<RenewBatch>;

// Cuts a renew() call into statements: exclusive leases apart from the
// other kinds', in name order, kChunk a statement (and one ttl a
// statement without Dialect::ttl_per_lease). `send(batch, members, ttl,
// kinds)` writes each; returns the number of statements.
std::size_t renewal_groups(
    const Dialect& dialect, std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
    LockStore::RenewDone done,
    const std::function<void(RenewBatchPtr, std::vector<std::size_t>, std::chrono::milliseconds, bool)>& send);

// The store's connections: two for commands, one for renewals. `Driver`
// is the store's connection type.
template <class Driver>
struct Connections {
  static constexpr int kCommands = 2;
  std::vector<std::unique_ptr<Driver>> commands;
  std::unique_ptr<Driver> renew;

  // Makes them, each Driver(args...); none connects before start().
  template <class... Args>
  void make(Args&... args) {
    for (int i = 0; i < kCommands; ++i) commands.push_back(std::make_unique<Driver>(args...));
    renew = std::make_unique<Driver>(args...);
  }
  // Starts them; the first command connection speaks for the server
  // (`events.connection`).
  void start(const StoreEvents& events) {
    commands.front()->set_state_hook([this, &events](bool up, const std::string& why) {
      if (events.connection) events.connection(commands.front()->name(), up, why);
    });
    for (auto& c : commands) c->start();
    renew->start();
  }
  // The command connection with the fewest statements pending.
  Driver& command() { return least_pending(commands); }
  void close() {
    for (auto& c : commands) c->close();
    renew->close();
  }
};

// What a SQL store does the same way on either server, over its
// `Connection`: the store (derived) writes each step's statements and
// reads their answers in the virtual steps, and answers the rest of
// LockStore and its capabilities itself.
template <class Connection>
class RecipeStore : public StoreBase,
                    public JobClaims,
                    public OperatorTools,
                    public LockListing,
                    public FairQueue {
 public:
  // The lock_name column's size: longer names (prefix + key) are refused.
  static constexpr std::size_t kMaxNameBytes = 255;
  // Throws InvalidArgument when `settings` leave no room for a key in the
  // `server` lock table's lock_name. Any thread.
  static void check_prefix(const SqlSettings& settings, const std::string& server) {
    if (settings.key_prefix.size() >= kMaxNameBytes)
      throw InvalidArgument("Options::runtime.key_prefix leaves no room for a key in the " + server +
                            " lock table's 255-byte lock_name");
  }

  // Queued: the acquisitions of one turn go out together at its end.
  void acquire(std::span<const LockRef> locks, AcquireDone done) final {
    if (acquires_.add(locks, std::move(done))) turn_end_.request();
  }
  // In statements as renewal_groups() cuts them.
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) final {
    return renewal_groups(dialect_, locks, std::move(keepalive), std::move(done),
                          [this](RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl,
                                 bool kinds) { renew_group(std::move(batch), std::move(members), ttl, kinds); });
  }
  // The held names under the prefix, each then inspected.
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) final {
    command_connection().execute(
        "lockwatch_list", {to_hex(like_prefix(encode(prefix))), std::to_string(limit)},
        [this, done = std::move(done)](const Rows& rows, const StoreError* err) mutable {
          if (err) return done({}, err);
          list_inspected(*this, names_of(rows), traits().keys.prefix.size(), std::move(done));
        });
  }
  // The server's clock (its one cell).
  void server_time(TimeDone done) final {
    command_connection().execute("lockwatch_time", {}, [this, done = std::move(done)](const Rows& rows,
                                                                                      const StoreError* err) {
      if (err) return done({}, err);
      if (rows.null(0, 0)) {
        const StoreError missing = no_answer("the clock's reading");
        return done({}, &missing);
      }
      done(from_micros(rows.micros(0, 0)), nullptr);
    });
  }
  // One conditional write, read back in the same round trip (claims.hpp).
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) final {
    command_connection().execute(
        "lockwatch_claim", {to_hex(name), to_hex(token), std::to_string(period), std::to_string(to_micros(start))},
        [this, period, done = std::move(done)](const Rows& rows, const StoreError* err) {
          ClaimResult out;
          if (err || rows.size() != 1) {
            out.error = err ? *err : no_answer("the claim");
            return done(out);
          }
          read_claim(out, rows, 1, rows.at(0, 0) == "1", period);
          done(out);
        });
  }
  // The lock row, then the live holders' rows, in one round trip.
  void inspect(std::string_view name, InspectDone done) final {
    auto answer = std::make_shared<Inspection>(std::move(done));
    Connection& conn = command_connection();
    conn.execute("lockwatch_inspect", {to_hex(name)},
                 [answer](const Rows& rows, const StoreError* err) { answer->lock_answer(rows, err); });
    conn.execute("lockwatch_holders", {to_hex(name)},
                 [answer](const Rows& rows, const StoreError* err) { answer->holders_answer(rows, err); });
  }
  // One transaction on the lock's row: it answers a row when anyone held it.
  void force_release(std::string_view name, ForceDone done) final {
    command_connection().execute("lockwatch_force_release", {to_hex(name), channel_},
                                 [done = std::move(done)](const Rows& rows, const StoreError* err) {
                                   done(!err && rows.size() == 1, err);
                                 });
  }
  // FairQueue: the waiter's row goes, in one transaction on the lock's row.
  void withdraw(const LockRef& lock, WithdrawDone done) final {
    command_connection().execute("lockwatch_withdraw", {to_hex(lock.name), to_hex(lock.token), channel_},
                                 [done = std::move(done)](const Rows&, const StoreError* err) { done(err); });
  }
  // A kind's locks go at once, in one batch; the exclusive ones at the
  // turn's end (turn_ended()).
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) final {
    auto& queue = notify ? releases_ : quiet_releases_;
    std::vector<PendingRelease> kinds;
    split_releases(locks, std::move(done), queue, kinds);
    if (!kinds.empty()) send_releases(std::move(kinds), notify, false);
    if (!queue.empty()) turn_end_.request();
  }
  // What is queued goes to the connections, which fail it as they close:
  // every callback runs.
  void close() override {
    turn_end_.close();
    turn_ended();
    connections_.close();
  }

 protected:
  // Every kind; `too_long` refuses a longer name than kMaxNameBytes;
  // release notices go out on `channel` (none: release_events() false).
  RecipeStore(Loop& loop, const SqlSettings& settings, Dialect dialect, const char* too_long, std::string channel)
      : StoreBase(StoreTraits{.keys = KeyRules{.prefix = settings.key_prefix,
                                               .max_name = kMaxNameBytes,
                                               .too_long = too_long},
                              .release_events = !channel.empty(),
                              .no_shared = nullptr,
                              .no_permits = nullptr}),
        loop_(loop),
        settings_(settings),
        dialect_(dialect),
        channel_(std::move(channel)) {}
  void started() override {
    turn_end_.open();
    connections_.start(events_);
  }
  Connection& command_connection() { return connections_.command(); }
  // The server, as errors name it.
  const std::string& server() const { return connections_.commands.front()->name(); }
  // A statement's answer that lacks what it must hold.
  StoreError no_answer(std::string_view what) const {
    return StoreError::unavailable(server(), fmt::format("no answer to {}", what));
  }
  // A failed statement of exclusive acquisitions: a deadlock or a lock
  // wait timeout sends it again; a row the server refused (a name too
  // long for the column, or one the table's CHECK refuses) sends each
  // lock again on its own, so that only that one fails; else it fails.
  void acquire_failed(const AcquireBatchPtr& batch, const StoreError& error) {
    if (!resend(batch, error, [this](AcquireBatchPtr b) { acquire_batch(std::move(b)); }, true)) batch->fail(error);
  }

  // The steps the store writes: a batch of exclusive acquisitions (one
  // statement), a group of renewals (`ttl` theirs without
  // Dialect::ttl_per_lease), and a batch of releases (all exclusive, or
  // all a kind's).
  virtual void acquire_batch(AcquireBatchPtr batch) = 0;
  virtual void renew_group(RenewBatchPtr batch, std::vector<std::size_t> members, std::chrono::milliseconds ttl,
                           bool kinds) = 0;
  virtual void release_batch(std::shared_ptr<ReleaseBatch> batch) = 0;

  Loop& loop_;
  const SqlSettings settings_;
  const Dialect dialect_;
  const std::string channel_;  // where release notices go out (none: the store sends none)
  Connections<Connection> connections_;

 private:
  // The other kinds' acquisitions of one group, in one transaction: their
  // lock rows locked, in name order, then each one's decision. A failure
  // undid them all: a deadlock or a lock wait timeout sends it again.
  void send_kind_group(AcquireBatchPtr group) {
    const auto& l = group->locks;
    std::vector<Call> calls;
    calls.reserve(l.size() + 1);
    calls.push_back({"lockwatch_lock_rows", {array_literal(l.size(), [&](std::size_t i) -> std::string_view {
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
        [this, group, outcomes](std::size_t i, const Rows& rows) {
          if (i > 0) (*outcomes)[i - 1] = kind_answer(group->locks[i - 1], rows, server());  // 0: the lock rows
        },
        [this, group, outcomes](const Rows&, const StoreError* err) {
          if (err && resend(group, *err, [this](AcquireBatchPtr b) { send_kind_group(std::move(b)); }, false)) return;
          if (err) return group->fail(*err);
          for (std::size_t k = 0; k < group->locks.size(); ++k) group->locks[k].answer((*outcomes)[k]);
        });
  }
  // The turn's end: its acquisitions, then its releases.
  void turn_ended() {
    acquires_.flush();
    for (bool notify : {true, false})
      send_releases(std::exchange(notify ? releases_ : quiet_releases_, {}), notify, true);
  }
  // `all` in name order, as every statement locks rows: kChunk a batch
  // when `chunked`, else one.
  void send_releases(std::vector<PendingRelease> all, bool notify, bool chunked) {
    if (all.empty()) return;
    by_name(all);
    const auto send = [this, notify](std::vector<PendingRelease> part) {
      auto batch = std::make_shared<ReleaseBatch>();
      batch->notify = notify;
      batch->locks = std::move(part);
      release_batch(std::move(batch));
    };
    if (chunked) return in_chunks(all, send);
    send(std::move(all));
  }

  AcquireQueue acquires_{dialect_, [this](AcquireBatchPtr b) { acquire_batch(std::move(b)); },
                         [this](AcquireBatchPtr b) { send_kind_group(std::move(b)); }};
  // Releases asked for in this loop turn, sent together at its end.
  std::vector<PendingRelease> releases_;        // with release notices
  std::vector<PendingRelease> quiet_releases_;  // without
  TurnEnd turn_end_{[this] { turn_ended(); }};
};

}  // namespace lockwatch::detail::sqlcommon
