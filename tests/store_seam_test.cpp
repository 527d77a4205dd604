// The store seam: scheme to store (the registry), Options::store_url, and
// the capabilities a store may lack (a call that needs one fails with
// Unsupported naming it; locking still works).
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/small_string.hpp"
#include "lockwatch/lockwatch.hpp"
#include "memory_runtime.hpp"
#include "store/capabilities.hpp"
#include "store/quorum_store.hpp"
#include "store/redis/layout.hpp"
#include "store/registry.hpp"
#include "store/store_base.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;

// A store with the core seam only: every lock operation goes to a
// MemoryStore, and it offers no capability.
class CoreOnlyStore final : public detail::StoreBase {
 public:
  explicit CoreOnlyStore(std::unique_ptr<MemoryStore> inner)
      : StoreBase(detail::StoreTraits{.keys = detail::KeyRules{"lockwatch:"}, .release_events = true}),
        inner_(std::move(inner)) {}

  void acquire(std::span<const detail::LockRef> locks, AcquireDone done) override {
    inner_->acquire(locks, std::move(done));
  }
  std::size_t renew(std::span<const detail::LockRef> locks, std::shared_ptr<const void> keepalive,
                    RenewDone done) override {
    return inner_->renew(locks, std::move(keepalive), std::move(done));
  }
  void release(std::span<const detail::LockRef> locks, bool notify, ReleaseDone done) override {
    inner_->release(locks, notify, std::move(done));
  }
  void subscribe(std::string_view name) override { inner_->subscribe(name); }
  void unsubscribe(std::string_view name) override { inner_->unsubscribe(name); }
  void close() override { inner_->close(); }

 private:
  void started() override { inner_->start(events_); }
  std::unique_ptr<MemoryStore> inner_;
};

std::unique_ptr<Runtime> core_only_runtime() {
  auto backend = std::make_shared<MemoryBackend>();
  auto script = std::make_shared<StoreScript>();
  return detail::RuntimeAccess::make(memory_options(2), [backend, script](detail::Loop& loop, const Options& o) {
    return std::make_unique<CoreOnlyStore>(std::make_unique<MemoryStore>(loop, backend, script, o.runtime.key_prefix));
  });
}

TEST(StoreSeamTest, AStoreWithoutOperatorToolsFailsInspectWithUnsupportedButStillLocks) {
  auto rt = core_only_runtime();
  auto h = rt->acquire("seam", 2s);
  auto handle = get_bounded(h);
  EXPECT_GT(handle.lease().fencing_token(), 0u);
  try {
    (void)rt->inspect("seam");
    ADD_FAILURE() << "inspect on a store without operator tools did not throw";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("inspect"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)rt->force_release("seam"), Unsupported);
  // Nothing was done: the lock is still ours, and the release confirms it.
  EXPECT_FALSE(handle.lease().lost());
  EXPECT_NO_THROW(handle.release());
}

TEST(StoreSeamTest, AStoreWithoutJobClaimsRefusesAPeriodClaimButKeepsTheLock) {
  auto rt = core_only_runtime();
  auto h = rt->acquire("once", 2s);
  auto handle = get_bounded(h);
  try {
    (void)claim_period(*rt, handle, std::chrono::hours(24));
    ADD_FAILURE() << "a period claim on a store without period claims was accepted";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("scheduled jobs"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(handle.lease().lost());
  EXPECT_NO_THROW(handle.release());
}

TEST(StoreSeamTest, AStoreWithoutJobClaimsRefusesAJobWhenItIsDeclared) {
  auto rt = core_only_runtime();
  Scheduler scheduler(*rt);
  try {
    (void)scheduler.every(1s, "nightly", [](const JobRun&) {});
    ADD_FAILURE() << "a job on a store without period claims was accepted";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("scheduled jobs"), std::string::npos) << e.what();
  }
}

TEST(StoreSeamTest, AQuorumRefusesAMemberThatCannotRaiseFences) {
  detail::Loop loop{std::chrono::microseconds{0}};
  auto backend = std::make_shared<MemoryBackend>();
  auto script = std::make_shared<StoreScript>();
  std::vector<std::unique_ptr<detail::LockStore>> members;
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    members.push_back(std::make_unique<CoreOnlyStore>(std::make_unique<MemoryStore>(loop, backend, script)));
    names.push_back("node" + std::to_string(i));
  }
  try {
    detail::QuorumStore quorum(std::move(members), std::move(names), WatchdogOptions{});
    ADD_FAILURE() << "a quorum of stores without fence raising was built";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("node0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fencing"), std::string::npos) << e.what();
  }
}

// What is constant per store is data (StoreTraits), read without a virtual
// call; the capabilities are the pointers the store offered.
TEST(StoreSeamTest, TraitsAndCapabilitiesAreWhatTheStoreGave) {
  detail::Loop loop{std::chrono::microseconds{0}};
  auto backend = std::make_shared<MemoryBackend>();
  auto script = std::make_shared<StoreScript>();
  CoreOnlyStore core(std::make_unique<MemoryStore>(loop, backend, script));
  EXPECT_EQ(core.encode("k"), "lockwatch:k");
  EXPECT_TRUE(core.release_events());
  EXPECT_EQ(core.expiry_bound(1500ms), 1500ms);
  EXPECT_TRUE(core.expiry_bounded());
  EXPECT_EQ(detail::capability<detail::OperatorTools>(core), nullptr);
  EXPECT_EQ(detail::capability<detail::JobClaims>(core), nullptr);
  EXPECT_EQ(core.check_kind(LockKind::exclusive()), nullptr);
  EXPECT_STREQ(core.check_kind(LockKind::shared()), detail::StoreTraits::kExclusiveOnly);
  // Fair locks go with the FairQueue capability: without it, refused.
  EXPECT_STREQ(core.check_kind(LockKind::fair()), detail::StoreTraits::kNoFairQueue);

  MemoryStore full(loop, backend, script);
  EXPECT_EQ(detail::capability<detail::OperatorTools>(full), static_cast<detail::OperatorTools*>(&full));
  EXPECT_EQ(detail::capability<detail::TokenBlocks>(full), static_cast<detail::TokenBlocks*>(&full));
  EXPECT_EQ(detail::capability<detail::LockListing>(full), nullptr);
  EXPECT_EQ(full.check_key("refused:x"), std::string_view("this store refuses keys starting with 'refused:'"));
}

// The expiry rule: the ttl rounded up to whole units (at least one), plus
// the slack, as etcd's leases count whole seconds.
TEST(StoreSeamTest, TheExpiryBoundRoundsTheTtlUpToTheUnitAndAddsTheSlack) {
  class Rounding final : public detail::StoreBase {
   public:
    Rounding()
        : StoreBase(detail::StoreTraits{.expiry = {.unit = 1000ms, .slack = 2000ms, .bounded = false}}) {}
    void acquire(std::span<const detail::LockRef>, AcquireDone) override {}
    std::size_t renew(std::span<const detail::LockRef>, std::shared_ptr<const void>, RenewDone) override { return 0; }
    void release(std::span<const detail::LockRef>, bool, ReleaseDone) override {}
    void close() override {}
  } store;
  EXPECT_EQ(store.expiry_bound(1ms), 3000ms);
  EXPECT_EQ(store.expiry_bound(1000ms), 3000ms);
  EXPECT_EQ(store.expiry_bound(1001ms), 4000ms);
  EXPECT_FALSE(store.expiry_bounded());
  EXPECT_FALSE(store.release_events());
}

TEST(StoreSeamTest, StoreUrlWinsOverRedisUrl) {
  Options o;
  o.redis_url = "redis://127.0.0.1:1";  // nothing listens there
  o.store_url = "memory://seam-store-url";
  Runtime rt(o);
  auto h = rt.acquire("k", 2s);
  EXPECT_GT(get_bounded(h).lease().fencing_token(), 0u);
}

TEST(StoreSeamTest, FromEnvReadsTheStoreUrlBesideTheRedisUrl) {
  ::setenv("LOCKWATCH_STORE_URL", "memory://from-env", 1);
  ::setenv("LOCKWATCH_REDIS_URL", "redis://10.0.0.9:7777", 1);
  Options o = Options::from_env();
  ::unsetenv("LOCKWATCH_STORE_URL");
  ::unsetenv("LOCKWATCH_REDIS_URL");
  EXPECT_EQ(o.store_url, "memory://from-env");
  EXPECT_EQ(o.redis_url, "redis://10.0.0.9:7777");
  EXPECT_EQ(Options::from_env().store_url, "");
}

TEST(StoreSeamTest, AnUnknownSchemeListsEveryStoreOfTheRegistry) {
  Options o;
  o.store_url = "nosuchstore://127.0.0.1:2181";
  try {
    o.validate();
    ADD_FAILURE() << "an unknown scheme was accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    for (const char* scheme : {"'nosuchstore://'", "redis://", "redis-sentinel://", "redis-cluster://", "mysql://",
                               "postgresql://", "zookeeper://", "memory://"})
      EXPECT_NE(what.find(scheme), std::string::npos) << scheme << " missing in: " << what;
  }
}

TEST(StoreSeamTest, EachStoreChecksItsOwnSettings) {
  // A setting of another store is an unknown parameter.
  Options sql;
  sql.store_url = "mysql://u:secret@127.0.0.1/db?min_replicas=1";  // a Redis setting
#if LOCKWATCH_WITH_SQL
  EXPECT_THROW(sql.validate(), InvalidArgument);
#else
  EXPECT_THROW(sql.validate(), Unsupported);
#endif
  Options pg;
  pg.store_url = "postgresql://u:secret@127.0.0.1/db?min_replicas=1";
#if LOCKWATCH_WITH_POSTGRESQL
  EXPECT_THROW(pg.validate(), InvalidArgument);
#else
  EXPECT_THROW(pg.validate(), Unsupported);
#endif
  Options redis;
  redis.store_url = "redis://127.0.0.1:6379";
  redis.runtime.key_prefix = "a{b}:";
  EXPECT_THROW(redis.validate(), InvalidArgument);
  Options memory;  // servers' settings have nothing to act on in memory
  memory.store_url = "memory://";
  memory.runtime.key_prefix = "a{b}:";
  EXPECT_NO_THROW(memory.validate());
}

TEST(StoreSeamTest, ARedisUrlCarriesTheRedisSettingsAndRefusesBadOnes) {
  const auto split = detail::split_redis_url(
      "redis-sentinel://u:pw@127.0.0.1:26379/mymaster?min_replicas=2&replica_ack_timeout=750&sentinel_user=s%40u"
      "&sentinel_password=p%26w&layout=redisson");
  EXPECT_EQ(split.url, "redis-sentinel://u:pw@127.0.0.1:26379/mymaster");
  EXPECT_EQ(split.replicas.min, 2);
  EXPECT_EQ(split.replicas.ack_timeout, 750ms);
  EXPECT_EQ(split.sentinel_user, "s@u");
  EXPECT_EQ(split.sentinel_password, "p&w");
  EXPECT_EQ(split.layout, detail::RedisLayout::kRedisson);
  for (const char* bad : {"redis://127.0.0.1:6379?min_replicas=-1", "redis://127.0.0.1:6379?min_replicas=x",
                          "redis://127.0.0.1:6379?min_replicas=17", "redis://127.0.0.1:6379?replica_ack_timeout=0",
                          "redis://127.0.0.1:6379?min_replicas=1&min_replicas=2", "redis://127.0.0.1:6379?wait=1",
                          "redis://127.0.0.1:6379?sentinel_user=s",  // not a Sentinel URL
                          "redis-cluster://127.0.0.1:7000?sentinel_password=p"}) {
    Options o;
    o.store_url = bad;
    EXPECT_THROW(o.validate(), InvalidArgument) << bad;
  }
  // A password in the query never reaches a message.
  Options o;
  o.store_url = "redis://127.0.0.1:6379?sentinel_password=hunter2&nope=1";
  try {
    o.validate();
    ADD_FAILURE() << "an unknown parameter was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
  }
}

// What a store queues per lock (names, tokens) is kept inline up to its
// size, in a block of its own beyond: the same text either way, copies
// apart, a moved-from string empty, and assigning a string its own text
// (inline or not) keeps it.
TEST(SmallString, KeepsItsTextInlineOrNotAcrossCopiesMovesAndSelfAssignment) {
  using detail::SmallString;
  const std::string short_text = "lockwatch:{sku:42}";
  const std::string long_text(100, 'k');
  for (const std::string& text : {short_text, long_text, std::string()}) {
    SmallString<32> s(text);
    EXPECT_EQ(s.view(), text);
    EXPECT_EQ(s.size(), text.size());
    SmallString<32> copy = s;
    s = std::string_view("changed");
    EXPECT_EQ(copy.view(), text) << "a copy owns its text";
    EXPECT_EQ(s.view(), "changed");
    SmallString<32> moved = std::move(copy);
    EXPECT_EQ(moved.view(), text);
    EXPECT_TRUE(copy.empty());  // NOLINT: moved-from is empty, by design
    moved = moved.view();
    EXPECT_EQ(moved.view(), text) << "assigned its own text";
    moved = long_text;
    moved = short_text;
    EXPECT_EQ(moved.str(), short_text);
    moved = std::move(s);
    EXPECT_EQ(moved.view(), "changed");
  }
}

// A store's name for a key is made of its key rules' pieces: the same
// text as a std::string or written into a SmallString, inline or in a
// block of its own, with the braces of Redis's rules and without.
TEST(SmallString, AStoreNameIsTheSameWrittenInlineOrAsAString) {
  const detail::KeyRules plain{.prefix = "lockwatch:"};
  const detail::KeyRules braced{.prefix = "lockwatch:", .braces = true};
  const std::string long_key(100, 'k');
  for (const std::string& key : {std::string("sku:42"), long_key, std::string()}) {
    detail::StoreName name("was here before");
    name.assign_joined(plain.name_parts(key));
    EXPECT_EQ(name.view(), "lockwatch:" + key);
    name.assign_joined(braced.name_parts(key));
    EXPECT_EQ(name.view(), "lockwatch:{" + key + "}");
  }
  detail::StoreName empty("x");
  empty.assign_joined(detail::KeyRules{}.name_parts(""));
  EXPECT_TRUE(empty.empty());
}

}  // namespace
}  // namespace lockwatch::testing
