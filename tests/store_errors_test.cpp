// The store's failure values: where a reply is classified, and the one
// mapping to the public exceptions (whose wording users have always read).
#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "lockwatch/errors.hpp"
#include "runtime/store_errors.hpp"
#include "store/redis/redis_error.hpp"
#include "store/store_error.hpp"
#if LOCKWATCH_WITH_SQL
#include "store/sql/sql_error.hpp"
#endif
#if LOCKWATCH_WITH_POSTGRESQL
#include "store/postgresql/pg_error.hpp"
#endif
#if LOCKWATCH_WITH_ZOOKEEPER
#include <zookeeper/zookeeper.h>

#include "store/zookeeper/zk_error.hpp"
#endif
#if LOCKWATCH_WITH_ETCD
#include "store/etcd/etcd_error.hpp"
#endif

namespace lockwatch::detail {
namespace {

using Kind = StoreError::Kind;

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

TEST(StoreErrorTest, MovedIsARedirectWithItsSlotAndTarget) {
  StoreError e = redis_reply_error("127.0.0.1:7000", "MOVED 3999 127.0.0.1:7002");
  EXPECT_EQ(e.kind, Kind::kRedirect);
  EXPECT_FALSE(is_ask(e));
  auto to = cluster_redirect(e);
  ASSERT_TRUE(to);
  EXPECT_FALSE(to->ask);
  EXPECT_EQ(to->slot, 3999);
  EXPECT_EQ(to->host, "127.0.0.1");
  EXPECT_EQ(to->port, 7002);
  EXPECT_EQ(e.code, RedisReply::kMoved);
}

TEST(StoreErrorTest, AskIsARedirectMarkedAsk) {
  StoreError e = redis_reply_error("n:1", "ASK 12 [::1]:7003");
  EXPECT_EQ(e.kind, Kind::kRedirect);
  EXPECT_TRUE(is_ask(e));
  auto to = cluster_redirect(e);
  ASSERT_TRUE(to);
  EXPECT_TRUE(to->ask);
  EXPECT_EQ(to->slot, 12);
  EXPECT_EQ(to->host, "[::1]");
  EXPECT_EQ(to->port, 7003);
}

TEST(StoreErrorTest, AMalformedRedirectIsARefusal) {
  for (const char* m : {"MOVED", "MOVED x 1.2.3.4:5", "MOVED 1 host", "ASK 1 host:0", "MOVED 99999 h:1", "MOVEDX 1 h:2"}) {
    StoreError e = redis_reply_error("n:1", m);
    EXPECT_EQ(e.kind, Kind::kRefused) << m;
    EXPECT_FALSE(cluster_redirect(e)) << m;
  }
}

TEST(StoreErrorTest, ClusterNotNowRepliesAreRetryLater) {
  for (const char* m : {"TRYAGAIN Multiple keys request during rehashing of slot", "CLUSTERDOWN The cluster is down",
                        "LOADING Redis is loading the dataset in memory", "MASTERDOWN Link with MASTER is down"}) {
    EXPECT_EQ(redis_reply_error("n:1", m).kind, Kind::kRetryLater) << m;
  }
}

TEST(StoreErrorTest, RefusedCredentialsAreAuth) {
  for (const char* m : {"NOAUTH Authentication required.", "WRONGPASS invalid username-password pair",
                        "NOPERM this user has no permissions to run the 'evalsha' command"}) {
    EXPECT_EQ(redis_reply_error("n:1", m).kind, Kind::kAuth) << m;
  }
}

TEST(StoreErrorTest, AScriptsCommandRefusedByTheAclIsAuth) {
  // Redis 7.0's words, then 7.2's: an ERR, where a command sent directly
  // gets NOPERM.
  for (const char* m :
       {"ERR The user executing the script can't run this command or subcommand script: 1a8c, on @user_script:1.",
        "ERR The user executing the script can't access at least one of the keys mentioned in the command arguments",
        "ERR The user executing the script can't publish to the channel mentioned in the command script: 8ec7",
        "ERR ACL failure in script: User lw has no permissions to run the 'time' command script: 1a8c"}) {
    const StoreError e = redis_reply_error("n:1", m);
    EXPECT_EQ(e.kind, Kind::kAuth) << m;
    EXPECT_TRUE(redis_acl_refusal(e)) << m;
  }
  EXPECT_TRUE(
      redis_acl_refusal(redis_reply_error("n:1", "NOPERM this user has no permissions to run the 'evalsha' command")));
  // Refused credentials are no ACL refusal of a command; other ERRs are
  // refusals.
  EXPECT_FALSE(redis_acl_refusal(redis_reply_error("n:1", "WRONGPASS invalid username-password pair")));
  EXPECT_FALSE(redis_acl_refusal(StoreError::auth("n:1", "authentication failed")));
  const StoreError other = redis_reply_error("n:1", "ERR Error running script: the user executing it");
  EXPECT_EQ(other.kind, Kind::kRefused);
  EXPECT_FALSE(redis_acl_refusal(other));
}

TEST(StoreErrorTest, OtherRepliesAreRefusedWithTheirFirstWordAsCode) {
  StoreError e = redis_reply_error("n:1", "WRONGTYPE Operation against a key holding the wrong kind of value");
  EXPECT_EQ(e.kind, Kind::kRefused);
  EXPECT_EQ(e.code, RedisReply::kWrongType);
  EXPECT_EQ(&e.code.category(), &redis_category());
  EXPECT_EQ(e.message, "WRONGTYPE Operation against a key holding the wrong kind of value");
  EXPECT_EQ(redis_reply_error("n:1", "OOM").code, RedisReply::kOom);
  // A prefix lockwatch does not know is kept as the catch-all; the whole
  // line stays in the message.
  const StoreError odd = redis_reply_error("n:1", "NEWPREFIX something new");
  EXPECT_EQ(odd.kind, Kind::kRefused);
  EXPECT_EQ(odd.code, RedisReply::kOther);
  EXPECT_EQ(odd.message, "NEWPREFIX something new");
}

TEST(StoreErrorTest, TheRedisCategoryNamesEachPrefix) {
  EXPECT_STREQ(redis_category().name(), "lockwatch.redis");
  for (const char* word : {"ERR", "WRONGTYPE", "OOM", "NOSCRIPT", "BUSY", "READONLY", "NOREPLICAS", "MASTERDOWN",
                           "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "CROSSSLOT", "NOAUTH", "WRONGPASS",
                           "NOPERM", "EXECABORT", "LOCKWATCH", "LOCKWATCH-KIND"}) {
    const RedisReply code = redis_reply_code(word);
    EXPECT_NE(code, RedisReply::kOther) << word;
    EXPECT_EQ(std::error_code(code).message(), word);
  }
  EXPECT_EQ(std::error_code(RedisReply::kOther).message(), "another error reply");
  EXPECT_EQ(redis_reply_code("wrongtype"), RedisReply::kOther) << "Redis's prefixes are capitals";
}

#if LOCKWATCH_WITH_SQL
TEST(StoreErrorTest, SqlNumbersAreClassified) {
  EXPECT_EQ(sql_error("mysql://h:1/db", 1213, "Deadlock found").kind, Kind::kRetryLater);
  EXPECT_EQ(sql_error("mysql://h:1/db", 1205, "Lock wait timeout exceeded").kind, Kind::kRetryLater);
  EXPECT_EQ(sql_error("mysql://h:1/db", 1045, "Access denied").kind, Kind::kAuth);
  for (unsigned n : {2002u, 2003u, 2006u, 2013u}) EXPECT_EQ(sql_error("mysql://h:1/db", n, "gone").kind, Kind::kUnavailable);
  StoreError e = sql_error("mysql://h:1/db", 1406, "Data too long for column 'lock_name'");
  EXPECT_EQ(e.kind, Kind::kRefused);
  EXPECT_EQ(e.code, mariadb_code(1406));
  EXPECT_EQ(e.code.value(), 1406);
}

TEST(StoreErrorTest, TheMariaDbCategoryNamesKnownNumbers) {
  EXPECT_STREQ(mariadb_category().name(), "lockwatch.mariadb");
  EXPECT_EQ(mariadb_code(1406).message(), "ER_DATA_TOO_LONG (1406)");
  EXPECT_EQ(mariadb_code(1213).message(), "ER_LOCK_DEADLOCK (1213)");
  EXPECT_EQ(mariadb_code(2013).message(), "CR_SERVER_LOST (2013)");
  EXPECT_EQ(mariadb_code(1234).message(), "MariaDB error 1234");
}
#endif

#if LOCKWATCH_WITH_ZOOKEEPER
TEST(StoreErrorTest, TheZooKeeperCategoryIsTheClientsReturnCodes) {
  EXPECT_STREQ(zookeeper_category().name(), "lockwatch.zookeeper");
  EXPECT_EQ(zookeeper_code(ZBADARGUMENTS).value(), -8);
  EXPECT_EQ(zookeeper_code(ZBADARGUMENTS).message(), zerror(ZBADARGUMENTS));
  EXPECT_EQ(zookeeper_code(ZNONODE).message(), "no node");
  StoreError e = StoreError::refused("zookeeper://h:1", "create: bad arguments", zookeeper_code(ZBADARGUMENTS));
  EXPECT_EQ(e.describe(), "zookeeper://h:1 answered error -8: create: bad arguments");
}
#endif

#if LOCKWATCH_WITH_ETCD
TEST(StoreErrorTest, TheEtcdCategoryNamesGrpcStatusCodes) {
  EXPECT_STREQ(etcd_category().name(), "lockwatch.etcd");
  EXPECT_EQ(etcd_code(grpc::StatusCode::INVALID_ARGUMENT).value(), 3);
  EXPECT_EQ(etcd_code(grpc::StatusCode::INVALID_ARGUMENT).message(), "INVALID_ARGUMENT");
  EXPECT_EQ(etcd_code(grpc::StatusCode::DEADLINE_EXCEEDED).message(), "DEADLINE_EXCEEDED");
  StoreError e = StoreError::refused("etcd://h:1", "request is too large", etcd_code(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(e.describe(), "etcd://h:1 answered INVALID_ARGUMENT: request is too large");
}
#endif

TEST(StoreErrorTest, TransientMeansUnavailableOrRetryLater) {
  EXPECT_TRUE(StoreError::unavailable("n:1", "connection lost").transient());
  EXPECT_TRUE(redis_reply_error("n:1", "CLUSTERDOWN down").transient());
  EXPECT_FALSE(StoreError::auth("n:1", "no").transient());
  EXPECT_FALSE(redis_reply_error("n:1", "ERR x").transient());
  EXPECT_FALSE(redis_reply_error("n:1", "MOVED 1 h:2").transient());
}

// Each kind becomes the public error users catch, with today's wording,
// which describe() repeats (it is the watchdog's lost-lease detail).
TEST(StoreErrorsTest, EachKindMapsToItsPublicError) {
  {
    StoreError e = StoreError::unavailable("127.0.0.1:6379", "connection lost: connection reset by peer");
    auto x = to_exception(e);
    EXPECT_EQ(what_of(x), "redis 127.0.0.1:6379: connection lost: connection reset by peer");
    EXPECT_EQ(what_of(x), e.describe());
    try {
      std::rethrow_exception(x);
    } catch (const AuthError&) {
      ADD_FAILURE() << "not an AuthError";
    } catch (const ConnectionError& c) {
      EXPECT_EQ(c.endpoint(), "127.0.0.1:6379");
    }
  }
  {
    StoreError e = redis_reply_error("h:1", "WRONGPASS invalid username-password pair");
    auto x = to_exception(e);
    EXPECT_EQ(what_of(x), e.describe());
    try {
      std::rethrow_exception(x);
    } catch (const AuthError& a) {
      EXPECT_EQ(a.backend_code(), RedisReply::kWrongPass);
    } catch (...) {
      ADD_FAILURE() << "not an AuthError";
    }
  }
  {
    // A reply of a shape the protocol did not expect: refused, with no code.
    StoreError e = StoreError::refused("h:1", "a script answered a wrong shape");
    auto x = to_exception(e);
    EXPECT_EQ(what_of(x), "redis h:1 answered an error: a script answered a wrong shape");
    try {
      std::rethrow_exception(x);
    } catch (const StoreRefused& r) {
      EXPECT_FALSE(r.backend_code());
    } catch (...) {
      ADD_FAILURE() << "not a StoreRefused";
    }
  }
  for (const char* m : {"WRONGTYPE wrong kind", "MOVED 1 h:2", "TRYAGAIN later"}) {
    StoreError e = redis_reply_error("h:1", m);
    auto x = to_exception(e);
    EXPECT_EQ(what_of(x), std::string("redis h:1 answered an error: ") + m);
    EXPECT_EQ(what_of(x), e.describe());
    try {
      std::rethrow_exception(x);
    } catch (const StoreRefused& r) {
      EXPECT_EQ(r.server_message(), m);
      EXPECT_EQ(r.endpoint(), "h:1");
      EXPECT_EQ(r.backend_code(), e.code);
      EXPECT_STREQ(r.backend_code().category().name(), "lockwatch.redis");
    } catch (...) {
      ADD_FAILURE() << m << " is not a StoreRefused";
    }
  }
#if LOCKWATCH_WITH_SQL
  for (unsigned n : {1406u, 1213u}) {
    StoreError e = sql_error("mysql://h:1/db", n, "the server's text");
    auto x = to_exception(e);
    EXPECT_EQ(what_of(x), e.describe());
    try {
      std::rethrow_exception(x);
    } catch (const StoreRefused& s) {
      EXPECT_EQ(s.backend_code().value(), static_cast<int>(n));
      EXPECT_EQ(&s.backend_code().category(), &mariadb_category());
      EXPECT_EQ(s.code(), errc::store_refused);
      EXPECT_EQ(s.server_message(), "the server's text");
      EXPECT_EQ(what_of(x), "mysql://h:1/db answered error " + std::to_string(n) + ": the server's text");
    } catch (...) {
      ADD_FAILURE() << n << " is not a StoreRefused";
    }
  }
  {
    StoreError e = sql_error("mysql://h:1/db", 2013, "Lost connection to server during query");
    auto x = to_exception(e);
    EXPECT_EQ(what_of(x), "mysql://h:1/db: Lost connection to server during query");
    EXPECT_EQ(what_of(x), e.describe());
    try {
      std::rethrow_exception(x);
    } catch (const ConnectionError& c) {
      EXPECT_EQ(c.backend_code(), mariadb_code(2013));
    } catch (...) {
      ADD_FAILURE() << "not a ConnectionError";
    }
  }
#endif
  {
    StoreError e = StoreError::invalid("h:1", "a lock name longer than the column");
    auto x = to_exception(e);
    EXPECT_EQ(what_of(x), e.describe());
    EXPECT_THROW(std::rethrow_exception(x), InvalidArgument);
  }
}

#if LOCKWATCH_WITH_POSTGRESQL
TEST(StoreErrorTest, PostgresSqlstatesAreClassified) {
  const std::string pg = "postgresql://h:1/db";
  for (const char* code : {"40001", "40P01", "55P03", "57014"})
    EXPECT_EQ(pg_statement_error(pg, code, "later").kind, Kind::kRetryLater) << code;
  for (const char* code : {"08006", "57P01", "57P03", ""})
    EXPECT_EQ(pg_statement_error(pg, code, "gone").kind, Kind::kUnavailable) << code;
  StoreError e = pg_statement_error(pg, "22001", "value too long");
  EXPECT_EQ(e.kind, Kind::kRefused);
  EXPECT_EQ(e.code, pg_code("22001"));
  EXPECT_EQ(pg_sqlstate(e.code), "22001");
  // A login: refused credentials or privilege are auth; anything else
  // (no such database, too many connections, no code at all) unavailable.
  for (const char* code : {"28P01", "28000", "42501"}) EXPECT_EQ(pg_connect_error(pg, code, "no").kind, Kind::kAuth);
  for (const char* code : {"3D000", "53300", ""}) EXPECT_EQ(pg_connect_error(pg, code, "no").kind, Kind::kUnavailable);
}

TEST(StoreErrorTest, APostgresLoginsSqlstateIsReadFromLibpqsVerboseMessage) {
  EXPECT_EQ(sqlstate_in_verbose_message("connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  28P01: "
                                        "password authentication failed for user \"u\""),
            "28P01");
  EXPECT_EQ(sqlstate_in_verbose_message("FATAL:  3D000: database \"nope\" does not exist"), "3D000");
  // libpq's own failures carry none.
  EXPECT_EQ(sqlstate_in_verbose_message("connection to server at \"127.0.0.1\", port 1 failed: Connection refused"),
            "");
  EXPECT_EQ(sqlstate_in_verbose_message("SSL error:  certificate verify failed"), "");
}

TEST(StoreErrorTest, ThePostgresCategoryGivesTheSqlstateBack) {
  EXPECT_STREQ(postgresql_category().name(), "lockwatch.postgresql");
  for (const char* sqlstate : {"22001", "23514", "40P01", "55P03", "28P01", "42P07", "ZZZZZ", "00001"}) {
    const std::error_code code = pg_code(sqlstate);
    EXPECT_TRUE(code) << sqlstate;
    EXPECT_EQ(&code.category(), &postgresql_category());
    EXPECT_EQ(code.message(), sqlstate);
    EXPECT_EQ(pg_sqlstate(code), sqlstate);
  }
  EXPECT_NE(pg_code("22001"), pg_code("22002"));
  // Nothing but five digits or capitals is a SQLSTATE.
  for (const char* other : {"", "2200", "220011", "22o01", "00000"}) EXPECT_FALSE(pg_code(other)) << other;
  EXPECT_EQ(pg_sqlstate(std::error_code(22001, std::generic_category())), "");
}

TEST(StoreErrorsTest, APostgresRefusalIsAStoreRefusedWithItsSqlstate) {
  StoreError e = pg_statement_error("postgresql://h:1/db", "23514", "new row violates check constraint");
  auto x = to_exception(e);
  EXPECT_EQ(what_of(x), "postgresql://h:1/db answered error 23514: new row violates check constraint");
  EXPECT_EQ(what_of(x), e.describe());
  try {
    std::rethrow_exception(x);
  } catch (const StoreRefused& s) {
    EXPECT_EQ(s.backend_code().message(), "23514");
    EXPECT_STREQ(s.backend_code().category().name(), "lockwatch.postgresql");
    EXPECT_EQ(s.server_message(), "new row violates check constraint");
  } catch (...) {
    ADD_FAILURE() << "not a StoreRefused";
  }
  StoreError login = pg_connect_error("postgresql://h:1/db", "28P01", "password authentication failed");
  EXPECT_EQ(what_of(to_exception(login)), login.describe());
  try {
    std::rethrow_exception(to_exception(login));
  } catch (const AuthError& a) {
    EXPECT_EQ(a.backend_code().message(), "28P01");
  } catch (...) {
    ADD_FAILURE() << "not an AuthError";
  }
}
#endif

}  // namespace
}  // namespace lockwatch::detail
