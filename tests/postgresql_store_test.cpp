// What only the PostgreSQL store (postgresql://) has, against one real
// postgres for the whole suite (with TLS on, and pg_stat_statements to
// count the statements a waiter sends): its URL, its table (created when
// missing, refused with the wrong columns, types or key, named by
// ?table=), the unix socket, TLS through libpq's own parameters, logins
// refused, the fence kept in the row across a crash, release notices
// (LISTEN/NOTIFY) and their loss, a row lock held elsewhere, a hung
// server, a name too long for a table's own limit, and the kinds of lock
// (their holders' table, made when missing beside an existing lock table;
// one family per key; a reader's release waking a writer by a notice).
// The behaviour every store shares is in store_contract_test.cpp.
#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <set>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "store_on_loop.hpp"
#include "support/postgres_server.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

class PostgresStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new PostgresServer(PostgresServerOptions{.tls = true}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void TearDown() override {
    // A test that failed half-way leaves the server running for the next.
    server_->resume();
    if (!server_->running()) server_->start();
  }

  static Options options(const std::string& url) {
    Options o;
    o.redis_url = url;
    o.runtime.threads = 2;
    o.connection.connect_timeout = 2s;
    return o;
  }
  // The suite's server with a table of the test's own (?table=).
  static std::string url_with_table(const std::string& table) { return server_->url() + "?table=" + table; }
  // A key unique to the running test.
  static std::string key(const std::string& suffix = "") {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + suffix;
  }
  static std::string tcp(const std::string& credentials, const std::string& database,
                         const std::string& params = "") {
    return "postgresql://" + credentials + "@127.0.0.1:" + std::to_string(server_->port()) + "/" + database + params;
  }
  // Times the server ran the acquire statement on `table`.
  static long long acquire_statements(const std::string& table) {
    auto rows = server_->query("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE "
                               "'%INSERT INTO \"" + table + "\"%'");
    return std::stoll(rows.at(0).at(0));
  }

  static PostgresServer* server_;
};
PostgresServer* PostgresStoreTest::server_ = nullptr;

LockHandle take(Runtime& rt, const std::string& key, std::chrono::milliseconds ttl, Retries retries = forever) {
  auto f = rt.acquire({.key = key, .ttl = ttl, .retries = retries});
  return get_bounded(f);
}

// The error a first call through `o` fails with (bounded), checked to come
// within `bound`.
template <class E>
std::unique_ptr<E> first_call_error(const Options& o, std::chrono::milliseconds bound = 5s) {
  Runtime rt(o);
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut = f();
  auto err = error_of<E>(fut);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, bound);
  return err;
}

TEST_F(PostgresStoreTest, MalformedUrlsAreInvalidArgumentsThatHideThePassword) {
  expect_refused_urls(
      {
        "postgresql://127.0.0.1:5432/db",                          // no user
        "postgresql://u:secret@127.0.0.1:5432",                    // no database
        "postgresql://u:secret@127.0.0.1:x/db",                    // bad port
        "postgresql://u:secret@127.0.0.1:70000/db",                // port out of range
        "postgresql://u:secret@:5432/db",                          // no host
        "postgresql://u:secret@127.0.0.1/db?table=a;drop",         // a table name that is not an identifier
        "postgresql://u:secret@127.0.0.1/db?table=Locks",          // upper case: refused, not folded
        "postgresql://u:secret@127.0.0.1/db?sslmode=sometimes",    // an unknown sslmode
        "postgresql://u:secret@127.0.0.1/db?sslrootcert=ca.crt",   // a relative path
        "postgresql://u:secret@localhost/db?host=relative",        // a socket directory that is not absolute
        "postgres://u:secret@127.0.0.1/db?colour=blue",            // an unknown parameter
        "postgres://u:secret@127.0.0.1/db%zz",                     // a bad escape
      },
      [](const char* url) { return options(url); }, "postgres");
  Options replicas = options(server_->url());
  add_url_param(replicas, "min_replicas=1");  // a Redis setting
  EXPECT_THROW(replicas.validate(), InvalidArgument);
  for (const char* fine : {
           "postgresql://u:p%40ss@db.example:5433/app?table=locks&sslmode=verify-full&sslrootcert=/etc/ca.crt",
           "postgres://u@[::1]/app?sslcert=/c.crt&sslkey=/c.key&sslcrl=/c.crl",
           "postgresql://u@/app?host=/run/postgresql",
       }) {
    Options o = options(fine);
    EXPECT_NO_THROW(o.validate()) << fine;
  }
}

TEST_F(PostgresStoreTest, AWrongPasswordOrRoleIsAnAuthErrorThatHidesThePassword) {
  for (const char* credentials : {"lockwatch:not-the-password", "nobody-here:pw"}) {
    auto err = first_call_error<AuthError>(options(tcp(credentials, PostgresServer::kDatabase)));
    ASSERT_TRUE(err) << credentials;
    EXPECT_EQ(std::string(err->what()).find("not-the-password"), std::string::npos) << err->what();
    EXPECT_NE(err->endpoint().find("127.0.0.1:"), std::string::npos) << err->endpoint();
  }
}

TEST_F(PostgresStoreTest, AnUnknownDatabaseIsAClearConnectionErrorNotAnAuthError) {
  Runtime rt(options(tcp("lockwatch:lockwatch-pw", "nope")));
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  std::string what;
  try {
    get_bounded(fut);
    ADD_FAILURE() << "connected to a database that does not exist";
  } catch (const AuthError& e) {
    ADD_FAILURE() << "an AuthError: " << e.what();
  } catch (const ConnectionError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("nope"), std::string::npos) << what;
}

TEST_F(PostgresStoreTest, TheTableIsCreatedWhenMissingAndNamedByTheUrl) {
  Runtime rt(options(url_with_table("made_here")));
  auto h = take(rt, key(), 2s);
  auto columns = server_->query(
      "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'made_here' ORDER BY "
      "ordinal_position");
  std::vector<std::vector<std::string>> expected{{"lock_name", "bytea"},
                                                 {"owner", "bytea"},
                                                 {"fence", "bigint"},
                                                 {"expires_at", "timestamp with time zone"},
                                                 {"last_period", "bigint"},
                                                 {"owner_name", "bytea"},
                                                 {"granted_at", "timestamp with time zone"}};
  EXPECT_EQ(columns, expected);
  auto rows = server_->query("SELECT owner <> '', expires_at > clock_timestamp(), fence FROM made_here WHERE "
                             "lock_name = convert_to('lockwatch:" + key() + "', 'UTF8')");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"t", "t", std::to_string(h.lease().fencing_token())}));
}

TEST_F(PostgresStoreTest, ATableWithoutLockwatchsColumnsTypesOrKeyIsAnErrorNamingIt) {
  struct Case {
    const char* table;
    const char* ddl;
    const char* sqlstate;
  };
  const Case cases[] = {
      {"not_locks", "(lock_name bytea PRIMARY KEY, holder int)", "42703"},  // a column missing
      {"text_locks",
       "(lock_name text PRIMARY KEY, owner text NOT NULL DEFAULT '', fence bigint NOT NULL DEFAULT 0, "
       "expires_at timestamptz NOT NULL, last_period bigint)",
       "42883"},  // the wrong types: no bytea operators on text
      {"keyless_locks",
       "(lock_name bytea, owner bytea NOT NULL DEFAULT '', fence bigint NOT NULL DEFAULT 0, "
       "expires_at timestamptz NOT NULL, last_period bigint)",
       "42P10"},  // no key: ON CONFLICT has nothing to go by
  };
  for (const auto& c : cases) {
    server_->query(std::string("CREATE TABLE ") + c.table + " " + c.ddl + "; ALTER TABLE " + c.table +
                   " OWNER TO " + PostgresServer::kUser);
    auto err = first_call_error<StoreRefused>(options(url_with_table(c.table)));
    ASSERT_TRUE(err) << c.table;
    EXPECT_NE(std::string(err->what()).find(c.table), std::string::npos) << err->what();
    EXPECT_NE(std::string(err->what()).find("columns"), std::string::npos) << err->what();
    EXPECT_EQ(err->backend_code().message(), c.sqlstate) << err->what();
    EXPECT_STREQ(err->backend_code().category().name(), "lockwatch.postgresql");
  }
}

// The acquisitions of a set of another kind than exclusive are decided in
// one transaction, as an exclusive set's are in one statement: a free set
// is taken whole.
TEST_F(PostgresStoreTest, ASharedSetIsTakenInOneTransaction) {
  Runtime rt(options(server_->url())), other(options(server_->url()));
  take(rt, key(":warm"), 5s).release().get();  // both connected, tables checked
  take(other, key(":warm2"), 5s).release().get();
  // Each write transaction takes the next id, and so does each read of it.
  expect_shared_set_in_one_step(rt, other, key(), [reads = 0LL]() mutable {
    return std::stoll(server_->query("SELECT pg_current_xact_id()::text").at(0).at(0)) - reads++;
  });
}

TEST_F(PostgresStoreTest, TheUnixSocketWorks) {
  Runtime rt(options(server_->socket_url()));
  auto f = locked("sock", 1s, 0).on(rt)([] { return this_lease().fencing_token(); });
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 1u);
}

TEST_F(PostgresStoreTest, AHostNameIsLookedUpAndAnUnknownOneIsAConnectionError) {
  Runtime rt(options("postgresql://lockwatch:lockwatch-pw@localhost:" + std::to_string(server_->port()) + "/" +
                     PostgresServer::kDatabase));
  auto f = locked("named", 1s, 0).on(rt)([] { return this_lease().fencing_token(); });
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 1u);

  Options o = options("postgresql://lockwatch:x@no-such-host.invalid/lockwatch_test");
  o.connection.connect_timeout = 1s;
  auto err = first_call_error<ConnectionError>(o);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("no-such-host.invalid"), std::string::npos) << err->what();
}

TEST_F(PostgresStoreTest, TlsVerifiesTheServerWithTheUrlsRootCertificate) {
  const TestCertificates& certs = test_certificates();
  const std::string credentials = "lockwatch:lockwatch-pw";
  Runtime rt(options(tcp(credentials, PostgresServer::kDatabase,
                         "?sslmode=verify-full&sslrootcert=" + certs.ca_cert)));
  auto f = locked("tls", 1s, 0).on(rt)([] { return this_lease().fencing_token(); });
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 1u);
  auto sessions = server_->query("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                                 "WHERE s.ssl AND a.application_name LIKE 'lockwatch:%' AND a.usename = 'lockwatch'");
  EXPECT_GE(std::stoi(sessions.at(0).at(0)), 1);

  // Another CA's root, or a name the certificate does not carry: refused.
  Options other_ca = options(tcp(credentials, PostgresServer::kDatabase,
                                 "?sslmode=verify-full&sslrootcert=" + certs.untrusted_cert));
  EXPECT_TRUE(first_call_error<ConnectionError>(other_ca));
  Options by_name = options("postgresql://" + credentials + "@localhost:" + std::to_string(server_->port()) + "/" +
                            PostgresServer::kDatabase + "?sslmode=verify-full&sslrootcert=" + certs.ca_cert);
  // localhost is on the certificate too: the name check passes.
  Runtime named(by_name);
  auto g = locked("tls-name", 1s, 0).on(named)([] { return 1; });
  auto gut = g();
  EXPECT_EQ(get_bounded(gut), 1);
}

TEST_F(PostgresStoreTest, AClientCertificateFromTheUrlLogsInWhereTheServerAsksForOne) {
  const TestCertificates& certs = test_certificates();
  const std::string credentials = std::string(PostgresServer::kCertUser) + ":" + PostgresServer::kPassword;
  const std::string tls = "?table=cert_locks&sslmode=verify-full&sslrootcert=" + certs.ca_cert;
  // Without a certificate the server refuses the login.
  EXPECT_TRUE(first_call_error<ConnectionError>(options(tcp(credentials, PostgresServer::kDatabase, tls))));
  Runtime rt(options(tcp(credentials, PostgresServer::kDatabase,
                         tls + "&sslcert=" + certs.client_cert + "&sslkey=" + certs.client_key)));
  auto f = locked("client-cert", 1s, 0).on(rt)([] { return this_lease().fencing_token(); });
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 1u);
}

TEST_F(PostgresStoreTest, OperatorsCanInspectAndForceRelease) {
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
  auto r = h.release();
  EXPECT_TRUE(error_of<LeaseLost>(r));
}

// The waiter of another process (runtime) sleeps on LISTEN: while the
// holder keeps its lock it asks the server at most twice (its first try,
// and once LISTEN is confirmed), and the release wakes it at once.
TEST_F(PostgresStoreTest, AWaiterSleepsOnNoticesAndTheReleaseWakesIt) {
  const std::string table = "notice_locks";
  Runtime holder(options(url_with_table(table))), waiter(options(url_with_table(table)));
  auto h = take(holder, key(), 10s);
  const std::uint64_t held_token = h.lease().fencing_token();
  const long long before = acquire_statements(table);
  auto waited = waiter.acquire({.key = key(), .ttl = 10s, .retries = forever, .wait = 15s});
  EXPECT_EQ(waited.wait_for(1500ms), std::future_status::timeout);  // really waiting
  const long long while_held = acquire_statements(table) - before;
  EXPECT_LE(while_held, 2) << "the waiter polled";
  EXPECT_GE(while_held, 1);
  auto released_at = std::chrono::steady_clock::now();
  auto r = h.release();
  get_bounded(r);
  auto next = get_bounded(waited);
  EXPECT_LT(std::chrono::steady_clock::now() - released_at, 1s);  // the holder's ttl was 10 s
  EXPECT_GT(next.lease().fencing_token(), held_token);
}

// The notices connection is dropped (its backend terminated): the store
// reports its subscriptions lost, LISTENs again, confirms them, and the
// next release still wakes the waiter long before the holder's ttl.
TEST_F(PostgresStoreTest, NoticesComeBackAfterTheirConnectionDrops) {
  const std::string table = "relisten_locks";
  Runtime holder(options(url_with_table(table))), waiter(options(url_with_table(table)));
  auto h = take(holder, key(), 10s);
  const std::uint64_t held_token = h.lease().fencing_token();
  auto waited = waiter.acquire({.key = key(), .ttl = 10s, .retries = forever, .wait = 15s});
  // Terminated once it listens; waits (bounded) for that connection.
  const std::string listening = "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND state = 'idle'";
  auto until = std::chrono::steady_clock::now() + kBound;
  std::vector<std::vector<std::string>> pids;
  while ((pids = server_->query(listening)).empty() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);  // polling the server's view of its sessions
  ASSERT_EQ(pids.size(), 1u);
  server_->query("SELECT pg_terminate_backend(" + pids[0][0] + ")");
  // Back: a new LISTEN session (another pid).
  until = std::chrono::steady_clock::now() + kBound;
  std::vector<std::vector<std::string>> again;
  while (((again = server_->query(listening)).empty() || again[0][0] == pids[0][0]) &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(again.size(), 1u);
  ASSERT_NE(again[0][0], pids[0][0]);
  EXPECT_EQ(waited.wait_for(200ms), std::future_status::timeout);
  auto released_at = std::chrono::steady_clock::now();
  auto r = h.release();
  get_bounded(r);
  auto next = get_bounded(waited);
  EXPECT_LT(std::chrono::steady_clock::now() - released_at, 1s);
  EXPECT_GT(next.lease().fencing_token(), held_token);
}

// A transaction elsewhere holds the lock's row: the acquisition waits for
// it no longer than lock_timeout (half the command timeout), is tried
// again, and then fails with the server's SQLSTATE; nothing hangs, and the
// lock is taken once the row is free.
TEST_F(PostgresStoreTest, ARowLockedElsewhereIsRetriedThenReportedNeverWaitedOnForLong) {
  Options o = options(server_->url());
  o.connection.command_timeout = 600ms;
  Runtime rt(o);
  {
    auto h = take(rt, key(), 1s);  // the row exists
    auto r = h.release();
    get_bounded(r);
  }
  PGconn* other = PQconnectdb(("host=" + server_->dir() + " port=" + std::to_string(server_->port()) +
                               " dbname=" + PostgresServer::kDatabase + " user=postgres")
                                  .c_str());
  ASSERT_EQ(PQstatus(other), CONNECTION_OK) << PQerrorMessage(other);
  PQclear(PQexec(other, "BEGIN"));
  PGresult* locked_row = PQexec(other, ("SELECT 1 FROM lockwatch_locks WHERE lock_name = convert_to('lockwatch:" +
                                        key() + "', 'UTF8') FOR UPDATE")
                                           .c_str());
  ASSERT_EQ(PQntuples(locked_row), 1);
  PQclear(locked_row);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire({.key = key(), .ttl = 1s, .retries = 0});
  auto err = error_of<StoreRefused>(f);
  auto took = std::chrono::steady_clock::now() - t0;
  // A reader's transaction stops at its first statement (the row's lock)
  // the same way, and the connection goes on.
  auto s = rt.acquire({.key = key(), .ttl = 1s, .retries = 0, .kind = LockKind::shared()});
  auto shared_err = error_of<StoreRefused>(s);
  PQclear(PQexec(other, "ROLLBACK"));
  PQfinish(other);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->backend_code().message(), "55P03") << err->what();  // lock_not_available
  EXPECT_LT(took, 3s);
  ASSERT_TRUE(shared_err);
  EXPECT_EQ(shared_err->backend_code().message(), "55P03") << shared_err->what();
  auto reader = rt.acquire({.key = key(), .ttl = 1s, .retries = 0, .kind = LockKind::shared()});
  LockHandle r = get_bounded(reader);
  give_back(r);
  auto h = take(rt, key(), 1s, 0);
  EXPECT_GE(h.lease().fencing_token(), 2u);
}

// The fence lives in the row: it rises across releases, and across a
// crash of the server (SIGKILL of every process) mid-lease, which loses
// the lease by its deadline; after the restart, the lock is taken with a
// higher token.
TEST_F(PostgresStoreTest, TheFenceSurvivesReleasesAndACrashMidLease) {
  Options o = options(server_->url());
  o.connection.command_timeout = 300ms;
  o.connection.connect_timeout = 1500ms;  // a first login (TLS, SCRAM) is slow under the sanitizers
  Runtime rt(o);
  std::uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    auto h = take(rt, key(), 2s);
    EXPECT_GT(h.lease().fencing_token(), last);
    last = h.lease().fencing_token();
    auto r = h.release();
    get_bounded(r);
  }
  Gate started;
  auto f = locked(key(), 1s, forever).on(rt)([&] {
    started.open();
    return stopped_within_bound(this_lease().stop_token());
  });
  auto fut = f();
  ASSERT_TRUE(started.wait());
  auto killed_at = std::chrono::steady_clock::now();
  server_->kill();
  auto err = error_of<LeaseLost>(fut);
  ASSERT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 2s);
  server_->start();
  auto after = rt.acquire({.key = key(), .ttl = 1s, .retries = forever, .wait = 10s});
  auto h = get_bounded(after);
  EXPECT_GT(h.lease().fencing_token(), last + 1);  // above the crashed lease's token too
  auto rows = server_->query("SELECT fence FROM lockwatch_locks WHERE lock_name = convert_to('lockwatch:" + key() +
                             "', 'UTF8')");
  EXPECT_EQ(rows.at(0).at(0), std::to_string(h.lease().fencing_token()));
}

// SIGSTOP of every process of the server mid-lease: renewals go
// unanswered, the lease is lost by its deadline, no call hangs; once the
// server goes on, the store recovers and the lock can be taken again.
TEST_F(PostgresStoreTest, AHungServerLosesTheLeaseByItsDeadlineAndRecovers) {
  Options o = options(server_->url());
  o.connection.command_timeout = 300ms;
  o.connection.connect_timeout = 1500ms;  // a first login (TLS, SCRAM) is slow under the sanitizers
  Runtime rt(o);
  Gate started;
  auto f = locked(key(), 1s, forever).on(rt)([&] {
    started.open();
    return stopped_within_bound(this_lease().stop_token());
  });
  auto fut = f();
  ASSERT_TRUE(started.wait());
  server_->pause();
  auto paused_at = std::chrono::steady_clock::now();
  auto err = error_of<LeaseLost>(fut);
  auto lost_after = std::chrono::steady_clock::now() - paused_at;
  auto other = rt.acquire({.key = key("-other"), .ttl = 1s, .retries = 0});
  auto other_err = error_of<ConnectionError>(other);
  server_->resume();
  ASSERT_TRUE(err);
  EXPECT_LT(lost_after, 2s);
  EXPECT_TRUE(other_err);
  auto again = rt.acquire({.key = key(), .ttl = 1s, .retries = forever, .wait = 10s});
  EXPECT_GE(get_bounded(again).lease().fencing_token(), 2u);
}

// raise_fence (a quorum's members raise their counters to the token it
// hands out) on a name never locked, then on a locked one: the next
// token is above the raise, and a raise below the counter changes nothing.
TEST_F(PostgresStoreTest, ARaisedFenceIsWhereTheNextTokenStarts) {
  StoreOnLoop store(options(server_->url()));
  const std::string name = store.encode(key());
  ASSERT_TRUE(store.raise_fence(name, 41));
  auto first = store.acquire(name, "token-one", 2s);
  ASSERT_EQ(first.status, detail::Acquired::Status::kTaken);
  EXPECT_EQ(first.fence, 42u);
  ASSERT_TRUE(store.raise_fence(name, 7));
  EXPECT_EQ(store.release(name, "token-one"), detail::Released::kYes);
  auto second = store.acquire(name, "token-two", 2s);
  ASSERT_EQ(second.status, detail::Acquired::Status::kTaken);
  EXPECT_EQ(second.fence, 43u);
  EXPECT_EQ(store.release(name, "token-two"), detail::Released::kYes);
}

TEST_F(PostgresStoreTest, ManyAcquisitionsShareStatementsAndANameTooLongForTheTableFailsAlone) {
  // A table whose own CHECK takes shorter names than lockwatch's: a name
  // too long for it fails with the server's error, alone; the others in
  // the same statements are taken.
  server_->query("CREATE TABLE short_names (lock_name bytea PRIMARY KEY CHECK (octet_length(lock_name) <= 24), "
                 "owner bytea NOT NULL DEFAULT '', fence bigint NOT NULL DEFAULT 0, expires_at timestamptz NOT NULL, "
                 "last_period bigint); ALTER TABLE short_names OWNER TO lockwatch");
  Runtime rt(options(url_with_table("short_names")));
  std::vector<std::future<LockHandle>> acquiring;
  constexpr int kKeys = 300;
  for (int i = 0; i < kKeys; ++i)
    acquiring.push_back(rt.acquire(i == 150 ? std::string(40, 'x') : "m" + std::to_string(i), 5s));
  std::set<std::string> taken;
  for (int i = 0; i < kKeys; ++i) {
    if (i == 150) {
      auto err = error_of<StoreRefused>(acquiring[i]);
      ASSERT_TRUE(err);
      EXPECT_EQ(err->backend_code().message(), "23514") << err->what();  // check_violation
      EXPECT_STREQ(err->backend_code().category().name(), "lockwatch.postgresql");
      continue;
    }
    auto h = get_bounded(acquiring[i]);
    EXPECT_EQ(h.lease().fencing_token(), 1u);
    taken.insert(h.lease().key());
  }
  EXPECT_EQ(taken.size(), static_cast<std::size_t>(kKeys - 1));
}

// A lock table made before the kinds (no holders' table beside it): the
// holders' table is created at the first connection, exclusive locks work
// as before, and a shared lock keeps its reader there; operators see the
// key held (by the kind's marker) and force_release frees it, holders too.
// Its lock table gets the owner columns added since, and the
// owner is shown; the sessions carry the owner name as application_name.
TEST_F(PostgresStoreTest, TheHoldersTableIsCreatedBesideAnExistingLockTable) {
  server_->query("CREATE TABLE older_locks (lock_name bytea PRIMARY KEY CHECK (octet_length(lock_name) BETWEEN 1 "
                 "AND 255), owner bytea NOT NULL DEFAULT '', fence bigint NOT NULL DEFAULT 0, expires_at timestamptz "
                 "NOT NULL, last_period bigint) WITH (fillfactor = 70); ALTER TABLE older_locks OWNER TO lockwatch");
  Options named = options(url_with_table("older_locks"));
  named.runtime.owner_name = "pg owner:7";
  Runtime rt(named);
  auto h = take(rt, key("-exclusive"), 2s);
  auto added = server_->query(
      "SELECT column_name FROM information_schema.columns WHERE table_name = 'older_locks' AND column_name IN "
      "('owner_name', 'granted_at') ORDER BY column_name");
  EXPECT_EQ(added, (std::vector<std::vector<std::string>>{{"granted_at"}, {"owner_name"}}));
  auto exclusive_state = rt.inspect(key("-exclusive"));
  EXPECT_EQ(get_bounded(exclusive_state).owner, "pg owner:7");
  EXPECT_FALSE(server_->query("SELECT 1 FROM pg_stat_activity WHERE application_name = 'lockwatch:pg_owner:7'").empty());
  auto columns = server_->query(
      "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'older_locks_holders' "
      "ORDER BY ordinal_position");
  std::vector<std::vector<std::string>> expected{{"lock_name", "bytea"},
                                                 {"owner", "bytea"},
                                                 {"role", "character"},
                                                 {"seq", "bigint"},
                                                 {"expires_at", "timestamp with time zone"},
                                                 {"owner_name", "bytea"},
                                                 {"granted_at", "timestamp with time zone"}};
  EXPECT_EQ(columns, expected);
  auto f = rt.acquire({.key = key(), .ttl = 1s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(f);
  const std::string name = "convert_to('lockwatch:" + key() + "', 'UTF8')";
  auto rows = server_->query("SELECT role, expires_at > clock_timestamp() FROM older_locks_holders WHERE lock_name = " +
                             name);
  EXPECT_EQ(rows, (std::vector<std::vector<std::string>>{{"s", "t"}}));
  auto state = rt.inspect(key());
  auto s = get_bounded(state);
  EXPECT_TRUE(s.held);
  EXPECT_GT(s.ttl, 0ms);
  EXPECT_LE(s.ttl, 1s);
  EXPECT_EQ(s.kind, LockKind::shared());
  ASSERT_EQ(s.holders.size(), 1u);
  EXPECT_EQ(s.holders[0].owner, "pg owner:7");
  auto forced = rt.force_release(key());
  EXPECT_TRUE(get_bounded(forced));
  EXPECT_TRUE(server_->query("SELECT 1 FROM older_locks_holders WHERE lock_name = " + name).empty());
  auto writer = rt.acquire({.key = key(), .ttl = 2s, .retries = 0});
  LockHandle w = get_bounded(writer);
  EXPECT_TRUE(stopped_within_bound(reader.lease().stop_token()));
}

// One family per key: a key held by permits is refused, with
// InvalidArgument saying how it is held, to another n, to a reader, to a
// writer and to a fair caller; a key held shared to permits and fair;
// and the holder keeps its lock throughout.
TEST_F(PostgresStoreTest, AKeyHeldAsOneKindIsRefusedAsAnother) {
  Runtime a(options(server_->url())), b(options(server_->url()));
  auto f = a.acquire({.key = key(), .ttl = 5s, .kind = LockKind::permits(2)});
  LockHandle permit = get_bounded(f);
  for (LockKind other : {LockKind::permits(3), LockKind::shared(), LockKind::exclusive(), LockKind::fair()}) {
    auto g = b.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms, .kind = other});
    auto e = error_of<InvalidArgument>(g);
    ASSERT_TRUE(e) << other.describe();
    EXPECT_NE(std::string(e->what()).find("a semaphore of 2 permit(s)"), std::string::npos) << e->what();
  }
  auto s = a.acquire({.key = key("-shared"), .ttl = 5s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(s);
  for (LockKind other : {LockKind::permits(2), LockKind::fair()}) {
    auto g = b.acquire({.key = key("-shared"), .ttl = 5s, .retries = forever, .wait = 0ms, .kind = other});
    auto e = error_of<InvalidArgument>(g);
    ASSERT_TRUE(e) << other.describe();
    EXPECT_NE(std::string(e->what()).find("held as shared"), std::string::npos) << e->what();
  }
  EXPECT_FALSE(permit.lease().lost());
  EXPECT_FALSE(reader.lease().lost());
  give_back(permit);
  give_back(reader);
}

// A writer waits for a reader with a long ttl: the last reader's release
// notifies, and the writer (which asks again every second while it
// waits, to keep its mark) takes the key at once, not at its next turn.
TEST_F(PostgresStoreTest, AReadersReleaseWakesAWaitingWriterByANotice) {
  const std::string table = "rw_notice_locks";
  Runtime readers(options(url_with_table(table))), writers(options(url_with_table(table)));
  // Both connected first: what is timed below is the notice, not a setup.
  LockHandle warm = take(writers, key() + "-warm", 2s);
  give_back(warm);
  auto f = readers.acquire({.key = key(), .ttl = 10s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(f);
  auto waited = writers.acquire({.key = key(), .ttl = 10s, .retries = forever, .wait = 15s});
  auto marks = [&] {
    return server_->query("SELECT count(*) FROM " + table + "_holders WHERE role = 'w' AND expires_at > "
                          "clock_timestamp()").at(0).at(0);
  };
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (marks() != "1" && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);  // reading the table, as an operator would
  EXPECT_EQ(marks(), "1") << "the waiting writer left no mark";
  EXPECT_EQ(waited.wait_for(0ms), std::future_status::timeout);  // really waiting
  auto released_at = std::chrono::steady_clock::now();
  give_back(reader);
  LockHandle w = get_bounded(waited);
  // Told by the notice: without it the writer would try again only when the
  // reader's 10 s ttl ran out.
  EXPECT_LT(std::chrono::steady_clock::now() - released_at, 2s);
  // Its grant took its mark away: a reader may come once it is done.
  EXPECT_TRUE(server_->query("SELECT 1 FROM " + table + "_holders WHERE role = 'w'").empty());
  give_back(w);
  auto again = readers.acquire({.key = key(), .ttl = 2s, .retries = forever, .wait = 0ms, .kind = LockKind::shared()});
  LockHandle r = get_bounded(again);
  give_back(r);
}

// PostgreSQL's ON CONFLICT updates a row once per statement, so the k-th
// request for a name in one turn goes in the k-th statement: three rounds
// of ten keys are three statements (a few more if the turn is split). A
// statement that named a key twice would fail, and each lock would then go
// again on its own: thirty.
TEST_F(PostgresStoreTest, ANameAskedForAgainInOneTurnGoesInTheNextStatement) {
  const std::string table = "repeat_locks";
  Runtime rt(options(url_with_table(table)));
  LockHandle warm = take(rt, key("warm"), 5s);  // the table made and the statements prepared
  give_back(warm);
  const long long before = acquire_statements(table);
  std::vector<std::future<LockHandle>> asked;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 10; ++i) asked.push_back(rt.acquire({.key = key(std::to_string(i)), .ttl = 5s, .retries = 0}));
  }
  std::vector<LockHandle> held;
  for (auto& f : asked) {
    if (f.wait_for(10s) != std::future_status::ready) FAIL() << "an acquisition did not end";
    try {
      held.push_back(f.get());
    } catch (const LockNotAcquired&) {
    }
  }
  EXPECT_EQ(held.size(), 10u);  // each key once: the runtime's other two calls found it busy
  EXPECT_LE(acquire_statements(table) - before, 12);
  for (auto& h : held) give_back(h);
}

}  // namespace
}  // namespace lockwatch::testing
