// Pure logic: URL parsing, option checks, key patterns, script names.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <string_view>

#include <unistd.h>

#include "lockwatch/lockwatch.hpp"
#include "core/option_checks.hpp"
#include "core/timing.hpp"
#include "store/redis/scripts.hpp"
#include "core/token.hpp"

namespace lockwatch {
namespace {

using namespace std::chrono_literals;

TEST(EndpointTest, ParsesEveryPartOfARedisUrl) {
  auto ep = Endpoint::parse("redis://alice:s%40cret@example.org:6380/3");
  EXPECT_EQ(ep.user, "alice");
  EXPECT_EQ(ep.password, "s@cret");
  EXPECT_EQ(ep.host, "example.org");
  EXPECT_EQ(ep.port, 6380);
  EXPECT_EQ(ep.db, 3);
  EXPECT_EQ(ep.name(), "example.org:6380");
}

TEST(EndpointTest, DefaultsAndPasswordOnlyForms) {
  auto ep = Endpoint::parse("redis://127.0.0.1");
  EXPECT_EQ(ep.port, 6379);
  EXPECT_EQ(ep.db, 0);
  EXPECT_TRUE(ep.password.empty());
  auto pw = Endpoint::parse("redis://:pw@localhost:7000");
  EXPECT_EQ(pw.user, "");
  EXPECT_EQ(pw.password, "pw");
  auto v6 = Endpoint::parse("redis://[::1]:7001/0");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 7001);
  EXPECT_EQ(v6.name(), "[::1]:7001");
}

TEST(EndpointTest, MalformedUrlsAreRejectedWithoutShowingThePassword) {
  for (const char* bad : {"", "http://x:1", "redis://", "redis://:1", "redis://h:0", "redis://h:70000", "redis://h:x",
                          "redis://h:1/db", "redis://[::1", "redis://u:p%zz@h:1"}) {
    EXPECT_THROW(Endpoint::parse(bad), InvalidArgument) << bad;
  }
  try {
    Endpoint::parse("redis://user:topsecret@host:notaport");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find("topsecret"), std::string::npos) << e.what();
  }
}

TEST(OptionsTest, ValidateRejectsOutOfRangeFields) {
  Options o;
  EXPECT_NO_THROW(o.validate());
  auto bad = [](auto mutate) {
    Options x;
    mutate(x);
    EXPECT_THROW(x.validate(), InvalidArgument);
  };
  bad([](Options& x) { x.watchdog.tick = 0ms; });
  bad([](Options& x) { x.watchdog.wheel_size = 0; });
  bad([](Options& x) { x.watchdog.renew_weight = 1.0; });
  bad([](Options& x) { x.watchdog.renew_weight = 0.0; });
  bad([](Options& x) { x.connection.connect_timeout = 0ms; });
  bad([](Options& x) { x.redis_url = "nope"; });
  bad([](Options& x) { x.watchdog.min_renewal_window = -1ms; });
  bad([](Options& x) { x.runtime.busy_poll = std::chrono::microseconds(-2); });
  bad([](Options& x) { x.runtime.busy_poll = 10ms + std::chrono::microseconds(1); });
  Options polling;
  polling.runtime.busy_poll = 10ms;
  EXPECT_NO_THROW(polling.validate());
  polling.runtime.busy_poll = 0ms;  // off
  EXPECT_NO_THROW(polling.validate());
  Options out_of_range;
  out_of_range.redis_url = "redis://h:99999";
  EXPECT_THROW(Runtime{out_of_range}, InvalidArgument);
}

TEST(OptionsTest, BusyPollIsAdaptiveByDefaultAndFromEnv) {
  EXPECT_EQ(Options{}.runtime.busy_poll, kBusyPollAdaptive);
  EXPECT_EQ(Options::from_env().runtime.busy_poll, kBusyPollAdaptive);
  EXPECT_NO_THROW(Options{}.validate());
  Options bad;
  bad.runtime.busy_poll = std::chrono::microseconds(-5);
  try {
    bad.validate();
    ADD_FAILURE() << "a negative busy_poll other than kBusyPollAdaptive was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("busy_poll"), std::string::npos) << e.what();
  }
}

TEST(OptionsTest, TheOwnerNameIsBoundedAndHasNoControlCharacters) {
  // The default: this process's host:pid:program.
  const std::string name = detail::owner_name(Options{});
  EXPECT_NE(name.find(":" + std::to_string(::getpid()) + ":options_test"), std::string::npos) << name;
  Options named;
  named.runtime.owner_name = "billing batch (eu-west-1)";
  EXPECT_NO_THROW(named.validate());
  EXPECT_EQ(detail::owner_name(named), "billing batch (eu-west-1)");
  EXPECT_EQ(detail::connection_owner_name(named.runtime.owner_name), "billing_batch_(eu-west-1)");
  named.runtime.owner_name = std::string(Options::kMaxOwnerName, 'x');
  EXPECT_NO_THROW(named.validate());
  for (const std::string& bad : {std::string(Options::kMaxOwnerName + 1, 'x'), std::string("a\nb"),
                                std::string("tab\there"), std::string("del\x7f")}) {
    Options o;
    o.runtime.owner_name = bad;
    try {
      Runtime rt(o);
      ADD_FAILURE() << "accepted the owner name '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("owner_name"), std::string::npos) << e.what();
    }
  }
  ::setenv("LOCKWATCH_OWNER_NAME", "from-env", 1);
  EXPECT_EQ(Options::from_env().runtime.owner_name, "from-env");
  ::unsetenv("LOCKWATCH_OWNER_NAME");
}

TEST(OptionsTest, FromEnvReadsTheRedisUrl) {
  ::setenv("LOCKWATCH_REDIS_URL", "redis://10.0.0.9:7777", 1);
  EXPECT_EQ(Options::from_env().redis_url, "redis://10.0.0.9:7777");
  ::unsetenv("LOCKWATCH_REDIS_URL");
  EXPECT_EQ(Options::from_env().redis_url, "redis://127.0.0.1:6379");
}

TEST(BuilderTest, RejectsBadTtlRetriesWeightAndWait) {
  EXPECT_THROW(locked("k", 0ms, 1), InvalidArgument);
  EXPECT_THROW(locked("k", -5s, 1), InvalidArgument);
  EXPECT_THROW(locked("k", 1s, -1), InvalidArgument);
  EXPECT_THROW(locked("k", 1s, 1).renew_weight(0.0), InvalidArgument);
  EXPECT_THROW(locked("k", 1s, 1).renew_weight(1.0), InvalidArgument);
  EXPECT_THROW(locked("k", 1s, 1).renew_weight(1.5), InvalidArgument);
  EXPECT_THROW(locked("k", 1s, 1).wait(-1ms), InvalidArgument);
  EXPECT_NO_THROW(locked("k", 1s, forever).renew_weight(0.5).wait(0ms));
}

struct Opaque {};

TEST(KeyPatternTest, FormatsReferencedArguments) {
  auto f = LOCKED("order:{0}:{1}", 1s, 0)[](int id, const std::string& who) { return id + who.size(); };
  EXPECT_EQ(f.key_for(7, std::string("ann")), "order:7:ann");
  auto auto_index = LOCKED("a{}b{}", 1s, 0)[](int, int) {};
  EXPECT_EQ(auto_index.key_for(1, 2), "a1b2");
  auto braces = LOCKED("{{lit}}:{0}", 1s, 0)[](int) {};
  EXPECT_EQ(braces.key_for(3), "{lit}:3");
  auto twice = LOCKED("}}{1}{{{0}}}{1}", 1s, 0)[](int, int) {};
  EXPECT_EQ(twice.key_for(1, 2), "}2{1}2");
  // An argument of any type is fine while the pattern does not use it.
  auto opaque = LOCKED("job:{0}", 1s, 0)[](int, Opaque) {};
  EXPECT_EQ(opaque.key_for(5, Opaque{}), "job:5");
}

enum Plain { kPlainThree = 3 };
enum class Level : std::uint8_t { kLow = 0, kHigh = 200 };

TEST(KeyPatternTest, WritesEveryKindOfKeyPart) {
  auto numbers = LOCKED("{}|{}|{}|{}|{}|{}", 1s, 0)[](int, std::int64_t, std::uint64_t, signed char, Plain, Level) {};
  EXPECT_EQ(numbers.key_for(-7, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::uint64_t>::max(),
                            static_cast<signed char>(-3), kPlainThree, Level::kHigh),
            "-7|-9223372036854775808|18446744073709551615|-3|3|200");
  auto others = LOCKED("{}|{}|{}|{}|{}|{}|{}", 1s, 0)[](bool, bool, char, double, float, const char*,
                                                         std::string_view) {};
  EXPECT_EQ(others.key_for(true, false, 'x', 0.1, 0.1F, "c", std::string_view("sv")), "true|false|x|0.1|0.1|c|sv");
  const char name[] = "array";
  auto array = locked("{0}", 1s, 0)([](const char*) {});
  EXPECT_EQ(array.key_for(name), "array");
}

}  // namespace
}  // namespace lockwatch

// lockwatch_key, found by argument-dependent lookup in the type's namespace.
namespace shop {
struct Sku {
  int id;
};
std::string lockwatch_key(const Sku& s) { return "sku-" + std::to_string(s.id); }
enum class Color { kRed, kBlue };
const char* lockwatch_key(Color c) { return c == Color::kRed ? "red" : "blue"; }
struct Named {
  std::string name;
};
const std::string& lockwatch_key(const Named& n) { return n.name; }
}  // namespace shop

namespace lockwatch {
namespace {

TEST(KeyPatternTest, TypesSpellThemselvesWithLockwatchKey) {
  auto f = LOCKED("{}:{}:{}", 1s, 0)[](shop::Sku, shop::Color, const shop::Named&) {};
  EXPECT_EQ(f.key_for(shop::Sku{42}, shop::Color::kBlue, shop::Named{"north"}), "sku-42:blue:north");
  // A long one, returned by value, outlives the call that made it.
  EXPECT_EQ(f.key_for(shop::Sku{1234567890}, shop::Color::kRed, shop::Named{std::string(40, 'n')}),
            "sku-1234567890:red:" + std::string(40, 'n'));
}

// Keys name locks across processes, some of them on earlier lockwatch
// versions (whose keys fmt's "{}" spelled): numbers must read the same.
TEST(KeyPatternTest, NumbersAreSpelledAsBefore) {
  auto d = LOCKED("{}", 1s, 0)[](double) {};
  for (double v : {0.0, -0.0, 0.1, 1.0 / 3, 19.99, 1e-4, 1.5e-5, 1e-5, 123456.789, 1e15, 9.999999999999998e15, 1e16,
                   1.5e16, 1e100, -2.5e-300, 5e-324, std::numeric_limits<double>::max(),
                   std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_EQ(d.key_for(v), fmt::format("{}", v)) << v;
  }
  auto f = LOCKED("{}", 1s, 0)[](float) {};
  for (float v : {0.1F, 1e-5F, 3.4028235e38F, 16777216.0F, 1e16F}) EXPECT_EQ(f.key_for(v), fmt::format("{}", v)) << v;
  auto i = LOCKED("{}", 1s, 0)[](long long) {};
  for (long long v : {0LL, -1LL, std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max()}) {
    EXPECT_EQ(i.key_for(v), fmt::format("{}", v));
  }
}

TEST(KeyPatternTest, RuntimePatternsReportErrorsAsInvalidArgument) {
  std::string pattern = "job:{1}";
  auto missing = locked(pattern, 1s, 0)([](int) {});
  EXPECT_THROW(missing.key_for(1), InvalidArgument);
  auto opaque = locked(std::string("job:{1}"), 1s, 0)([](int, Opaque) {});
  EXPECT_THROW(opaque.key_for(1, Opaque{}), InvalidArgument);
  try {
    opaque.key_for(1, Opaque{});
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lockwatch_key"), std::string::npos) << e.what();
  }
  for (const char* bad : {"job:{0", "job:0}", "job:{id}", "job:{0:x}", "job:{}:{0}", "job:{0}:{}", "job:{}:{}"}) {
    auto broken = locked(std::string(bad), 1s, 0)([](int) {});
    EXPECT_THROW(broken.key_for(1), InvalidArgument) << bad;
  }
  auto null_string = locked("job:{0}", 1s, 0)([](const char*) {});
  EXPECT_THROW(null_string.key_for(static_cast<const char*>(nullptr)), InvalidArgument);
}

TEST(KeyPatternTest, MemberFunctionKeysSkipTheObject) {
  struct Acct {
    int withdraw(int id, int amount) { return id + amount; }
  };
  auto w = LOCKED("acct:{0}", 1s, 0) &Acct::withdraw;
  Acct a;
  EXPECT_EQ(w.key_for(a, 7, 100), "acct:7");
}

TEST(ScriptsTest, Sha1MatchesKnownVectors) {
  EXPECT_EQ(detail::sha1_hex(""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  EXPECT_EQ(detail::sha1_hex("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(detail::sha1_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
}

TEST(TokenTest, TokensAre128BitHexAndDistinct) {
  detail::TokenGenerator gen;
  std::set<std::string> seen;
  for (int i = 0; i < 10000; ++i) {
    auto t = gen.next().str();
    ASSERT_EQ(t.size(), 32u);
    ASSERT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos);
    ASSERT_TRUE(seen.insert(t).second);
  }
}

TEST(OptionsTest, AnUnknownSchemeIsNamedWithTheSupportedOnes) {
  Options o;
  o.redis_url = "mongodb://app:hunter2@db.example/locks";
  try {
    o.validate();
    FAIL() << "accepted " << o.redis_url;
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("'mongodb://'"), std::string::npos) << what;
    EXPECT_NE(what.find("redis-sentinel://"), std::string::npos) << what;
    EXPECT_NE(what.find("mysql://"), std::string::npos) << what;
    EXPECT_NE(what.find("postgresql://"), std::string::npos) << what;
    EXPECT_EQ(what.find("hunter2"), std::string::npos) << what;
    EXPECT_EQ(what.find("redis://***"), std::string::npos) << what;  // the scheme is not rewritten
  }
  o.redis_url = "localhost:6379";
  EXPECT_THROW(o.validate(), InvalidArgument);
}

// postgresql:// (and postgres://) is a store of its own Meson feature:
// without it, the URL is Unsupported, naming what is missing.
TEST(OptionsTest, APostgresqlUrlNeedsThePostgresqlFeature) {
  for (const char* url : {"postgresql://app:hunter2@db.example/locks", "postgres://app:hunter2@db.example/locks"}) {
    Options o;
    o.redis_url = url;
#if LOCKWATCH_WITH_POSTGRESQL
    EXPECT_NO_THROW(o.validate()) << url;
#else
    try {
      o.validate();
      ADD_FAILURE() << "accepted " << url;
    } catch (const Unsupported& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("feature 'postgresql'"), std::string::npos) << what;
      EXPECT_EQ(what.find("hunter2"), std::string::npos) << what;
    }
#endif
  }
}

// The groups nest in designated initializers; what is left out keeps its
// default (and -Wmissing-field-initializers stays quiet: every member has
// an initializer).
TEST(OptionsTest, TheGroupsNestInDesignatedInitializers) {
  const Options o{.store_url = "memory://designated",
                  .watchdog = {.tick = 2ms},
                  .connection = {.command_timeout = 1s},
                  .tls = {.server_name = "locks.example"},
                  .handoff = {.enabled = false}};
  EXPECT_EQ(o.watchdog.tick, 2ms);
  EXPECT_EQ(o.watchdog.wheel_size, 512u);
  EXPECT_EQ(o.connection.command_timeout, 1s);
  EXPECT_EQ(o.connection.connect_timeout, 2000ms);
  EXPECT_EQ(o.tls.server_name, "locks.example");
  EXPECT_TRUE(o.tls.verify);
  EXPECT_FALSE(o.handoff.enabled);
  EXPECT_EQ(o.handoff.max_streak, 1024u);
  EXPECT_EQ(o.runtime.key_prefix, "lockwatch:");
  EXPECT_EQ(o.observability.wait_warning, 10000ms);
  EXPECT_NO_THROW(o.validate());
}

// store_url_forms(): one line per kind of store, each opening with its
// first scheme; a store the build left out names its feature.
TEST(OptionsTest, TheStoreUrlFormsOpenWithEachKindsScheme) {
  const std::vector<std::string> forms = store_url_forms();
  ASSERT_EQ(forms.size(), 7u);
  const char* first[] = {"redis://", "redis-cluster://", "mysql://", "postgresql://", "zookeeper://", "etcd://", "memory://"};
  for (std::size_t i = 0; i < forms.size(); ++i) EXPECT_TRUE(forms[i].starts_with(first[i])) << forms[i];
  EXPECT_NE(forms[0].find("redis-sentinel://"), std::string::npos) << forms[0];
  EXPECT_EQ(forms[3].find("not in this build") == std::string::npos, LOCKWATCH_WITH_POSTGRESQL != 0) << forms[3];
}

TEST(OptionsTest, AMalformedUrlKeepsItsSchemeInTheMessage) {
  Options o;
  o.redis_url = "redis-sentinel://:pw@127.0.0.1:26379";  // no master name
  try {
    o.validate();
    FAIL();
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("redis-sentinel://***@127.0.0.1:26379"), std::string::npos) << what;
  }
}

TEST(OptionsTest, TheRenewalComesAtTheWeightUnlessThatLeavesTooShortAWindow) {
  using detail::renew_after;
  auto ms = [](std::chrono::steady_clock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count() / 1000.0; };
  WatchdogOptions o;                                    // weight 0.9, window 50 ms, drift 1% + 2 ms
  EXPECT_DOUBLE_EQ(ms(renew_after(o, 2s, 0.9)), 1800);  // long ttls: exactly at the weight
  EXPECT_DOUBLE_EQ(ms(renew_after(o, 200ms, 0.9)), 146);  // 200 - 4 (drift) - 50 (window)
  EXPECT_DOUBLE_EQ(ms(renew_after(o, 100ms, 0.9)), 50);   // never before half the ttl
  EXPECT_DOUBLE_EQ(ms(renew_after(o, 200ms, 0.3)), 60);   // an early weight stays as it is
  o.min_renewal_window = 0ms;
  EXPECT_DOUBLE_EQ(ms(renew_after(o, 200ms, 0.9)), 180);
}

}  // namespace
}  // namespace lockwatch
