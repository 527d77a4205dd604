// One Redis node's store against a real redis-server: acquisitions and
// releases asked for in one loop iteration go out as one script call, each
// lock still answered once with its own result, and nothing queued is lost
// when the store closes.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/error_values.hpp"
#include "core/loop.hpp"
#include "lockwatch/errors.hpp"
#include "lockwatch/lockwatch.hpp"
#include "runtime/store_errors.hpp"
#include "store/redis/cluster_slot.hpp"
#include "store/redis/keys.hpp"
#include "store/redis/node_store.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using detail::Acquired;
using detail::LockRef;
using detail::Released;

// The fencing counter of `key`'s slot, as the store names it.
std::string counter_of(const std::string& key) { return detail::redis_keys::counter("lockwatch:", lock_key(key)); }

struct Want {
  std::string key;    // the user's key; the store's name is lock_key(key)
  std::string token;
};

class NodeStoreTest : public ::testing::Test {
 protected:
  explicit NodeStoreTest(Options options = {}) : options_(std::move(options)) {
    Endpoint ep;
    ep.port = server_.port();
    store_ = std::make_unique<detail::RedisNodeStore>(loop_, ep, options_);
    detail::StoreEvents events;
    events.released = [](std::string_view) {};
    events.subscribed = [](std::string_view) {};
    events.subscriptions_lost = [] {};
    events.connection = [](const std::string&, bool, const std::string&) {};
    events.log = [](bool, const std::string&) {};
    loop_.post([this, events] { store_->start(events); });
  }
  ~NodeStoreTest() override { EXPECT_EQ(loop_.shutdown([this] { store_->close(); }), 0); }

  // Asks for every group in `groups` in one loop iteration, one acquire()
  // call per group, and waits for every answer (bounded).
  std::vector<Acquired> acquire(const std::vector<std::vector<Want>>& groups, std::chrono::milliseconds ttl = 10s) {
    std::size_t total = 0;
    for (const auto& g : groups) total += g.size();
    auto results = std::make_shared<std::vector<Acquired>>(total);
    auto answers = std::make_shared<std::vector<int>>(total, 0);
    auto left = std::make_shared<std::size_t>(total);
    std::promise<void> all;
    auto f = all.get_future();
    loop_.post([&, results, answers, left] {
      std::size_t base = 0;
      const std::string ttl_ms = std::to_string(ttl.count());
      for (const auto& g : groups) {
        std::vector<std::string> names;
        for (const auto& w : g) names.push_back(lock_key(w.key));
        std::vector<LockRef> refs;
        for (std::size_t i = 0; i < g.size(); ++i) refs.push_back(LockRef{names[i], g[i].token, ttl_ms, ttl});
        store_->acquire(refs, [&all, results, answers, left, base](std::size_t i, const Acquired& r) {
          (*results)[base + i] = r;
          if (++(*answers)[base + i] == 1 && --*left == 0) all.set_value();
        });
        base += g.size();
      }
    });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    for (int a : *answers) EXPECT_EQ(a, 1) << "each lock is answered exactly once";
    return *results;
  }

  // Releases each (key, token) in one loop iteration, one release() call each.
  std::vector<Released> release(const std::vector<Want>& locks) {
    auto results = std::make_shared<std::vector<Released>>(locks.size(), Released::kUnconfirmed);
    auto left = std::make_shared<std::size_t>(locks.size());
    std::promise<void> all;
    auto f = all.get_future();
    loop_.post([&, results, left] {
      for (std::size_t k = 0; k < locks.size(); ++k) {
        const std::string name = lock_key(locks[k].key);
        LockRef ref{name, locks[k].token, "0", 0ms};
        store_->release(std::span<const LockRef>(&ref, 1), true,
                        [&all, results, left, k](std::size_t, Released r, const lockwatch::detail::StoreError*) {
                          (*results)[k] = r;
                          if (--*left == 0) all.set_value();
                        });
      }
    });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    return *results;
  }

  // Script calls the server has run so far (EVAL and EVALSHA).
  long long script_calls() {
    auto r = server_.command({"INFO", "commandstats"});
    long long calls = 0;
    for (std::string_view cmd : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls="}) {
      auto at = r.str.find(cmd);
      if (at != std::string::npos) calls += std::stoll(r.str.substr(at + cmd.size()));
    }
    return calls;
  }

  RedisServer server_;
  const Options options_;
  detail::Loop loop_;
  std::unique_ptr<detail::RedisNodeStore> store_;
};

TEST_F(NodeStoreTest, OneCallOfManyLocksIsOneScriptCallWithEachLockAnsweredAlone) {
  // Warm the script cache, so that the count below is not an EVALSHA + EVAL pair.
  acquire({{{"warm-a", "t0"}, {"warm-b", "t0"}}});
  server_.command({"SET", lock_key("busy"), "someone", "PX", "60000"});
  server_.command({"SET", lock_key("plain"), "a user's value"});  // no expiry: not a lock
  // Per-name counters as versions before left them: one that is no
  // counter, one at 41.
  server_.command({"HSET", lock_key("badfence") + ":fence", "f", "1"});
  server_.command({"SET", lock_key("counted") + ":fence", "41"});
  const long long before = script_calls();

  auto r = acquire({{{"free-1", "t1"}, {"busy", "t2"}, {"plain", "t3"}, {"badfence", "t4"}, {"counted", "t5"},
                     {"free-2", "t6"}}});
  EXPECT_EQ(script_calls() - before, 1);

  EXPECT_EQ(r[0].status, Acquired::Status::kTaken);
  EXPECT_EQ(r[0].fence, 1u);
  EXPECT_EQ(r[1].status, Acquired::Status::kBusy);
  EXPECT_GT(r[1].busy_for, 50s);
  ASSERT_EQ(r[2].status, Acquired::Status::kFailed);
  EXPECT_THROW(std::rethrow_exception(lockwatch::detail::to_exception(r[2].error)), RedisError);
  EXPECT_NE(r[2].error.describe().find("exists without expiry"), std::string::npos) << r[2].error.describe();
  ASSERT_EQ(r[3].status, Acquired::Status::kFailed);
  EXPECT_NE(r[3].error.describe().find("not a fencing counter"), std::string::npos) << r[3].error.describe();
  EXPECT_EQ(r[4].status, Acquired::Status::kTaken);
  EXPECT_EQ(r[4].fence, 42u);
  EXPECT_EQ(r[5].status, Acquired::Status::kTaken);

  // What was taken is held with its token and ttl; what failed is untouched.
  EXPECT_EQ(server_.command({"GET", lock_key("free-1")}).str, "t1");
  EXPECT_GT(server_.command({"PTTL", lock_key("free-2")}).integer, 5000);
  EXPECT_EQ(server_.command({"GET", lock_key("busy")}).str, "someone");
  EXPECT_EQ(server_.command({"GET", lock_key("plain")}).str, "a user's value");
  EXPECT_EQ(server_.command({"EXISTS", lock_key("badfence")}).integer, 0);
  // The old counter went into the slot's and is gone.
  EXPECT_EQ(server_.command({"GET", counter_of("counted")}).str, "42");
  EXPECT_EQ(server_.command({"EXISTS", lock_key("counted") + ":fence"}).integer, 0);

  // Asked again with the same tokens (a retry after a lost reply), the locks
  // taken answer their tokens again; the others still answer as before.
  auto again = acquire({{{"free-1", "t1"}, {"counted", "t5"}, {"busy", "t2"}}});
  EXPECT_EQ(again[0].status, Acquired::Status::kTaken);
  EXPECT_EQ(again[0].fence, 1u);
  EXPECT_EQ(again[1].status, Acquired::Status::kTaken);
  EXPECT_EQ(again[1].fence, 42u);
  EXPECT_EQ(again[2].status, Acquired::Status::kBusy);
}

// A lone lock goes through the one-lock script: a fencing counter Redis
// refuses (the slot's, or the name's old one) fails the acquisition with
// Redis's error and leaves no lock (the script takes the lock first, then
// gives it back in the same call) and no counter changed.
TEST_F(NodeStoreTest, ALoneLockWhoseCounterRedisRefusesFailsAndLeavesNoLock) {
  for (const std::string& counter : {counter_of("alone"), lock_key("alone") + ":fence"}) {
    server_.command({"HSET", counter, "f", "1"});
    auto r = acquire({{{"alone", "t1"}}});
    ASSERT_EQ(r[0].status, Acquired::Status::kFailed) << counter;
    EXPECT_THROW(std::rethrow_exception(lockwatch::detail::to_exception(r[0].error)), RedisError);
    EXPECT_NE(r[0].error.describe().find("WRONGTYPE"), std::string::npos) << r[0].error.describe();
    EXPECT_EQ(server_.command({"EXISTS", lock_key("alone")}).integer, 0);
    EXPECT_EQ(server_.command({"DBSIZE"}).integer, 1) << "only the refused counter";
    server_.command({"DEL", counter});
  }
  auto again = acquire({{{"alone", "t2"}}});
  EXPECT_EQ(again[0].status, Acquired::Status::kTaken);
  EXPECT_EQ(again[0].fence, 1u);
}

// 20,000 names (as `sku:{0}` makes them) leave one counter per slot they
// use, not one per name: 11,090 for these names (one per name before, so
// 20,000), never more than the 16,384 slots. Each name's tokens still
// rise: every token of a second round is above the name's first.
TEST_F(NodeStoreTest, ManyNamesLeaveOneCounterPerSlotAndEachNamesTokensRise) {
  constexpr int kNames = 20000;
  constexpr int kChunk = 2000;
  std::set<std::uint16_t> slots;
  for (int i = 0; i < kNames; ++i) slots.insert(detail::key_slot(lock_key("sku:" + std::to_string(i))));
  ASSERT_EQ(slots.size(), 11090u);

  std::vector<std::uint64_t> first(kNames);
  std::map<std::uint16_t, std::set<std::uint64_t>> tokens_of_slot;
  for (int round = 0; round < 2; ++round) {
    for (int base = 0; base < kNames; base += kChunk) {
      std::vector<Want> chunk;
      for (int i = base; i < base + kChunk; ++i) chunk.push_back({"sku:" + std::to_string(i), "r" + std::to_string(round)});
      auto r = acquire({chunk});
      for (int k = 0; k < kChunk; ++k) {
        const int i = base + k;
        ASSERT_EQ(r[k].status, Acquired::Status::kTaken) << i;
        if (round == 0) {
          first[i] = r[k].fence;
          // Within a slot, each acquisition has a token of its own.
          EXPECT_TRUE(tokens_of_slot[detail::key_slot(lock_key(chunk[k].key))].insert(r[k].fence).second) << i;
        } else {
          EXPECT_GT(r[k].fence, first[i]) << i;
        }
      }
      for (auto released : release(chunk)) ASSERT_EQ(released, Released::kYes);
    }
  }
  const long long left = server_.command({"DBSIZE"}).integer;
  EXPECT_EQ(left, static_cast<long long>(slots.size()));
  EXPECT_LE(left, detail::kClusterSlots);
  for (std::uint16_t slot : {*slots.begin(), *slots.rbegin()}) {
    const std::string counter = "lockwatch:fence:{" + std::string(detail::slot_tag(slot)) + "}";
    EXPECT_EQ(server_.command({"GET", counter}).str, std::to_string(2 * tokens_of_slot[slot].size())) << counter;
  }
}

// An upgrade from per-name counters: a name whose old counter is ahead of
// its slot's gets tokens above it, alone (the one-lock script) or in a
// batch; the old counter is then gone, and so are tokens at or below it
// for any name of the slot.
TEST_F(NodeStoreTest, AnOldPerNameCounterIsFoldedIntoItsSlotsSoTokensNeverGoBack) {
  // Two names of one slot, and one of another.
  const std::uint16_t slot = detail::key_slot(lock_key("sku:7"));
  std::string twin;
  for (int i = 0; twin.empty(); ++i)
    if (detail::key_slot(lock_key("twin:" + std::to_string(i))) == slot) twin = "twin:" + std::to_string(i);
  ASSERT_EQ(acquire({{{twin, "t0"}}})[0].fence, 1u);  // the slot's counter exists, far behind
  server_.command({"SET", lock_key("sku:7") + ":fence", "1000"});
  server_.command({"SET", lock_key("sku:8") + ":fence", "500"});

  auto alone = acquire({{{"sku:7", "t1"}}});
  ASSERT_EQ(alone[0].status, Acquired::Status::kTaken);
  EXPECT_EQ(alone[0].fence, 1001u);
  EXPECT_EQ(server_.command({"EXISTS", lock_key("sku:7") + ":fence"}).integer, 0);
  EXPECT_EQ(server_.command({"GET", counter_of("sku:7")}).str, "1001");
  ASSERT_EQ(release({{"sku:7", "t1"}, {twin, "t0"}})[0], Released::kYes);

  auto batch = acquire({{{"sku:7", "t2"}, {"sku:8", "t2"}, {twin, "t2"}}});
  EXPECT_EQ(batch[0].fence, 1002u);
  EXPECT_EQ(batch[1].fence, 501u);
  EXPECT_EQ(batch[2].fence, 1003u);
  EXPECT_EQ(server_.command({"EXISTS", lock_key("sku:8") + ":fence"}).integer, 0);
  // An old counter below the slot's changes nothing but goes.
  ASSERT_EQ(release({{"sku:7", "t2"}})[0], Released::kYes);
  server_.command({"SET", lock_key("sku:7") + ":fence", "3"});
  EXPECT_EQ(acquire({{{"sku:7", "t3"}}})[0].fence, 1004u);
  EXPECT_EQ(server_.command({"EXISTS", lock_key("sku:7") + ":fence"}).integer, 0);
}

TEST_F(NodeStoreTest, AcquisitionsAskedForInOneIterationShareOneScriptCall) {
  acquire({{{"warm-a", "t0"}, {"warm-b", "t0"}}});
  const long long before = script_calls();
  std::vector<std::vector<Want>> groups;
  for (int i = 0; i < 20; ++i) groups.push_back({{"k" + std::to_string(i), "tok" + std::to_string(i)}});
  auto r = acquire(groups);
  EXPECT_EQ(script_calls() - before, 1);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(r[i].status, Acquired::Status::kTaken) << i;
    EXPECT_EQ(server_.command({"GET", lock_key("k" + std::to_string(i))}).str, "tok" + std::to_string(i));
  }
}

TEST_F(NodeStoreTest, MoreLocksThanOneBatchHoldsGoOutInSeveralCallsAndAllAreTaken) {
  const std::size_t n = 3 * detail::RedisNodeStore::kMaxBatch + 7;
  std::vector<Want> many;
  for (std::size_t i = 0; i < n; ++i) many.push_back({"m" + std::to_string(i), "tok"});
  const long long before = script_calls();
  auto r = acquire({many});
  const long long calls = script_calls() - before;
  EXPECT_GE(calls, 4);       // 256 + 256 + 256 + 7
  EXPECT_LE(calls, 8);       // each at most once more as EVAL after NOSCRIPT
  // Names of one slot share its counter: they hold its tokens 1, 2, ...
  std::map<std::uint16_t, std::set<std::uint64_t>> tokens;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(r[i].status, Acquired::Status::kTaken) << i;
    tokens[detail::key_slot(lock_key(many[i].key))].insert(r[i].fence);
  }
  std::size_t taken = 0;
  for (const auto& [slot, t] : tokens) {
    EXPECT_EQ(*t.begin(), 1u) << slot;
    EXPECT_EQ(*t.rbegin(), t.size()) << slot;
    taken += t.size();
  }
  EXPECT_EQ(taken, n);
  EXPECT_EQ(server_.command({"DBSIZE"}).integer, static_cast<long long>(n + tokens.size()));  // locks and counters
}

TEST_F(NodeStoreTest, ReleasesOfOneIterationAreOneCallAndEachSaysWhatItFound) {
  acquire({{{"mine-1", "me"}, {"mine-2", "me"}, {"theirs", "them"}}});
  const long long before = script_calls();
  auto r = release({{"mine-1", "me"}, {"never", "me"}, {"theirs", "me"}, {"mine-2", "me"}});
  EXPECT_LE(script_calls() - before, 2);  // one call (EVAL after a NOSCRIPT at most)
  EXPECT_EQ(r[0], Released::kYes);
  EXPECT_EQ(r[1], Released::kGone);
  EXPECT_EQ(r[2], Released::kTakenByOther);
  EXPECT_EQ(r[3], Released::kYes);
  EXPECT_EQ(server_.command({"EXISTS", lock_key("mine-1")}).integer, 0);
  EXPECT_EQ(server_.command({"GET", lock_key("theirs")}).str, "them");
}

TEST_F(NodeStoreTest, ALockGivenBackAndAskedForInOneIterationIsFreeForTheAsker) {
  ASSERT_EQ(acquire({{{"passed-on", "first"}}})[0].status, Acquired::Status::kTaken);
  // Warm the release script: a NOSCRIPT answer sends it again as EVAL, after
  // what was written behind it.
  release({{"unheld", "first"}});
  std::promise<std::pair<Released, Acquired>> p;
  auto f = p.get_future();
  loop_.post([&] {
    const std::string name = lock_key("passed-on");
    auto released = std::make_shared<Released>(Released::kUnconfirmed);
    LockRef mine{name, "first", "0", 0ms};
    store_->release(std::span<const LockRef>(&mine, 1), true,
                    [released](std::size_t, Released r, const lockwatch::detail::StoreError*) { *released = r; });
    LockRef next{name, "second", "10000", 10s};
    store_->acquire(std::span<const LockRef>(&next, 1),
                    [&p, released](std::size_t, const Acquired& a) { p.set_value({*released, a}); });
  });
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  auto [released, acquired] = f.get();
  EXPECT_EQ(released, Released::kYes);
  EXPECT_EQ(acquired.status, Acquired::Status::kTaken);
  EXPECT_EQ(acquired.fence, 2u);
  EXPECT_EQ(server_.command({"GET", lock_key("passed-on")}).str, "second");
}

TEST_F(NodeStoreTest, RequestsQueuedWhenTheStoreClosesAreEachAnsweredOnceWithAnError) {
  std::promise<void> all;
  auto f = all.get_future();
  auto answers = std::make_shared<std::map<std::size_t, int>>();
  auto errors = std::make_shared<int>(0);
  loop_.post([&, answers, errors] {
    std::vector<std::string> names{lock_key("q1"), lock_key("q2"), lock_key("q3")};
    std::vector<LockRef> refs;
    for (const auto& n : names) refs.push_back(LockRef{n, "tok", "10000", 10s});
    store_->acquire(refs, [&all, answers, errors](std::size_t i, const Acquired& a) {
      if (a.status == Acquired::Status::kFailed && !a.error.message.empty()) ++*errors;
      if (++(*answers)[i] == 1 && answers->size() == 3) all.set_value();
    });
    store_->close();  // before the loop's next iteration would send them
  });
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(*errors, 3);
  for (auto& [i, n] : *answers) EXPECT_EQ(n, 1) << i;
  EXPECT_EQ(server_.command({"DBSIZE"}).integer, 0);
}

Options short_command_timeout() {
  Options o;
  o.command_timeout = 250ms;
  return o;
}

class NodeStoreBurstTest : public NodeStoreTest {
 protected:
  NodeStoreBurstTest() : NodeStoreTest(short_command_timeout()) {}
};

TEST_F(NodeStoreBurstTest, ABurstRedisTakesLongerThanTheCommandTimeoutToServeIsNoTimeout) {
  // 200,000 locks asked for at once take Redis well over 250 ms in all; only
  // what is in flight counts against the timeout, so none may fail.
  constexpr std::size_t kLocks = 200'000;
  std::vector<Want> many;
  many.reserve(kLocks);
  for (std::size_t i = 0; i < kLocks; ++i) many.push_back({"b" + std::to_string(i), "tok"});
  const auto t0 = std::chrono::steady_clock::now();
  auto r = acquire({many});
  const auto took = std::chrono::steady_clock::now() - t0;
  std::size_t taken = 0;
  std::string first_error;
  for (const auto& a : r) {
    taken += a.status == Acquired::Status::kTaken;
    if (a.status == Acquired::Status::kFailed && first_error.empty()) first_error = a.error.describe();
  }
  EXPECT_EQ(taken, kLocks) << first_error;
  EXPECT_GT(took, options_.command_timeout) << "the burst must outlast the timeout to test anything";
  // The locks and one counter per slot (these names use every slot).
  EXPECT_EQ(server_.command({"DBSIZE"}).integer, static_cast<long long>(kLocks + detail::kClusterSlots));
}

// A field of INFO's text ("connected_slaves", "blocked_clients"), or "".
std::string info_field(const RedisServer& server, const std::string& section, const std::string& field) {
  const std::string text = server.command({"INFO", section}).str;
  auto at = text.find(field + ":");
  if (at == std::string::npos) return {};
  auto end = text.find("\r\n", at);
  return text.substr(at + field.size() + 1, end - at - field.size() - 1);
}

// True once `pred` holds, polled every 10 ms, within kBound.
template <class Pred>
bool eventually(Pred pred) {
  auto until = std::chrono::steady_clock::now() + kBound;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);  // polling a server's state
  }
  return false;
}

TEST(NodeStoreReplicaTest, AWaitForASlowReplicaHoldsUpNoRelease) {
  RedisServer master;
  RedisServerOptions ro;
  ro.extra_args = {"--replicaof", "127.0.0.1", std::to_string(master.port())};
  RedisServer replica(ro);
  ASSERT_TRUE(eventually([&] { return info_field(master, "replication", "slave0").find("state=online") != std::string::npos; }));

  Options o = options_for(master);
  o.min_replicas = 1;
  o.replica_ack_timeout = 1500ms;
  Runtime rt(o);
  auto held_f = rt.acquire("held", 10s);
  LockHandle held = get_bounded(held_f);
  EXPECT_TRUE(exists(replica, "held"));  // WAIT saw it replicated

  replica.pause();  // WAIT can now only time out
  auto blocked = rt.acquire("blocked", 10s);
  ASSERT_TRUE(eventually([&] { return info_field(master, "clients", "blocked_clients") == "1"; }));
  const auto t0 = std::chrono::steady_clock::now();
  auto released = held.release();
  get_bounded(released);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 500ms) << "the release waited behind the WAIT";
  EXPECT_FALSE(exists(master, "held"));

  auto err = error_of<ConnectionError>(blocked);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("replicas"), std::string::npos) << err->what();
  EXPECT_FALSE(exists(master, "blocked"));  // given back
  replica.resume();
}

}  // namespace
}  // namespace lockwatch::testing
