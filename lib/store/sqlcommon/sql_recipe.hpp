// lib/store/sqlcommon/sql_recipe.hpp: the lock recipe the SQL stores
// (MariaDB in store/sql/, PostgreSQL in store/postgresql/) share, written
// once over a dialect and a driver (what each part does:
// docs/how-it-works.md, "Adding a store"): the acquisitions of one loop
// turn queued and cut at its end into statements (send_acquisitions(): the
// exclusive ones kChunk a statement, the other kinds kKindGroup a
// transaction, each in name order), retried (resend(), up to kAttempts),
// answered (answer_acquisitions(), kind_answer()); renewals and releases
// cut into statements (RecipeStore::renew(), release batches) and answered
// from what was not done (not_done()); two command connections and one
// for renewals, so that a renewal never queues behind a burst of
// acquisitions (Connections); the store's flow (RecipeStore), with claims
// and inspection and listing (inspection.hpp) read from the
// driver's result as Rows (values.hpp).
// The Dialect is data: what the statements of a server can and cannot do.
// The driver is the store's connection type (Connections' parameter, with
// start(), close(), pending(), name(), set_state_hook(),
// execute(name, params, done) and execute_all(calls, each, done)).
//
// The named statements each store defines (its dialect's text; MariaDB's
// in sql_store.cpp, PostgreSQL's in pg_statements.cpp): parameters are
// text, names and tokens in hex, numbers in decimal, a batch's as arrays
// (array_literal(), names[] and so on), in the batch's order; each answers
// one result, as a transaction where it writes more than one row:
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
//   lockwatch_acquire         (names[], tokens[], ttls µs[], waits[] 1/0)
//                             -> answer_acquisitions()'s rows
//   lockwatch_renew           (names[], tokens[], ttls µs[])
//   lockwatch_renew_kind      (names[], tokens[], ttls µs[], markers[])
//   lockwatch_release         (names[], tokens[], notify t/f, channel)
//   lockwatch_release_kind    (names[], tokens[], markers[], notify t/f, channel)
//                             -> not_done()'s rows
//
// Threading: the store's loop thread, as the stores. Costs: the queued
// acquisitions' names and tokens are copied once (the caller's views end
// with its call).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
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
#include "store/registry.hpp"
#include "store/sqlcommon/connection_core.hpp"
#include "store/sqlcommon/inspection.hpp"
#include "store/sqlcommon/settings.hpp"
#include "store/store_base.hpp"

namespace lockwatch::detail::sqlcommon {

// The locks one statement carries at most. Every statement takes its rows
// in name order (by_name()), so that two statements never wait on each
// other's rows in opposite orders.
inline constexpr std::size_t kChunk = 512;

// Hands `send` the items of `all`, `size` (kChunk) at a time, in their order.
template <class T, class Send>
void in_chunks(std::vector<T>& all, Send&& send, std::size_t size = kChunk) {
  for (std::size_t from = 0; from < all.size(); from += size) {
    const std::size_t to = std::min(all.size(), from + size);
    send(std::vector<T>(std::make_move_iterator(all.begin() + from), std::make_move_iterator(all.begin() + to)));
  }
}

// Sorts `all` by name (stably: a name's requests keep their order).
template <class T>
void by_name(std::vector<T>& all) {
  std::stable_sort(all.begin(), all.end(), [](const T& a, const T& b) { return a.name < b.name; });
}

// A statement the server answered "retry later" goes out at most this often.
inline constexpr int kAttempts = 3;
// The kinds' acquisitions one transaction carries at most (a whole set of
// lockwatch::max_set_keys fits).
inline constexpr std::size_t kKindGroup = 64;

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

// One lock of an acquire() or release() call (`Done` its callback's
// type), kept until its statement is answered: owned copies.
template <class Done>
struct Pending {
  std::string name;
  std::string token;
  std::chrono::milliseconds ttl;
  LockKind kind;
  bool waits;                  // LockRef::waits
  std::size_t index;           // in its call's batch
  std::shared_ptr<Done> done;  // its call's callback

  template <class... Answer>
  void answer(const Answer&... out) const {
    (*done)(index, out...);
  }
};
using PendingAcquire = Pending<LockStore::AcquireDone>;
using PendingRelease = Pending<LockStore::ReleaseDone>;

// The locks of one call, kept (owned copies), each added to `exclusive`
// or to `kinds` as its kind is, in the call's order.
template <class Done>
void split_locks(std::span<const LockRef> locks, Done done, std::vector<Pending<Done>>& exclusive,
                 std::vector<Pending<Done>>& kinds) {
  auto shared_done = std::make_shared<Done>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    const LockRef& l = locks[i];
    (l.kind.exclusive_kind() ? exclusive : kinds)
        .push_back({std::string(l.name), std::string(l.token), l.ttl, l.kind, l.waits, i, shared_done});
  }
}

// The acquisitions or releases one statement (or one transaction)
// carries, in name order: every statement locks rows in one order. A
// release batch is all with notices, or none; all exclusive, or none (a
// kind's go in a transaction of their own).
template <class Pending>
struct Batch {
  std::vector<Pending> locks;
  bool notify = false;
  int attempt = 1;

  // A batch of `part`.
  static std::shared_ptr<Batch> of(std::vector<Pending> part, bool notify = false) {
    return std::make_shared<Batch>(Batch{std::move(part), notify});
  }
  // Every lock answered the same.
  template <class... Answer>
  void answer(const Answer&... out) const {
    for (const auto& l : locks) l.answer(out...);
  }
};
using AcquireBatch = Batch<PendingAcquire>;
using ReleaseBatch = Batch<PendingRelease>;
using AcquireBatchPtr = std::shared_ptr<AcquireBatch>;

// An exclusive acquisition (`out` busy) found its row held by `marker`, a
// kind's marker. Readers': the writer's mark holds new ones back; it lives
// min(kinds::kWriterMark, ttl) (the statement wrote or renewed it) and the
// writer comes back within half of that, so it keeps the mark while it
// waits and one that stops waiting holds readers back briefly. Another
// kind's: the call is refused (refusal(), by `server`).
void exclusive_busy(Acquired& out, const PendingAcquire& lock, std::string_view marker, const std::string& server);

// Answers each exclusive acquisition of `batch` from lockwatch_acquire's
// rows (each: the lock's position in the batch, from 1; the fence when it
// was taken, else NULL; the µs it is busy for (NULL: a moment); a kind's
// marker that holds it, else NULL). A lock left out fails, by `server`.
void answer_acquisitions(const AcquireBatch& batch, const Rows& rows, const std::string& server);

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

// The leases of one renew() call, kept until every one was answered.
struct RenewBatch {
  std::vector<LockRef> locks;  // views, valid while keepalive lives
  std::shared_ptr<const void> keepalive;
  LockStore::RenewDone done;
};
using RenewBatchPtr = std::shared_ptr<RenewBatch>;

// Each of `n` locks' status: `yes`, but those a renewal's or a release's
// rows name (the lock's position in the batch, from 1; whether another
// owner holds it): `taken` or `gone`.
template <class Status>
std::vector<Status> not_done(const Rows& rows, std::size_t n, Status yes, Status taken, Status gone) {
  std::vector<Status> status(n, yes);
  for (int r = 0; r < rows.size(); ++r) {
    const long long k = to_ll(rows.at(r, 0)) - 1;
    if (k >= 0 && k < static_cast<long long>(n)) status[k] = rows.yes(r, 1) ? taken : gone;
  }
  return status;
}

// A batch's arrays: the names and tokens of the `n` locks lock(0)..,
// then (with `ttls`) their ttls in µs and (with `markers`) their kinds'
// markers.
template <class Lock>
std::vector<std::string> lock_arrays(std::size_t n, Lock lock, bool ttls, bool markers) {
  std::vector<std::string> out{array_literal(n, [&](std::size_t i) -> std::string_view { return lock(i).name; }),
                               array_literal(n, [&](std::size_t i) -> std::string_view { return lock(i).token; })};
  if (ttls) out.push_back(array_literal(n, [&](std::size_t i) { return micros(lock(i).ttl); }));
  if (markers) out.push_back(array_literal(n, [&](std::size_t i) { return kinds::marker(lock(i).kind); }));
  return out;
}

// The store's connections: two for commands, one for renewals. `Driver`
// is the store's connection type.
template <class Driver>
struct Connections {
  static constexpr int kCommands = 2;
  std::vector<std::unique_ptr<Driver>> all;  // the command connections, then the renewal one

  // Makes them over `target`, each with `session`: the list of the
  // sessions left behind one they share, the table named database.table
  // in messages. None connects before start().
  template <class Target, class Id>
  void make(Loop& loop, const Target& target, const SqlSettings& settings, Session<Id> session) {
    session.table = fmt::format("{}.{}", target.database, target.table);
    session.stale = std::make_shared<StaleSessions<Id>>();
    for (int i = 0; i <= kCommands; ++i) all.push_back(std::make_unique<Driver>(loop, target, settings, session));
  }
  // Starts them; the first command connection speaks for the server
  // (`events.connection`).
  void start(const StoreEvents& events) {
    all.front()->set_state_hook([this, &events](bool up, const std::string& why) {
      if (events.connection) events.connection(all.front()->name(), up, why);
    });
    for (auto& c : all) c->start();
  }
  // The command connection with the fewest statements pending (the first on a tie).
  Driver& command() {
    return **std::min_element(all.begin(), all.begin() + kCommands,
                              [](const auto& a, const auto& b) { return a->pending() < b->pending(); });
  }
  Driver& renew() { return *all.back(); }
  void close() {
    for (auto& c : all) c->close();
  }
};

// What a SQL store does the same way on either server, over its
// `Connection`: every step runs the dialect's named statements; the store
// (derived) defines them and answers the rest of LockStore and its
// capabilities itself.
template <class Connection>
class RecipeStore : public StoreBase,
                    public JobClaims,
                    public OperatorTools,
                    public LockListing,
                    public FairQueue {
 public:
  // The lock_name column's size: longer names (prefix + key) are refused.
  static constexpr std::size_t kMaxNameBytes = 255;

  // Queued: the acquisitions of one turn go out together at its end.
  void acquire(std::span<const LockRef> locks, AcquireDone done) final {
    split_locks(locks, std::move(done), exclusive_queue_, kind_queue_);
    if (!locks.empty()) turn_end_.request();
  }
  // In statements (renew_group()): exclusive leases apart from the other
  // kinds', in name order, kChunk a statement (and one ttl a statement
  // without Dialect::ttl_per_lease).
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) final {
    auto batch = std::make_shared<RenewBatch>(
        RenewBatch{{locks.begin(), locks.end()}, std::move(keepalive), std::move(done)});
    std::vector<std::size_t> order(locks.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return locks[a].name < locks[b].name; });
    // Exclusive leases first (false < true), then by ttl where a statement has one.
    std::map<std::pair<bool, long long>, std::vector<std::size_t>> groups;
    for (std::size_t i : order)
      groups[{!locks[i].kind.exclusive_kind(), dialect_.ttl_per_lease ? 0 : locks[i].ttl.count()}].push_back(i);
    std::size_t statements = 0;
    for (auto& [group, members] : groups)
      in_chunks(members, [&, kinds = group.first](std::vector<std::size_t> part) {
        renew_group(batch, std::move(part), kinds);
        ++statements;
      });
    return statements;
  }
  // The held names under the prefix, each then inspected.
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) final {
    connections_.command().execute(
        "lockwatch_list", {to_hex(like_prefix(encode(prefix))), std::to_string(limit)},
        [this, done = std::move(done)](const Rows& rows, const StoreError* err) mutable {
          if (err) return done({}, err);
          list_inspected(*this, rows, traits().keys.prefix.size(), std::move(done));
        });
  }
  // The server's clock (its one cell).
  void server_time(TimeDone done) final {
    connections_.command().execute("lockwatch_time", {}, [this, done = std::move(done)](const Rows& rows,
                                                                                        const StoreError* err) {
      if (err) return done({}, err);
      if (rows.null(0, 0)) {
        const StoreError missing = no_answer("the clock's reading");
        return done({}, &missing);
      }
      done(from_micros(rows.micros(0, 0)), nullptr);
    });
  }
  // One conditional write, read back in the same round trip (read_claim()).
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) final {
    connections_.command().execute(
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
    Connection& conn = connections_.command();
    conn.execute("lockwatch_inspect", {to_hex(name)},
                 [answer](const Rows& rows, const StoreError* err) { answer->lock_answer(rows, err); });
    conn.execute("lockwatch_holders", {to_hex(name)},
                 [answer](const Rows& rows, const StoreError* err) { answer->holders_answer(rows, err); });
  }
  // One transaction on the lock's row: it answers a row when anyone held it.
  void force_release(std::string_view name, ForceDone done) final {
    connections_.command().execute("lockwatch_force_release", {to_hex(name), channel_},
                                   [done = std::move(done)](const Rows& rows, const StoreError* err) {
                                     done(!err && rows.size() == 1, err);
                                   });
  }
  // FairQueue: the waiter's row goes, in one transaction on the lock's row.
  void withdraw(const LockRef& lock, WithdrawDone done) final {
    connections_.command().execute("lockwatch_withdraw", {to_hex(lock.name), to_hex(lock.token), channel_},
                                   [done = std::move(done)](const Rows&, const StoreError* err) { done(err); });
  }
  // A kind's locks go at once, in one batch; the exclusive ones at the
  // turn's end (turn_ended()).
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) final {
    auto& queue = notify ? releases_ : quiet_releases_;
    std::vector<PendingRelease> kinds;
    split_locks(locks, std::move(done), queue, kinds);
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
  // The server, as errors name it.
  const std::string& server() const { return connections_.all.front()->name(); }
  // A statement's answer that lacks what it must hold.
  StoreError no_answer(std::string_view what) const {
    return StoreError::unavailable(server(), fmt::format("no answer to {}", what));
  }

  Loop& loop_;
  const SqlSettings settings_;
  const Dialect dialect_;
  const std::string channel_;  // where release notices go out (none: the store sends none)
  Connections<Connection> connections_;

 private:
  // A batch whose statement failed with `error`: sent again through `send`
  // when the server answered "retry later" (a deadlock, a lock wait
  // timeout) and attempts are left, or, with `split` and several locks,
  // refused (each lock again on its own, so that only the one at fault
  // fails); else each lock answered `failed`.
  template <class Batch, class... Failed>
  void resend(void (RecipeStore::*send)(std::shared_ptr<Batch>), const std::shared_ptr<Batch>& batch,
              const StoreError& error, bool split, const Failed&... failed) {
    if (error.kind == StoreError::Kind::kRetryLater && batch->attempt < kAttempts) {
      ++batch->attempt;
      return (this->*send)(batch);
    }
    if (!split || batch->locks.size() < 2 || error.kind != StoreError::Kind::kRefused) return batch->answer(failed...);
    for (auto& l : batch->locks) (this->*send)(Batch::of({std::move(l)}));
  }
  // One statement decides a batch of exclusive acquisitions. A deadlock
  // or a lock wait timeout sends it again; a row the server refused (a
  // name too long for the column, or one the table's CHECK refuses) sends
  // each lock again on its own, so that only that one fails; else it fails.
  void acquire_batch(AcquireBatchPtr batch) {
    const auto& l = batch->locks;
    auto params = lock_arrays(l.size(), [&](std::size_t i) -> const PendingAcquire& { return l[i]; }, true, false);
    params.push_back(array_literal(l.size(), [&](std::size_t i) { return l[i].waits ? 1 : 0; }));
    connections_.command().execute(
        "lockwatch_acquire", std::move(params), [this, batch](const Rows& rows, const StoreError* err) {
          if (!err) return answer_acquisitions(*batch, rows, server());
          resend(&RecipeStore::acquire_batch, batch, *err, true, Acquired::failed(*err));
        });
  }
  // A group of renewals, on the renewal connection: each answered as the
  // statement's rows say.
  void renew_group(RenewBatchPtr batch, std::vector<std::size_t> members, bool kinds) {
    auto params = lock_arrays(
        members.size(), [&](std::size_t k) -> const LockRef& { return batch->locks[members[k]]; }, true, kinds);
    connections_.renew().execute(
        kinds ? "lockwatch_renew_kind" : "lockwatch_renew", std::move(params),
        [batch, members](const Rows& rows, const StoreError* err) {
          // A failed statement's rows are none: each lease is transient.
          auto status = not_done(rows, members.size(), Renewed::kYes, Renewed::kTakenByOther, Renewed::kGone);
          for (std::size_t k = 0; k < members.size(); ++k)
            batch->done(members[k], err ? Renewed::kTransient : status[k], err);
        });
  }
  // A batch of releases (all exclusive, or all a kind's), in one statement
  // (a kind's: one transaction) that a deadlock sends again.
  void release_batch(std::shared_ptr<ReleaseBatch> batch) {
    const auto& l = batch->locks;
    const bool of_kinds = !l.front().kind.exclusive_kind();
    auto params =
        lock_arrays(l.size(), [&](std::size_t i) -> const PendingRelease& { return l[i]; }, false, of_kinds);
    params.push_back(batch->notify ? "t" : "f");
    params.push_back(channel_);
    connections_.command().execute(
        of_kinds ? "lockwatch_release_kind" : "lockwatch_release", std::move(params),
        [this, batch](const Rows& rows, const StoreError* err) {
          if (err) return resend(&RecipeStore::release_batch, batch, *err, false, Released::kUnconfirmed, err);
          auto status = not_done(rows, batch->locks.size(), Released::kYes, Released::kTakenByOther, Released::kGone);
          for (std::size_t k = 0; k < status.size(); ++k)
            batch->locks[k].answer(status[k], err);
        });
  }
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
    connections_.command().execute_all(
        std::move(calls),
        [this, group, outcomes](std::size_t i, const Rows& rows) {
          if (i > 0) (*outcomes)[i - 1] = kind_answer(group->locks[i - 1], rows, server());  // 0: the lock rows
        },
        [this, group, outcomes](const Rows&, const StoreError* err) {
          if (err) return resend(&RecipeStore::send_kind_group, group, *err, false, Acquired::failed(*err));
          for (std::size_t k = 0; k < group->locks.size(); ++k) group->locks[k].answer((*outcomes)[k]);
        });
  }
  // The turn's end: its acquisitions, then its releases.
  void turn_ended() {
    send_acquisitions();
    for (bool notify : {true, false})
      send_releases(std::exchange(notify ? releases_ : quiet_releases_, {}), notify, true);
  }
  // The turn's acquisitions: the other kinds' first, kKindGroup a
  // transaction, then the exclusive ones, each in name order.
  void send_acquisitions() {
    auto kinds = std::exchange(kind_queue_, {}), all = std::exchange(exclusive_queue_, {});
    by_name(kinds);
    const auto send_group = [this](std::vector<PendingAcquire> part) {
      send_kind_group(AcquireBatch::of(std::move(part)));
    };
    in_chunks(kinds, send_group, kKindGroup);
    by_name(all);
    const auto send = [this](std::vector<PendingAcquire> part) { acquire_batch(AcquireBatch::of(std::move(part))); };
    if (dialect_.repeated_names) return in_chunks(all, send);
    std::vector<std::vector<PendingAcquire>> rounds;  // the k-th request of each name in the k-th
    for (std::size_t i = 0, j = 0; i < all.size(); i = j) {
      while (j < all.size() && all[j].name == all[i].name) ++j;  // all[i, j): one name's, moved after
      for (std::size_t k = i; k < j; ++k) {
        if (rounds.size() <= k - i) rounds.emplace_back();
        rounds[k - i].push_back(std::move(all[k]));
      }
    }
    for (auto& round : rounds) in_chunks(round, send);
  }
  // `all` in name order, as every statement locks rows: kChunk a batch
  // when `chunked` (none for none), else one (`all` has some).
  void send_releases(std::vector<PendingRelease> all, bool notify, bool chunked) {
    by_name(all);
    const auto send = [this, notify](std::vector<PendingRelease> part) {
      release_batch(ReleaseBatch::of(std::move(part), notify));
    };
    if (chunked) return in_chunks(all, send);
    send(std::move(all));
  }

  // Acquisitions and releases asked for in this loop turn, sent together at its end.
  std::vector<PendingAcquire> exclusive_queue_;
  std::vector<PendingAcquire> kind_queue_;
  std::vector<PendingRelease> releases_;        // with release notices
  std::vector<PendingRelease> quiet_releases_;  // without
  TurnEnd turn_end_{[this] { turn_ended(); }};
};

// The registry's line of a SQL store: a URL parsed as a `Target`, the
// key prefix checked to leave room for a key in the lock table's lock_name
// (`Store::kServer` names the table's server), then Store(loop, target,
// settings).
template <class Store, class Target>
constexpr StoreKind sql_store_kind(std::string_view schemes, std::string_view usage) {
  return {schemes, usage,
          [](const std::string& url, const Options& options) {
            (void)Target::parse(url);
            if (sql_settings(options).key_prefix.size() >= Store::kMaxNameBytes)
              throw InvalidArgument(fmt::format("Options::runtime.key_prefix leaves no room for a key in the {} lock "
                                                "table's 255-byte lock_name",
                                                Store::kServer));
          },
          [](Loop& loop, const std::string& url, const Options& options) -> std::unique_ptr<LockStore> {
            return std::make_unique<Store>(loop, Target::parse(url), sql_settings(options));
          }};
}

}  // namespace lockwatch::detail::sqlcommon
