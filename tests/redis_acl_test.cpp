// Redis ACLs: lockwatch's operations as a user restricted to the rules of
// docs/redis-acl.md, read from the page itself (LOCKWATCH_REDIS_ACL_DOC),
// so that the page and what is tested cannot drift apart. On one server
// (and Redlock over three), on a Redis Cluster and through Sentinel:
// locks, waiting by release notices, renewals, fencing tokens, the
// operators' inspect and force_release, and a scheduled job's claim. Then
// users that lack part of a rule: their calls fail with AuthError naming
// what was refused. Each topology is started once per suite; the whole
// program takes seconds.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "lockwatch/lockwatch.hpp"
#include "support/redis_cluster.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono;

// The rule the page gives under `<!-- acl-rule: NAME -->`: the words of
// the fenced block that follows the marker.
std::vector<std::string> doc_rule(const std::string& name) {
  const char* path = std::getenv("LOCKWATCH_REDIS_ACL_DOC");
  if (path == nullptr) throw std::runtime_error("LOCKWATCH_REDIS_ACL_DOC is not set");
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path);
  const std::string marker = "<!-- acl-rule: " + name + " -->";
  std::string line;
  bool found = false, inside = false;
  std::vector<std::string> words;
  while (std::getline(in, line)) {
    if (!found) {
      found = line == marker;
      continue;
    }
    if (!inside) {
      if (line.starts_with("```")) inside = true;
      continue;
    }
    if (line.starts_with("```")) return words;
    std::istringstream split(line);
    for (std::string w; split >> w;) words.push_back(w);
  }
  throw std::runtime_error("docs/redis-acl.md has no rule block '" + name + "'");
}

// `rule` and what `more` adds.
std::vector<std::string> plus(std::vector<std::string> rule, const std::vector<std::string>& more) {
  rule.insert(rule.end(), more.begin(), more.end());
  return rule;
}

// `rule` without the word `word` (which it must hold).
std::vector<std::string> without(std::vector<std::string> rule, const std::string& word) {
  auto it = std::find(rule.begin(), rule.end(), word);
  if (it == rule.end()) throw std::runtime_error("the rule has no '" + word + "'");
  rule.erase(it);
  return rule;
}

// ACL SETUSER `user` from nothing, with password `password` and `rule`.
std::vector<std::string> setuser(const std::string& user, const std::string& password,
                                 const std::vector<std::string>& rule) {
  return plus({"ACL", "SETUSER", user, "reset", "on", ">" + password}, rule);
}

void add_user(const RedisServer& server, const std::string& user, const std::string& password,
              const std::vector<std::string>& rule) {
  const Reply r = server.command(setuser(user, password, rule));
  if (r.type == Reply::Type::kError) throw std::runtime_error("ACL SETUSER " + user + ": " + r.str);
}

// `url` with `user:password@` after its scheme.
std::string as_user(const std::string& url, const std::string& user, const std::string& password) {
  const auto sep = url.find("://") + 3;
  return url.substr(0, sep) + user + ":" + password + "@" + url.substr(sep);
}

std::string test_key() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

// What `ACL LOG` holds, one "reason object (context)" per line: every
// command, key or channel the server refused, also those whose refusal
// fails no call (an UNSUBSCRIBE, a sentinel's SUBSCRIBE).
std::string refusals(const Reply& log) {
  std::string out;
  for (const auto& entry : log.elements) {
    std::string reason, object, context;
    for (std::size_t i = 0; i + 1 < entry.elements.size(); i += 2) {
      const std::string& field = entry.elements[i].str;
      if (field == "reason") reason = entry.elements[i + 1].str;
      if (field == "object") object = entry.elements[i + 1].str;
      if (field == "context") context = entry.elements[i + 1].str;
    }
    out += reason + " " + object + " (" + context + ")\n";
  }
  return out;
}
std::string refusals(const RedisServer& server) { return refusals(server.command({"ACL", "LOG"})); }
void forget_refusals(const RedisServer& server) { server.command({"ACL", "LOG", "RESET"}); }

// The AuthError a future holds (bounded), with a failure otherwise.
template <class T>
std::string auth_error_of(std::future<T>& f) {
  auto e = error_of<AuthError>(f);
  return e ? e->what() : std::string("(no AuthError)");
}

// The core cases, as `o`'s user: locks, a wait woken by the release notice
// well before the holder's ttl, renewals, rising fencing tokens, inspect
// and force_release, a scheduled job's claim.
void run_core_cases(const Options& o, const std::string& key) {
  Runtime rt(o);
  Runtime other(o);

  // Fencing tokens rise, and the watchdog renews a short lease.
  auto first = rt.acquire(key, 300ms);
  LockHandle h = get_bounded(first);
  const std::uint64_t token = h.lease().fencing_token();
  EXPECT_GT(token, 0u);
  EXPECT_TRUE(renewed_again(h.lease(), 2)) << "renewals as the restricted user";

  // The operators' view of it.
  auto state = rt.inspect(key);
  LockState s = get_bounded(state);
  EXPECT_TRUE(s.held);
  EXPECT_EQ(s.fencing_token, token);

  // A waiter in another runtime is woken by the release notice, long
  // before the holder's ttl (30 s) would have run out.
  auto long_held = other.acquire(key + ":wait", 30s);
  LockHandle holder = get_bounded(long_held);
  auto waiting = rt.acquire({.key = key + ":wait", .ttl = 5s, .retries = forever, .wait = 25s});
  EXPECT_EQ(waiting.wait_for(100ms), std::future_status::timeout) << "busy: it waits";
  const auto released_at = steady_clock::now();
  auto given_back = holder.release();
  get_bounded(given_back);
  LockHandle woken = get_bounded(waiting);
  EXPECT_LT(steady_clock::now() - released_at, 10s) << "woken by the notice, not by the ttl";
  auto woken_back = woken.release();
  get_bounded(woken_back);

  auto back = h.release();
  get_bounded(back);
  auto second = rt.acquire(key, 5s);
  LockHandle h2 = get_bounded(second);
  EXPECT_GT(h2.lease().fencing_token(), token);

  // force_release takes it away whoever holds it; the holder learns.
  auto forced = other.force_release(key);
  EXPECT_TRUE(get_bounded(forced));
  auto after = rt.inspect(key);
  EXPECT_FALSE(get_bounded(after).held);
  auto lost = h2.release();
  EXPECT_NE(error_of<LeaseLost>(lost), nullptr) << "the holder learns it lost the lock";

  // A scheduled job's claim: the store's clock, then the claim script.
  auto job = rt.acquire("job:" + key, 5s);
  LockHandle leader = get_bounded(job);
  auto claim = claim_period(rt, leader, 1h);
  PeriodClaim c = get_bounded(claim);
  EXPECT_TRUE(c.claimed);
  auto again = claim_period(rt, leader, 1h);
  EXPECT_FALSE(get_bounded(again).claimed) << "each period once";
  auto done = leader.release();
  get_bounded(done);
}

// The page's examples of a whole user spell the rules out again: they
// must say what the rule blocks say.
TEST(RedisAclDocTest, TheExamplesAreTheNodeAndSchedulerRules) {
  const char* path = std::getenv("LOCKWATCH_REDIS_ACL_DOC");
  ASSERT_NE(path, nullptr);
  std::ifstream in(path);
  std::string rule;
  for (const auto& w : plus(doc_rule("node"), doc_rule("scheduler"))) rule += " " + w;
  int examples = 0;
  for (std::string line; std::getline(in, line);) {
    for (const std::string head : {"ACL SETUSER lockwatch on >secret", "user lockwatch on >secret"}) {
      if (!line.starts_with(head + " ")) continue;
      EXPECT_EQ(line.substr(head.size()), rule) << line;
      ++examples;
    }
  }
  EXPECT_EQ(examples, 2);
}

// ------------------------------------------------------------ one server

class RedisAclTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new RedisServer();
    add_user(*server_, "lockwatch", "pw", plus(doc_rule("node"), doc_rule("scheduler")));
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static Options as(const std::string& user) {
    Options o = options_for(*server_, 2);
    o.redis_url = as_user(server_->url(), user, "pw");
    return o;
  }
  static RedisServer* server_;
};
RedisServer* RedisAclTest::server_ = nullptr;

TEST_F(RedisAclTest, TheDocumentedRulesCoverLocksWaitsRenewalsFencingOperatorsAndJobs) {
  forget_refusals(*server_);
  run_core_cases(as("lockwatch"), test_key());
  EXPECT_EQ(refusals(*server_), "");
}

TEST_F(RedisAclTest, TheRuleHoldsAfterTheScriptCacheIsFlushed) {
  // EVALSHA answers NOSCRIPT, and the script is sent again by EVAL.
  ASSERT_EQ(server_->command({"SCRIPT", "FLUSH"}).type, Reply::Type::kStatus);
  Runtime rt(as("lockwatch"));
  auto f = rt.acquire(test_key(), 5s);
  LockHandle h = get_bounded(f);
  auto back = h.release();
  get_bounded(back);
}

TEST_F(RedisAclTest, RedlockOverThreeMastersWithTheNodeRule) {
  std::vector<std::unique_ptr<RedisServer>> masters;
  std::string urls;
  for (int i = 0; i < 3; ++i) {
    masters.push_back(std::make_unique<RedisServer>());
    add_user(*masters.back(), "lockwatch", "pw", plus(doc_rule("node"), doc_rule("scheduler")));
    urls += (i ? "," : "") + as_user(masters.back()->url(), "lockwatch", "pw");
  }
  Options o = options_for(*server_, 2);
  o.redis_url = urls;
  run_core_cases(o, test_key());
  for (const auto& m : masters) EXPECT_EQ(refusals(*m), "") << m->port();
}

TEST_F(RedisAclTest, WithoutEvalshaAnAcquisitionFailsWithAuthErrorNamingItAndTheScript) {
  add_user(*server_, "noevalsha", "pw", plus(without(doc_rule("node"), "+evalsha"), doc_rule("scheduler")));
  Runtime rt(as("noevalsha"));
  auto f = rt.acquire(test_key(), 5s);
  const std::string what = auth_error_of(f);
  EXPECT_NE(what.find("NOPERM"), std::string::npos) << what;
  EXPECT_NE(what.find("'evalsha'"), std::string::npos) << what;
  EXPECT_NE(what.find("EVALSHA of lockwatch's acquire script, which calls SET"), std::string::npos) << what;
  EXPECT_FALSE(exists(*server_, test_key()));
}

// Runtime::lock() asks on a connection of the caller's own (after its
// first call has connected the runtime): it logs in as the user too, and
// a refusal reads as the loop's connections tell it.
TEST_F(RedisAclTest, LockAndUnlockLogInAsTheUserAndTellARefusalAlike) {
  forget_refusals(*server_);
  {
    Runtime rt(as("lockwatch"));
    for (int i = 0; i < 3; ++i) {
      LockHandle h = rt.lock({.key = test_key(), .ttl = 5s});
      EXPECT_TRUE(exists(*server_, test_key()));
      h.unlock();
      EXPECT_FALSE(exists(*server_, test_key()));
    }
  }
  EXPECT_EQ(refusals(*server_), "");
  add_user(*server_, "noevalsha", "pw", plus(without(doc_rule("node"), "+evalsha"), doc_rule("scheduler")));
  Runtime rt(as("noevalsha"));
  for (int i = 0; i < 3; ++i) {
    auto e = thrown<AuthError>([&] { (void)rt.lock({.key = test_key(), .ttl = 5s}); });
    ASSERT_TRUE(e);
    const std::string what = e->what();
    EXPECT_NE(what.find("'evalsha'"), std::string::npos) << what;
    EXPECT_NE(what.find("EVALSHA of lockwatch's acquire script, which calls SET"), std::string::npos) << what;
  }
  EXPECT_FALSE(exists(*server_, test_key()));
}

TEST_F(RedisAclTest, AKeyPrefixOutsideThePatternIsRefusedWithAuthErrorNamingTheCommand) {
  Options o = as("lockwatch");
  o.runtime.key_prefix = "elsewhere:";
  Runtime rt(o);
  auto f = rt.acquire(test_key(), 5s);
  const std::string what = auth_error_of(f);
  EXPECT_NE(what.find("NOPERM"), std::string::npos) << what;
  EXPECT_NE(what.find("EVALSHA of lockwatch's acquire script"), std::string::npos) << what;
  auto state = rt.inspect(test_key());
  const std::string inspect_what = auth_error_of(state);
  EXPECT_NE(inspect_what.find("inspect script"), std::string::npos) << inspect_what;
}

TEST_F(RedisAclTest, WithoutTheSchedulersRuleAClaimFailsWithAuthErrorNamingTime) {
  add_user(*server_, "notime", "pw", doc_rule("node"));
  Runtime rt(as("notime"));
  auto f = rt.acquire("job:" + test_key(), 5s);
  LockHandle leader = get_bounded(f);
  auto claim = claim_period(rt, leader, 1h);
  const std::string what = auth_error_of(claim);
  EXPECT_NE(what.find("'time'"), std::string::npos) << what;
  EXPECT_NE(what.find("(sent: TIME)"), std::string::npos) << what;
  auto back = leader.release();
  get_bounded(back);
}

TEST_F(RedisAclTest, TheKindsRuleCoversReadersAndPermitsRenewedAndReleased) {
  add_user(*server_, "kinds", "pw", plus(doc_rule("node"), doc_rule("kinds")));
  forget_refusals(*server_);
  Runtime rt(as("kinds"));
  const std::string reader_key = test_key() + ":rw";
  auto r1 = rt.acquire({.key = reader_key, .ttl = 300ms, .kind = LockKind::shared()});
  auto r2 = rt.acquire({.key = reader_key, .ttl = 300ms, .kind = LockKind::shared()});
  LockHandle a = get_bounded(r1);
  LockHandle b = get_bounded(r2);  // readers overlap
  ASSERT_TRUE(renewed_again(a.lease(), 1));  // the renew script, as this user
  auto permit = rt.acquire({.key = test_key() + ":sem", .ttl = 5s, .kind = LockKind::permits(2)});
  LockHandle p = get_bounded(permit);
  for (LockHandle* h : {&a, &b, &p}) {
    auto back = h->release();
    get_bounded(back);
  }
  EXPECT_FALSE(exists(*server_, reader_key));
  EXPECT_EQ(refusals(*server_), "");
}

TEST_F(RedisAclTest, TheKindsRuleCoversFairLocksQueuedWithdrawnAndReleased) {
  add_user(*server_, "fair", "pw", plus(doc_rule("node"), doc_rule("kinds")));
  forget_refusals(*server_);
  Runtime rt(as("fair"));
  const std::string key = test_key() + ":fair";
  auto first = rt.acquire({.key = key, .ttl = 300ms, .kind = LockKind::fair()});
  LockHandle holder = get_bounded(first);
  ASSERT_TRUE(renewed_again(holder.lease(), 1));  // the kinds' renew script, as this user
  auto quitter = rt.acquire({.key = key, .ttl = 300ms, .retries = forever, .wait = 100ms, .kind = LockKind::fair()});  // queued, then withdrawn
  EXPECT_THROW(get_bounded(quitter), LockNotAcquired);
  auto next = rt.acquire({.key = key, .ttl = 300ms, .retries = forever, .wait = kBound, .kind = LockKind::fair()});
  auto back = holder.release();  // publishes: the next one is granted
  get_bounded(back);
  LockHandle h = get_bounded(next);
  auto done = h.release();
  get_bounded(done);
  EXPECT_FALSE(exists(*server_, key));
  EXPECT_EQ(refusals(*server_), "");
}

TEST_F(RedisAclTest, WithoutTheKindsRuleASharedLockFailsWithAuthErrorNamingTheScript) {
  add_user(*server_, "nokinds", "pw", doc_rule("node"));
  Runtime rt(as("nokinds"));
  auto f = rt.acquire({.key = test_key(), .ttl = 5s, .kind = LockKind::shared()});
  const std::string what = auth_error_of(f);
  EXPECT_NE(what.find("shared or permit acquire script"), std::string::npos) << what;
  EXPECT_FALSE(exists(*server_, test_key()));
}

TEST_F(RedisAclTest, WithoutTheChannelsTheRefusedSubscriptionAndReleaseNoticeAreLogged) {
  add_user(*server_, "nochannels", "pw", without(doc_rule("node"), "&lockwatch:*"));
  LogLines log;
  Options o = as("nochannels");
  o.observability.log = log.sink();
  Runtime rt(o);
  auto held = rt.acquire(test_key(), 1s);
  LockHandle h = get_bounded(held);
  // A waiter subscribes to the lock's channel, which Redis refuses.
  auto waiting = rt.acquire({.key = test_key(), .ttl = 5s, .retries = forever, .wait = 50ms});
  EXPECT_NE(error_of<LockNotAcquired>(waiting), nullptr);
  EXPECT_TRUE(log.wait_for("NOPERM")) << "the refused SUBSCRIBE is logged";
  EXPECT_TRUE(log.wait_for("no release notices"));
  // The release script publishes after it deleted the lock: the lock is
  // gone, but the release is unconfirmed (it completes once the ttl ran
  // out) and the refusal is logged.
  auto back = h.release();
  get_bounded(back);  // once the ttl ran out: the release is unconfirmed
  EXPECT_TRUE(log.wait_for("EVALSHA of lockwatch's release script"));
  EXPECT_FALSE(exists(*server_, test_key()));
}

// A release the ACL refuses half way (PUBLISH, after the DEL) is
// unconfirmed: it completes once the key surely expired, and a runtime
// destroyed meanwhile waits for that, not longer.
TEST_F(RedisAclTest, WithoutPublishTheRuntimeStopsOnceAnUnconfirmedReleaseRanOut) {
  add_user(*server_, "nopublish", "pw", without(doc_rule("node"), "+publish"));
  LogLines log;
  Options o = as("nopublish");
  o.observability.log = log.sink();
  auto rt = std::make_unique<Runtime>(o);
  auto f = rt->acquire(test_key(), 1s);
  LockHandle h = get_bounded(f);
  auto back = h.release();
  // Answered: it waits for the key's expiry now.
  ASSERT_TRUE(log.wait_for("the release is unconfirmed"));
  auto stopped = std::make_shared<std::promise<void>>();
  auto done = stopped->get_future();
  std::thread([rt = std::move(rt), stopped]() mutable {
    rt.reset();
    stopped->set_value();
  }).detach();
  ASSERT_EQ(done.wait_for(kBound), std::future_status::ready) << "the runtime did not stop";
  EXPECT_EQ(back.wait_for(0s), std::future_status::ready);
  EXPECT_FALSE(exists(*server_, test_key()));
}

// redis://user:@host logs in as `user` (AUTH with an empty password, which
// a nopass user takes), not as the default user: its key pattern applies.
TEST_F(RedisAclTest, AUserWithoutAPasswordIsThatUser) {
  add_user(*server_, "nopass-user", "unused", plus(doc_rule("node"), {"nopass"}));
  Options o = as("lockwatch");
  o.redis_url = as_user(server_->url(), "nopass-user", "");
  Runtime rt(o);
  auto f = rt.acquire(test_key(), 5s);
  LockHandle h = get_bounded(f);
  auto back = h.release();
  get_bounded(back);
  o.runtime.key_prefix = "elsewhere:";
  Runtime outside(o);
  auto refused = outside.acquire(test_key(), 5s);
  EXPECT_NE(auth_error_of(refused).find("NOPERM"), std::string::npos);
}

TEST_F(RedisAclTest, AWrongPasswordIsAnAuthError) {
  Options o = as("lockwatch");
  o.redis_url = as_user(server_->url(), "lockwatch", "wrong");
  Runtime rt(o);
  auto f = rt.acquire(test_key(), 5s);
  auto e = error_of<AuthError>(f);
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("WRONGPASS"), std::string::npos) << e->what();
  EXPECT_STREQ(e->backend_code().category().name(), "lockwatch.redis") << e->what();
  EXPECT_EQ(e->backend_code().message(), "WRONGPASS") << e->what();
}

// --------------------------------------------------------------- Cluster

class RedisAclClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new RedisCluster();
    const auto rule = doc_rule("cluster");
    // Every node, replicas too: a replica may be promoted.
    for (int i = 0; i < RedisCluster::kNodes; ++i)
      add_user(cluster_->node(i), "lockwatch", "pw", plus(rule, doc_rule("scheduler")));
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static Options as(const std::string& user) {
    Options o;
    o.runtime.threads = 2;
    o.redis_url = as_user(cluster_->url(), user, "pw");
    return o;
  }
  static RedisCluster* cluster_;
};
RedisCluster* RedisAclClusterTest::cluster_ = nullptr;

TEST_F(RedisAclClusterTest, TheDocumentedRulesCoverLocksWaitsRenewalsFencingOperatorsAndJobs) {
  for (int i = 0; i < RedisCluster::kNodes; ++i) forget_refusals(cluster_->node(i));
  run_core_cases(as("lockwatch"), test_key());
  for (int i = 0; i < RedisCluster::kNodes; ++i) EXPECT_EQ(refusals(cluster_->node(i)), "") << "node " << i;
}

// A renewal while its slot migrates, the lock on the target already: the
// source answers ASK and the renewal goes again after an ASKING.
TEST_F(RedisAclClusterTest, ARenewalFollowsAnAskRedirectAsTheUser) {
  Runtime rt(as("lockwatch"));
  const std::string key = test_key();
  for (int i = 0; i < RedisCluster::kNodes; ++i) forget_refusals(cluster_->node(i));
  auto f = rt.acquire(key, 300ms);
  LockHandle h = get_bounded(f);
  const int slot = static_cast<int>(lock_slot(key));
  const int owner = cluster_->master_of_slot(slot);
  int to = -1;
  for (int m : cluster_->masters())
    if (m != owner) to = m;
  ASSERT_GE(to, 0);
  const int from = cluster_->begin_migration(slot, to);
  cluster_->migrate(from, to, {lock_key(key)});
  EXPECT_TRUE(renewed_again(h.lease(), 2));
  const std::string metrics = rt.metrics_text();
  const std::string ask = "lockwatch_cluster_redirects_total{kind=\"ask\"} ";
  const auto at = metrics.find(ask);
  ASSERT_NE(at, std::string::npos);
  EXPECT_GE(std::stoll(metrics.substr(at + ask.size())), 1) << "an ASK was followed";
  cluster_->finish_migration(slot, from, to);
  EXPECT_TRUE(renewed_again(h.lease(), 1));
  auto back = h.release();
  get_bounded(back);
  EXPECT_EQ(refusals(cluster_->node(to)), "");
}

TEST_F(RedisAclClusterTest, WithoutTheSlotMapCommandsCallsFailWithAuthErrorNamingThem) {
  const auto rule = without(without(doc_rule("cluster"), "+cluster|shards"), "+cluster|slots");
  for (int i = 0; i < RedisCluster::kNodes; ++i) add_user(cluster_->node(i), "noslots", "pw", rule);
  Runtime rt(as("noslots"));
  auto f = rt.acquire(test_key(), 5s);
  const std::string what = auth_error_of(f);
  EXPECT_NE(what.find("NOPERM"), std::string::npos) << what;
  EXPECT_NE(what.find("CLUSTER SHARDS"), std::string::npos) << what;
}

// -------------------------------------------------------------- Sentinel

// One sentinel watching `master`, with a restricted user of its own
// (`sentinel` rule, password "spw") as a `user` line of sentinel.conf.
class Sentinel {
 public:
  Sentinel(const RedisServer& master, const std::vector<std::string>& rule) : port_(free_loopback_port()) {
    char tmpl[] = "/tmp/lockwatch-acl-sentinel-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    const std::string conf = dir_ + "/sentinel.conf";
    std::ofstream out(conf);
    out << "port " << port_ << "\nbind 127.0.0.1\ndir " << dir_ << "\nlogfile " << dir_ << "/sentinel.log\n"
        << "sentinel monitor mymaster 127.0.0.1 " << master.port() << " 1\n"
        << "user sentinel-user on >spw";
    for (const auto& w : rule) out << ' ' << w;
    out << "\n";
    out.close();
    proc_ = std::make_unique<ChildProcess>(std::vector<std::string>{"redis-server", conf, "--sentinel"});
    const auto until = steady_clock::now() + kBound;
    while (steady_clock::now() < until) {
      if (answers()) return;
      std::this_thread::sleep_for(20ms);  // process start-up
    }
    throw std::runtime_error("the sentinel did not start");
  }
  ~Sentinel() {
    proc_.reset();
    const std::string cmd = "rm -rf '" + dir_ + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir_.c_str());
  }
  int port() const { return port_; }
  // `ACL LOG` (RESET with `reset`), as the default user.
  std::string refusals(bool reset = false) const {
    timeval tv{1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      return "(no connection)";
    }
    auto* r = static_cast<redisReply*>(redisCommand(c, reset ? "ACL LOG RESET" : "ACL LOG"));
    std::string out;
    if (r == nullptr) {
      out = "(no reply)";
    } else if (r->type == REDIS_REPLY_ARRAY) {
      Reply log;
      log.type = Reply::Type::kArray;
      for (std::size_t i = 0; i < r->elements; ++i) {
        Reply entry;
        const redisReply* e = r->element[i];
        for (std::size_t j = 0; e->type == REDIS_REPLY_ARRAY && j < e->elements; ++j) {
          Reply field;
          if (e->element[j]->str != nullptr) field.str.assign(e->element[j]->str, e->element[j]->len);
          entry.elements.push_back(field);
        }
        log.elements.push_back(entry);
      }
      out = lockwatch::testing::refusals(log);
    } else if (r->type == REDIS_REPLY_ERROR) {
      out = std::string("(error: ") + r->str + ")";
    }
    if (r) freeReplyObject(r);
    redisFree(c);
    return out;
  }

 private:
  // The default user asks for the master's address.
  bool answers() const {
    timeval tv{1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      return false;
    }
    auto* r = static_cast<redisReply*>(redisCommand(c, "SENTINEL get-master-addr-by-name mymaster"));
    const bool ok = r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == 2;
    if (r) freeReplyObject(r);
    redisFree(c);
    return ok;
  }
  int port_;
  std::string dir_;
  std::unique_ptr<ChildProcess> proc_;
};

class RedisAclSentinelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    master_ = new RedisServer();
    const auto node = plus(doc_rule("node"), doc_rule("scheduler"));
    add_user(*master_, "lockwatch", "pw", plus(node, doc_rule("sentinel-master")));
    sentinel_ = new Sentinel(*master_, doc_rule("sentinel"));
  }
  static void TearDownTestSuite() {
    delete sentinel_;
    sentinel_ = nullptr;
    delete master_;
    master_ = nullptr;
  }
  static Options as(const std::string& user, const std::string& sentinel_password = "spw") {
    Options o;
    o.runtime.threads = 2;
    o.redis_url = "redis-sentinel://" + user + ":pw@127.0.0.1:" + std::to_string(sentinel_->port()) +
                  "/mymaster?sentinel_user=sentinel-user&sentinel_password=" + sentinel_password;
    return o;
  }
  static RedisServer* master_;
  static Sentinel* sentinel_;
};
RedisServer* RedisAclSentinelTest::master_ = nullptr;
Sentinel* RedisAclSentinelTest::sentinel_ = nullptr;

TEST_F(RedisAclSentinelTest, TheDocumentedRulesCoverLocksWaitsRenewalsFencingOperatorsAndJobs) {
  forget_refusals(*master_);
  sentinel_->refusals(/*reset=*/true);
  run_core_cases(as("lockwatch"), test_key());
  EXPECT_EQ(refusals(*master_), "");
  EXPECT_EQ(sentinel_->refusals(), "") << "the sentinel refused nothing (SUBSCRIBE +switch-master included)";
}

TEST_F(RedisAclSentinelTest, WithoutRoleOnTheMasterCallsFailWithAuthErrorNamingIt) {
  add_user(*master_, "norole", "pw", plus(doc_rule("node"), doc_rule("scheduler")));
  Runtime rt(as("norole"));
  auto f = rt.acquire(test_key(), 5s);
  const std::string what = auth_error_of(f);
  EXPECT_NE(what.find("ROLE was refused"), std::string::npos) << what;
  EXPECT_NE(what.find("'role'"), std::string::npos) << what;
}

TEST_F(RedisAclSentinelTest, WrongSentinelCredentialsLeaveTheMasterUnknown) {
  Options o = as("lockwatch", "wrong");
  o.connection.connect_timeout = 500ms;
  Runtime rt(o);
  auto f = rt.acquire(test_key(), 5s);
  auto e = error_of<ConnectionError>(f);
  ASSERT_NE(e, nullptr);
  EXPECT_NE(std::string(e->what()).find("master"), std::string::npos) << e->what();
}

}  // namespace
}  // namespace lockwatch::testing
