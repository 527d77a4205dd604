// Leader election (lockwatch/election.hpp) on every store of the store
// contract suite (tests/backends.hpp; each server started once for the
// suite): a campaign leads with a term; a second candidate waits;
// resigning hands over with a higher term; a leader killed (kill -9 of a
// process) or losing its lease in process is replaced, its stop_token
// fired; leader() and on_change() see every change, in order. Under TSan,
// which checks the Election's own threads, on memory:// and one Redis node.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends.hpp"
#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;

class ElectionTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void TearDownTestSuite() { backends().clear(); }
  static std::map<std::string, std::unique_ptr<Backend>>& backends() {
    static std::map<std::string, std::unique_ptr<Backend>> b;
    return b;
  }
  Backend& backend() {
    auto& slot = backends()[GetParam()];
    if (!slot) slot = make_backend(GetParam());
    return *slot;
  }

  std::string url() { return backend().url(); }
  bool has_server() { return backend().has_server(); }

  Options options() {
    Options o;
    o.redis_url = url();
    o.runtime.threads = 2;
    return o;
  }
};

// What an on_change handler saw, in order.
class Changes {
 public:
  void operator()(const std::optional<LeaderInfo>& now) {
    std::lock_guard lk(mu_);
    seen_.push_back(now);
    cv_.notify_all();
  }
  // Waits (bounded) until the last view seen is `want`.
  bool wait_for(const std::optional<std::string>& identity) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, kBound, [&] {
      if (seen_.empty()) return false;
      const auto& last = seen_.back();
      return identity ? last && last->identity == *identity : !last;
    });
  }
  std::vector<std::optional<LeaderInfo>> seen() {
    std::lock_guard lk(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<LeaderInfo>> seen_;
};

TEST_P(ElectionTest, ACampaignLeadsWithATermAndASecondCandidateWaits) {
  Options leader_options = options();
  leader_options.runtime.owner_name = "leader-host:42:scheduler";
  Runtime a(leader_options), b(options());
  // The leader renews for a while below: a ttl the store keeps renewed on
  // a loaded machine (ZooKeeper's and etcd's are 2 s).
  const auto ttl = std::max<std::chrono::milliseconds>(1s, backend().steady_ttl());
  Election first(a, "lead", ttl), second(b, "lead", ttl);
  auto won = first.campaign();
  Leadership me = get_bounded(won);
  EXPECT_GE(me.term(), 1u);
  EXPECT_FALSE(me.stop_token().stop_requested());
  auto waiting = second.campaign();
  EXPECT_THROW((void)first.campaign(), InvalidArgument);  // it leads already
  auto seen = second.leader();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->identity, me.identity());
  EXPECT_EQ(seen->owner, "leader-host:42:scheduler");  // a follower can tell which host leads
  EXPECT_EQ(first.leader(), (LeaderInfo{me.identity(), me.term(), {}}));
  // Still waiting while the leader renews (it does, well past its ttl).
  EXPECT_TRUE(renewed_again(me.lease(), 2));
  EXPECT_NE(waiting.wait_for(0s), std::future_status::ready);
  auto gone = first.resign();
  get_bounded(gone);
  Leadership next = get_bounded(waiting);
  EXPECT_GT(next.term(), me.term());
  EXPECT_TRUE(me.stop_token().stop_requested());
  auto done = second.resign();
  get_bounded(done);
  EXPECT_EQ(second.leader(), std::nullopt);
}

TEST_P(ElectionTest, ResigningWhileCampaigningCancelsTheCampaign) {
  Runtime a(options()), b(options());
  Election first(a, "cancel", 2s), second(b, "cancel", 2s);
  auto won = first.campaign();
  Leadership me = get_bounded(won);
  auto waiting = second.campaign();
  auto gave_up = second.resign();
  get_bounded(gave_up);
  EXPECT_THROW(get_bounded(waiting), Cancelled);
  auto again = second.campaign();  // a new campaign after the cancelled one
  auto r = first.resign();
  get_bounded(r);
  Leadership next = get_bounded(again);
  EXPECT_GT(next.term(), me.term());
}

TEST_P(ElectionTest, ALeaderThatLosesItsLeaseInProcessIsStoppedAndReplaced) {
  Runtime a(options()), b(options());
  Election first(a, "lose", 600ms), second(b, "lose", 600ms);
  auto won = first.campaign();
  Leadership me = get_bounded(won);
  auto waiting = second.campaign();
  auto forced = b.force_release("lose");  // an operator takes the lock away
  EXPECT_TRUE(get_bounded(forced));
  Leadership next = get_bounded(waiting);
  EXPECT_GT(next.term(), me.term());
  // The old leader learns it at its next renewal (within its ttl).
  EXPECT_TRUE(stopped_within_bound(me.stop_token()));
  EXPECT_EQ(second.leader(), (LeaderInfo{next.identity(), next.term(), {}}));
}

TEST_P(ElectionTest, ALeaderKilledIsReplacedWithinItsTtlWithAHigherTerm) {
  if (!has_server()) GTEST_SKIP() << "a memory space is per process: a child process cannot lead in it";
  const char* holder = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder, nullptr);
  ChildProcess child({holder, url(), "killed-leader", "1000", "leader"});
  auto line = child.read_line(kBound);
  ASSERT_TRUE(line.has_value());
  ASSERT_EQ(line->rfind("leader ", 0), 0u) << *line;
  const std::uint64_t child_term = std::stoull(line->substr(7));
  Changes changes;  // outlives the Election that calls it
  Runtime rt(options());
  Election me(rt, "killed-leader", 1s);
  me.on_change(std::ref(changes));
  auto waiting = me.campaign();
  auto leader = me.leader();
  ASSERT_TRUE(leader.has_value());
  EXPECT_GE(leader->term, child_term);  // the slot's counter: the term, or above it
  child.kill(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  Leadership won = get_bounded(waiting);
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 2000ms);  // the ttl (1 s), plus slack
  EXPECT_GT(won.term(), leader->term);
  ASSERT_TRUE(changes.wait_for(won.identity()));
  auto seen = changes.seen();
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.front(), leader);
  EXPECT_EQ(seen.back(), (LeaderInfo{won.identity(), won.term(), {}}));
}

TEST_P(ElectionTest, ObserversSeeEveryChangeInOrder) {
  Changes changes, own;  // outlive the Elections that call them
  Runtime a(options()), b(options()), c(options());
  Election first(a, "observed", 1s), second(b, "observed", 1s), watcher(c, "observed", 1s);
  watcher.on_change(std::ref(changes));
  ASSERT_TRUE(changes.wait_for(std::nullopt));
  auto w1 = first.campaign();
  Leadership one = get_bounded(w1);
  ASSERT_TRUE(changes.wait_for(one.identity()));
  auto w2 = second.campaign();
  auto r1 = first.resign();
  get_bounded(r1);
  Leadership two = get_bounded(w2);
  ASSERT_TRUE(changes.wait_for(two.identity()));
  auto r2 = second.resign();
  get_bounded(r2);
  ASSERT_TRUE(changes.wait_for(std::nullopt));
  // nobody, one, (nobody, if seen between the hand-over's two steps), two, nobody.
  auto seen = changes.seen();
  std::vector<std::optional<LeaderInfo>> leaders;
  for (const auto& s : seen)
    if (s) leaders.push_back(s);
  EXPECT_EQ(leaders, (std::vector<std::optional<LeaderInfo>>{LeaderInfo{one.identity(), one.term(), {}},
                                                              LeaderInfo{two.identity(), two.term(), {}}}));
  EXPECT_FALSE(seen.front().has_value());
  EXPECT_FALSE(seen.back().has_value());
  for (std::size_t i = 1; i < seen.size(); ++i) EXPECT_NE(seen[i], seen[i - 1]) << "a change reported twice";
  // A handler attached later hears the current view first.
  first.on_change(std::ref(own));
  ASSERT_TRUE(own.wait_for(std::nullopt));
}

TEST_P(ElectionTest, TheHandlerFormsCampaignAndResignOffTheCallersThread) {
  Runtime a(options()), b(options());
  Election first(a, "handlers", 1s), second(b, "handlers", 1s);
  const auto caller = std::this_thread::get_id();
  std::promise<Leadership> won;
  std::promise<std::thread::id> ran_on;
  first.campaign([&](std::error_code e, Leadership l) {
    ran_on.set_value(std::this_thread::get_id());
    if (e)
      won.set_exception(std::make_exception_ptr(std::system_error(e)));
    else
      won.set_value(std::move(l));
  });
  EXPECT_THROW(first.campaign([](std::error_code, Leadership) {}), InvalidArgument);  // it campaigns already
  auto won_f = won.get_future();
  auto ran_on_f = ran_on.get_future();
  Leadership me = get_bounded(won_f);
  EXPECT_NE(get_bounded(ran_on_f), caller);
  std::promise<Leadership> next;
  second.campaign([&](std::error_code e, Leadership l) {
    if (e)
      next.set_exception(std::make_exception_ptr(std::system_error(e)));
    else
      next.set_value(std::move(l));
  });
  std::promise<void> resigned;
  first.resign([&](std::error_code e) {
    if (e)
      resigned.set_exception(std::make_exception_ptr(std::system_error(e)));
    else
      resigned.set_value();
  });
  auto resigned_f = resigned.get_future();
  get_bounded(resigned_f);
  EXPECT_TRUE(me.stop_token().stop_requested());
  auto next_f = next.get_future();
  EXPECT_GT(get_bounded(next_f).term(), me.term());
  // Nothing to give up: the handler still runs, off this thread.
  std::promise<std::thread::id> nothing;
  first.resign([&](std::error_code) { nothing.set_value(std::this_thread::get_id()); });
  auto nothing_f = nothing.get_future();
  EXPECT_NE(get_bounded(nothing_f), caller);
  auto r = second.resign();
  get_bounded(r);
}

TEST_P(ElectionTest, AnElectionDestroyedByItsOwnHandlerStopsCleanly) {
  Runtime rt(options());
  auto owner = std::make_shared<std::unique_ptr<Election>>(std::make_unique<Election>(rt, "self-destroyed", 1s));
  std::promise<void> destroyed;
  (*owner)->on_change([owner, &destroyed](const std::optional<LeaderInfo>&) {
    if (!*owner) return;
    owner->reset();  // on the Election's own thread
    destroyed.set_value();
  });
  EXPECT_EQ(destroyed.get_future().wait_for(kBound), std::future_status::ready);
}

std::vector<std::string> election_stores() {
#if defined(__SANITIZE_THREAD__)
  return {"memory", "redis"};
#else
  return backend_kinds();
#endif
}

INSTANTIATE_TEST_SUITE_P(Stores, ElectionTest, ::testing::ValuesIn(election_stores()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace lockwatch::testing
