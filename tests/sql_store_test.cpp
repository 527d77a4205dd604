// What only the SQL store (mysql://) has, against a real mariadbd: its URL,
// its table (created when missing, refused with the wrong columns, named
// by ?table=) and the companion table of shared, permit and fair holders,
// the unix socket, the fence kept in the row, the operators' tools,
// many statements in one round trip where one may fail alone, and the
// waiter's mark that keeps a waiter's turn across processes.
// The behaviour every store shares is in store_contract_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "support/mariadb_server.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

class SqlStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new MariaDbServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  static Options options(const std::string& url) {
    Options o;
    o.redis_url = url;
    o.runtime.threads = 2;
    o.connection.connect_timeout = 2s;
    return o;
  }
  // A key unique to the running test.
  static std::string key(const std::string& suffix = "") {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + suffix;
  }
  static std::string db_table(const std::string& table = "lockwatch_locks") {
    return std::string(MariaDbServer::kDatabase) + "." + table;
  }

  static MariaDbServer* server_;
};
MariaDbServer* SqlStoreTest::server_ = nullptr;

LockHandle take(Runtime& rt, const std::string& key, std::chrono::milliseconds ttl, Retries retries = forever) {
  auto f = rt.acquire({.key = key, .ttl = ttl, .retries = retries});
  return get_bounded(f);
}

TEST_F(SqlStoreTest, MalformedUrlsAreInvalidArgumentsThatHideThePassword) {
  expect_refused_urls(
      {
        "mysql://127.0.0.1:3306/db",                       // no user
        "mysql://u:secret@127.0.0.1:3306",                 // no database
        "mysql://u:secret@127.0.0.1:x/db",                 // bad port
        "mysql://u:secret@127.0.0.1:70000/db",             // port out of range
        "mysql://u:secret@:3306/db",                       // no host
        "mysql://u:secret@127.0.0.1/db?table=a;drop",      // a table name that is not an identifier
        "mysql://u:secret@127.0.0.1/db-1",                 // nor a database name
        "mysql://u:secret@localhost/db?socket=relative",   // a socket path that is not absolute
        "mysql://u:secret@127.0.0.1/db?colour=blue",       // an unknown parameter
      },
      [](const char* url) { return options(url); }, "mysql://");
  Options replicas = options(server_->url());
  add_url_param(replicas, "min_replicas=1");  // a Redis setting
  EXPECT_THROW(replicas.validate(), InvalidArgument);
  Options fine = options("mysql://u:p%40ss@db.example:3307/app?table=locks&socket=/run/mysqld/mysqld.sock");
  EXPECT_NO_THROW(fine.validate());
}

TEST_F(SqlStoreTest, AnUnknownDatabaseIsAClearConnectionError) {
  std::string url = "mysql://lockwatch:lockwatch-pw@127.0.0.1:" + std::to_string(server_->port()) + "/nope";
  Runtime rt(options(url));
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  auto err = error_of<ConnectionError>(fut);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("nope"), std::string::npos) << err->what();
}

TEST_F(SqlStoreTest, TheTableIsCreatedWhenMissingAndNamedByTheUrl) {
  Runtime rt(options(server_->url() + "?table=made_here"));
  auto h = take(rt, key(), 2s);
  auto ddl = server_->query("SHOW CREATE TABLE " + db_table("made_here"));
  ASSERT_EQ(ddl.size(), 1u);
  for (const char* column : {"lock_name", "owner", "fence", "expires_at", "last_period", "PRIMARY KEY"})
    EXPECT_NE(ddl[0][1].find(column), std::string::npos) << ddl[0][1];
  auto rows = server_->query("SELECT owner <> '', expires_at > UTC_TIMESTAMP(6) FROM " + db_table("made_here") +
                             " WHERE lock_name = 'lockwatch:" + key() + "'");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"1", "1"}));
}

TEST_F(SqlStoreTest, ATableWithTheWrongColumnsIsAClearErrorNamingIt) {
  server_->query("CREATE TABLE " + db_table("not_locks") + " (lock_name VARCHAR(10) PRIMARY KEY, holder INT)");
  Runtime rt(options(server_->url() + "?table=not_locks"));
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  auto err = error_of<StoreRefused>(fut);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("not_locks"), std::string::npos) << err->what();
  EXPECT_NE(std::string(err->what()).find("columns"), std::string::npos) << err->what();
  EXPECT_EQ(err->backend_code().value(), 1054);  // unknown column
}

TEST_F(SqlStoreTest, TheUnixSocketWorks) {
  Runtime rt(options(server_->socket_url()));
  auto f = locked("sock", 1s, 0).on(rt)([] { return this_lease().fencing_token(); });
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 1u);
}

TEST_F(SqlStoreTest, AHostNameIsLookedUpAndAnUnknownOneIsAConnectionError) {
  std::string by_name = "mysql://lockwatch:lockwatch-pw@localhost:" + std::to_string(server_->port()) + "/" +
                        MariaDbServer::kDatabase;
  Runtime rt(options(by_name));
  auto f = locked("named", 1s, 0).on(rt)([] { return this_lease().fencing_token(); });
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 1u);

  Options o = options("mysql://lockwatch:x@no-such-host.invalid/lockwatch_test");
  o.connection.connect_timeout = 1s;
  Runtime nowhere(o);
  auto g = locked("k", 1s, 0).on(nowhere)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut2 = g();
  auto err = error_of<ConnectionError>(fut2);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("no-such-host.invalid"), std::string::npos) << err->what();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST_F(SqlStoreTest, TheFenceLivesInTheRowAndSurvivesReleases) {
  Runtime rt(options(server_->url()));
  std::uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    auto h = take(rt, key(), 2s);
    EXPECT_GT(h.lease().fencing_token(), last);
    last = h.lease().fencing_token();
    auto r = h.release();
    get_bounded(r);
  }
  auto rows = server_->query("SELECT fence, owner FROM " + db_table() + " WHERE lock_name = 'lockwatch:" + key() + "'");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][0], std::to_string(last));
  EXPECT_EQ(rows[0][1], "");
  auto state = rt.inspect(key());
  auto s = get_bounded(state);
  EXPECT_FALSE(s.held);
  EXPECT_EQ(s.fencing_token, last);
}

TEST_F(SqlStoreTest, OperatorsCanInspectAndForceRelease) {
  Runtime a(options(server_->url())), b(options(server_->url()));
  auto h = take(a, key(), 10s);
  auto state = b.inspect(key());
  auto s = get_bounded(state);
  EXPECT_TRUE(s.held);
  EXPECT_GT(s.ttl, 5s);
  EXPECT_EQ(s.fencing_token, h.lease().fencing_token());
  auto forced = b.force_release(key());
  EXPECT_TRUE(get_bounded(forced));
  auto again = take(b, key(), 2s, 0);
  EXPECT_GT(again.lease().fencing_token(), h.lease().fencing_token());
  // The old holder learns it at its next renewal (or its release).
  auto r = h.release();
  EXPECT_TRUE(error_of<LeaseLost>(r));
}

TEST_F(SqlStoreTest, ManyAcquisitionsShareRoundTripsAndEachIsAnsweredOnItsOwn) {
  // A table whose lock_name is shorter than lockwatch's: a name too long
  // for it fails with the server's error, alone; the others in the same
  // round trips are taken.
  server_->query("CREATE TABLE " + db_table("short_names") +
                 " (lock_name VARBINARY(24) NOT NULL PRIMARY KEY, owner VARBINARY(64) NOT NULL DEFAULT '', "
                 "fence BIGINT UNSIGNED NOT NULL DEFAULT 0, expires_at DATETIME(6) NOT NULL, last_period BIGINT NULL)");
  Runtime rt(options(server_->url() + "?table=short_names"));
  std::vector<std::future<LockHandle>> acquiring;
  constexpr int kKeys = 300;
  for (int i = 0; i < kKeys; ++i) acquiring.push_back(rt.acquire(i == 150 ? std::string(40, 'x') : "m" + std::to_string(i), 5s));
  std::set<std::string> taken;
  for (int i = 0; i < kKeys; ++i) {
    if (i == 150) {
      auto err = error_of<StoreRefused>(acquiring[i]);
      ASSERT_TRUE(err);
      // Data too long for the column (strict mode: never truncated).
      EXPECT_EQ(err->backend_code().value(), 1406) << err->what();
      EXPECT_STREQ(err->backend_code().category().name(), "lockwatch.mariadb");
      EXPECT_EQ(err->backend_code().message(), "ER_DATA_TOO_LONG (1406)");
      continue;
    }
    auto h = get_bounded(acquiring[i]);
    EXPECT_EQ(h.lease().fencing_token(), 1u);
    taken.insert(h.lease().key());
  }
  EXPECT_EQ(taken.size(), static_cast<std::size_t>(kKeys - 1));
}

// A set's keys asked for together are decided by one statement: a free
// set is taken in one transaction, never key by key.
TEST_F(SqlStoreTest, AFreeSetIsTakenByOneStatement) {
  Runtime rt(options(server_->url()));
  take(rt, key(":warm"), 5s).release().get();  // the connections are up and the tables checked
  auto inserts = [] {
    auto rows = server_->query("SHOW GLOBAL STATUS LIKE 'Com_insert'");
    return rows.empty() || rows[0].size() < 2 ? -1LL : std::stoll(rows[0][1]);
  };
  const long long before = inserts();
  auto f = rt.acquire({.key = all_of(key(":d"), key(":b"), key(":a"), key(":c")), .ttl = 5s});
  LockHandle h = get_bounded(f);
  EXPECT_EQ(inserts() - before, 1);
  ASSERT_EQ(h.lease().keys().size(), 4u);
  for (const auto& k : h.lease().keys()) EXPECT_EQ(h.lease().fencing_token(k), 1u) << k;
  h.release().get();
  auto rows = server_->query("SELECT COUNT(*) FROM " + db_table() + " WHERE lock_name LIKE 'lockwatch:" + key() +
                             ":_' AND owner = ''");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][0], "4");  // all given back
}

// A set of another kind is decided in one transaction (its keys' decisions
// one after the other in it), as an exclusive set is in one statement.
TEST_F(SqlStoreTest, ASharedSetIsTakenInOneTransaction) {
  Runtime rt(options(server_->url())), other(options(server_->url()));
  take(rt, key(":warm"), 5s).release().get();  // both connected, tables checked
  take(other, key(":warm2"), 5s).release().get();
  expect_shared_set_in_one_step(rt, other, key(), [] {
    auto rows = server_->query("SHOW GLOBAL STATUS LIKE 'Com_commit'");
    return rows.empty() || rows[0].size() < 2 ? -1LL : std::stoll(rows[0][1]);
  });
}

TEST_F(SqlStoreTest, AnOlderInstallGetsTheHoldersTableWhenMissing) {
  // A lock table made before the other kinds were kept: the store adds the
  // companion table and keeps using the old one, with the owner columns
  // added since.
  server_->query("CREATE TABLE " + db_table("older") +
                 " (lock_name VARBINARY(255) NOT NULL PRIMARY KEY, owner VARBINARY(64) NOT NULL DEFAULT '', "
                 "fence BIGINT UNSIGNED NOT NULL DEFAULT 0, expires_at DATETIME(6) NOT NULL, last_period BIGINT NULL)");
  Options named = options(server_->url() + "?table=older");
  named.runtime.owner_name = "maria owner";
  Runtime rt(named);
  auto f = rt.acquire({.key = key(), .ttl = 5s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(f);
  auto lock_ddl = server_->query("SHOW CREATE TABLE " + db_table("older"));
  ASSERT_EQ(lock_ddl.size(), 1u);
  EXPECT_NE(lock_ddl[0][1].find("owner_name"), std::string::npos) << lock_ddl[0][1];
  EXPECT_NE(lock_ddl[0][1].find("granted_at"), std::string::npos) << lock_ddl[0][1];
  auto state = rt.inspect(key());
  const LockState s = get_bounded(state);
  EXPECT_EQ(s.kind, LockKind::shared());
  ASSERT_EQ(s.holders.size(), 1u);
  EXPECT_EQ(s.holders[0].owner, "maria owner");
  auto ddl = server_->query("SHOW CREATE TABLE " + db_table("older_holders"));
  ASSERT_EQ(ddl.size(), 1u);
  for (const char* column : {"lock_name", "owner", "role", "seq", "expires_at", "PRIMARY KEY"})
    EXPECT_NE(ddl[0][1].find(column), std::string::npos) << ddl[0][1];
  auto rows = server_->query("SELECT role FROM " + db_table("older_holders") + " WHERE lock_name = 'lockwatch:" +
                             key() + "'");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][0], "r");
  auto g = reader.release();
  get_bounded(g);
  EXPECT_TRUE(server_->query("SELECT 1 FROM " + db_table("older_holders") + " WHERE lock_name = 'lockwatch:" + key() +
                             "'")
                  .empty());
}

TEST_F(SqlStoreTest, AnInstallBeforeWaiterMarksGetsTheirColumns) {
  // A lock table as the version before made it (owner names, no waiter's
  // mark): the store adds the mark's columns and locks as before.
  server_->query("CREATE TABLE " + db_table("before_marks") +
                 " (lock_name VARBINARY(255) NOT NULL PRIMARY KEY, owner VARBINARY(64) NOT NULL DEFAULT '', "
                 "fence BIGINT UNSIGNED NOT NULL DEFAULT 0, expires_at DATETIME(6) NOT NULL, last_period BIGINT NULL, "
                 "owner_name VARBINARY(128) NOT NULL DEFAULT '', granted_at DATETIME(6) NULL)");
  Runtime a(options(server_->url() + "?table=before_marks")), b(options(server_->url() + "?table=before_marks"));
  LockHandle h = take(a, key(), 5s);
  auto ddl = server_->query("SHOW CREATE TABLE " + db_table("before_marks"));
  ASSERT_EQ(ddl.size(), 1u);
  EXPECT_NE(ddl[0][1].find("`waiter` varbinary(64) NOT NULL DEFAULT ''"), std::string::npos) << ddl[0][1];
  EXPECT_NE(ddl[0][1].find("`waiter_until` datetime(6)"), std::string::npos) << ddl[0][1];
  auto busy = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 100ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(busy));
  auto marks = server_->query("SELECT waiter <> '', waiter_until > UTC_TIMESTAMP(6) FROM " + db_table("before_marks") +
                              " WHERE lock_name = 'lockwatch:" + key() + "'");
  ASSERT_EQ(marks.size(), 1u);
  EXPECT_EQ(marks[0], (std::vector<std::string>{"1", "1"}));  // b's mark, left while it waited
  auto r = h.release();
  get_bounded(r);
}

// A waiter in another process (here: another runtime, with its own
// connections) polls, while callers in the holder's process are woken at
// each release and take the key again a round trip later: its mark on
// the row makes the key wait for it.
TEST_F(SqlStoreTest, AWaiterInAnotherProcessIsNotStarvedByLocalCallers) {
  Runtime churner(options(server_->url())), other(options(server_->url()));
  std::atomic<bool> stop{false};
  std::atomic<int> taken{0};
  std::vector<std::thread> churn;
  for (int t = 0; t < 2; ++t) {
    churn.emplace_back([&] {
      while (!stop.load()) {
        auto f = churner.acquire({.key = key(), .ttl = 2s, .retries = forever, .wait = 10s});
        if (f.wait_for(kBound) != std::future_status::ready) {
          ADD_FAILURE() << "a local caller was not answered within the bound";
          return;
        }
        try {
          LockHandle h = f.get();
          taken++;
          std::this_thread::sleep_for(2ms);  // the work
          auto r = h.release();
          r.wait_for(kBound);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "a local caller failed: " << e.what();
          return;
        }
      }
    });
  }
  for (int i = 0; i < 20000 && taken.load() < 20; ++i) std::this_thread::sleep_for(1ms);  // polling a counter
  const int before = taken.load();
  auto f = other.acquire({.key = key(), .ttl = 2s, .retries = forever, .wait = 5s});
  const auto status = f.wait_for(kBound);
  bool granted = false;
  if (status == std::future_status::ready) {
    try {
      LockHandle h = f.get();
      granted = true;
      auto r = h.release();
      r.wait_for(kBound);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the other process's waiter was not granted: " << e.what();
    }
  }
  stop = true;
  for (auto& t : churn) t.join();
  EXPECT_GE(before, 20);  // the key was being taken when the other asked
  EXPECT_TRUE(granted);
}

// A caller that waits leaves its runtime's mark on the busy row; once the
// row is free, the mark keeps it for that waiter, and the grant clears it.
TEST_F(SqlStoreTest, AFreeRowMarkedByAWaiterGoesToThatWaiter) {
  Runtime a(options(server_->url())), b(options(server_->url()));
  LockHandle h = take(a, key(), 10s);
  auto waiting = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 5s});
  const std::string mark = "SELECT waiter <> '' AND waiter_until > UTC_TIMESTAMP(6) FROM " + db_table() +
                           " WHERE lock_name = 'lockwatch:" + key() + "'";
  auto marked = [&] {
    auto rows = server_->query(mark);
    return rows.size() == 1 && rows[0][0] == "1";
  };
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (!marked() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);  // polling the row
  ASSERT_TRUE(marked());
  auto r = h.release();
  get_bounded(r);
  // Free now (or already b's): a caller of the holder's process is refused.
  auto again = a.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(again));
  LockHandle w = get_bounded(waiting);
  EXPECT_FALSE(marked());
  auto g = w.release();
  get_bounded(g);
}

// The mark names the runtime, not the call: a caller that waits again
// with a new call (as a job's standby does) keeps the turn its earlier
// call marked, and is not held back by that mark.
TEST_F(SqlStoreTest, ARuntimeThatWaitsAgainKeepsItsTurn) {
  Runtime a(options(server_->url())), b(options(server_->url()));
  LockHandle h = take(a, key(), 10s);
  auto first = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 200ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(first));
  auto r = h.release();
  get_bounded(r);
  auto refused = a.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(refused));  // free, but b's turn
  const auto t0 = std::chrono::steady_clock::now();
  auto again = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 5s});
  LockHandle w = get_bounded(again);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);  // its mark lives 2 s: it was not waited out
  auto g = w.release();
  get_bounded(g);
}

// A call without a wait leaves no mark; a waiter that gave up leaves its
// mark to run out: the key waits for it no longer than the mark lives.
TEST_F(SqlStoreTest, AWaiterThatGaveUpHoldsTheKeyBackOnlyWhileItsMarkLives) {
  Runtime a(options(server_->url())), b(options(server_->url()));
  LockHandle h = take(a, key(), 10s);
  const std::string row = " FROM " + db_table() + " WHERE lock_name = 'lockwatch:" + key() + "'";
  auto tried = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(tried));
  auto none = server_->query("SELECT waiter" + row);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0][0], "");
  auto gave_up = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 300ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(gave_up));
  const auto asked = std::chrono::steady_clock::now();
  auto left = server_->query("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), waiter_until)" + row);
  ASSERT_EQ(left.size(), 1u);
  const auto life = std::chrono::microseconds(std::stoll(left[0][0]));
  ASSERT_GT(life, 500ms);  // at most 2 s from its last poll, within its 300 ms wait
  auto r = h.release();
  get_bounded(r);
  auto next = a.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 5s});
  LockHandle n = get_bounded(next);
  const auto waited = std::chrono::steady_clock::now() - asked;
  EXPECT_GE(waited, life);                  // held back while the mark lived
  EXPECT_LT(waited, life + 1s);             // and not much longer (the blocked caller looks every 100 ms)
  auto cleared = server_->query("SELECT waiter" + row);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_EQ(cleared[0][0], "");  // the grant clears a mark run out
  auto g = n.release();
  get_bounded(g);
}

TEST_F(SqlStoreTest, AKeyHeldAsOneKindIsRefusedAsAnother) {
  Runtime a(options(server_->url())), b(options(server_->url()));
  auto f = a.acquire({.key = key(), .ttl = 5s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(f);
  for (LockKind other : {LockKind::permits(2), LockKind::fair()}) {
    auto refused = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms, .kind = other});
    auto e = error_of<InvalidArgument>(refused);
    ASSERT_TRUE(e) << other.describe();
    EXPECT_NE(std::string(e->what()).find("shared"), std::string::npos) << e->what();
  }
  auto g = reader.release();
  get_bounded(g);
  // Free again: a fair holder now, and the other kinds are refused.
  auto fair = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::fair()});
  LockHandle h = get_bounded(fair);
  auto exclusive = a.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms});
  auto e = error_of<InvalidArgument>(exclusive);
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("fair"), std::string::npos) << e->what();
  auto r = h.release();
  get_bounded(r);
}

TEST_F(SqlStoreTest, ARowLeftByAKilledReaderExpiresOnTheDatabasesClock) {
  // What a reader killed mid-lease leaves: its row and the lock row's
  // marker, 400 ms to run on the server's clock. A writer waits that long,
  // not for any client's clock.
  const std::string name = "'lockwatch:" + key() + "'";
  server_->query("INSERT INTO " + db_table() + " (lock_name, owner, fence, expires_at) VALUES (" + name +
                 ", 'lockwatch:shared', 7, UTC_TIMESTAMP(6) + INTERVAL 400000 MICROSECOND)");
  server_->query("INSERT INTO " + db_table("lockwatch_locks_holders") +
                 " (lock_name, owner, role, expires_at) VALUES (" + name +
                 ", 'dead', 'r', UTC_TIMESTAMP(6) + INTERVAL 400000 MICROSECOND)");
  Runtime rt(options(server_->url()));
  auto t0 = std::chrono::steady_clock::now();
  auto busy = rt.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(busy));
  auto f = rt.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 5s});
  LockHandle writer = get_bounded(f);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
  EXPECT_EQ(writer.lease().fencing_token(), 8u);
  auto r = writer.release();
  get_bounded(r);
}

TEST_F(SqlStoreTest, OperatorsSeeAndForceReleaseAKeyHeldByReaders) {
  Runtime a(options(server_->url())), b(options(server_->url()));
  auto f = a.acquire({.key = key(), .ttl = 10s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(f);
  auto state = b.inspect(key());
  auto s = get_bounded(state);
  EXPECT_TRUE(s.held);
  EXPECT_GT(s.ttl, 5s);
  auto forced = b.force_release(key());
  EXPECT_TRUE(get_bounded(forced));
  EXPECT_TRUE(server_->query("SELECT 1 FROM " + db_table("lockwatch_locks_holders") + " WHERE lock_name = 'lockwatch:" +
                             key() + "'")
                  .empty());
  auto writer = b.acquire({.key = key(), .ttl = 2s, .retries = 0});
  LockHandle w = get_bounded(writer);
  // The reader learns it at its next renewal (or its release).
  auto r = reader.release();
  EXPECT_TRUE(error_of<LeaseLost>(r));
  auto g = w.release();
  get_bounded(g);
}

}  // namespace
}  // namespace lockwatch::testing
