// The lock protocol's reply readers on crafted replies (RESP bytes read by
// hiredis's own reader): each script's one reply shape reads as the script
// promises, and anything else (another type, another number of entries, a
// status no script sends) is an error for the locks it cannot answer, never
// a default result such as "busy for 0 ms" or a silent success.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "store/redis/redis_error.hpp"
#include "store/redis/scripts.hpp"

namespace lockwatch::testing {
namespace {

using detail::Acquired;
using detail::AcquireReply;
using detail::ClaimResult;
using detail::LockInfo;
using detail::Released;
using detail::ReleaseReply;
using detail::Renewed;
using detail::RenewReply;
using detail::StoreError;

constexpr std::string_view kNode = "127.0.0.1:6379";

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// The reply hiredis reads from `resp`, one whole reply.
Reply read(std::string_view resp) {
  std::unique_ptr<redisReader, void (*)(redisReader*)> reader(redisReaderCreate(), redisReaderFree);
  EXPECT_EQ(redisReaderFeed(reader.get(), resp.data(), resp.size()), REDIS_OK);
  void* out = nullptr;
  EXPECT_EQ(redisReaderGetReply(reader.get(), &out), REDIS_OK);
  EXPECT_NE(out, nullptr) << resp;
  return Reply(static_cast<redisReply*>(out));
}

// A bulk string's RESP bytes.
std::string bulk(std::string_view s) { return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n"; }

std::vector<Acquired> acquired(const redisReply* r, std::size_t locks, const StoreError* err = nullptr) {
  AcquireReply reply(r, err, locks, kNode);
  std::vector<Acquired> out;
  for (std::size_t k = 0; k < locks; ++k) out.push_back(reply.next());
  return out;
}

void expect_unexpected(const Acquired& a, const std::string& context) {
  ASSERT_EQ(a.status, Acquired::Status::kFailed) << context;
  EXPECT_EQ(a.error.kind, StoreError::Kind::kRefused) << context;
  EXPECT_EQ(a.error.endpoint, kNode) << context;
  EXPECT_NE(a.error.message.find("unexpected reply to the acquire script"), std::string::npos) << a.error.message;
}

TEST(AcquireReplyTest, ALoneLockIsABatchOfOne) {
  auto r = acquired(read(bulk("t42")).get(), 1);
  ASSERT_EQ(r[0].status, Acquired::Status::kTaken);
  EXPECT_EQ(r[0].fence, 42u);
  EXPECT_TRUE(r[0].error.message.empty());
}

TEST(AcquireReplyTest, EachEntryAnswersItsOwnLock) {
  const std::string entries =
      "t7\nb1500\n"
      "eWRONGTYPE Operation against a key holding the wrong kind of value (lockwatch:fence:{x} is not a fencing "
      "counter)\n"
      "eLOCKWATCH lockwatch:{k} exists without expiry: not a lockwatch lock\n"
      "t18446744073709551615\n"
      "b0";
  auto r = acquired(read(bulk(entries)).get(), 6);
  EXPECT_EQ(r[0].status, Acquired::Status::kTaken);
  EXPECT_EQ(r[0].fence, 7u);
  EXPECT_EQ(r[1].status, Acquired::Status::kBusy);
  EXPECT_EQ(r[1].busy_for, std::chrono::milliseconds(1500));
  ASSERT_EQ(r[2].status, Acquired::Status::kFailed);
  EXPECT_EQ(r[2].error.kind, StoreError::Kind::kRefused);
  EXPECT_EQ(r[2].error.code, detail::RedisReply::kWrongType);
  EXPECT_NE(r[2].error.describe().find("not a fencing counter"), std::string::npos);
  ASSERT_EQ(r[3].status, Acquired::Status::kFailed);
  EXPECT_EQ(r[3].error.code, detail::RedisReply::kLockwatch);
  EXPECT_EQ(r[3].error.message, "LOCKWATCH lockwatch:{k} exists without expiry: not a lockwatch lock");
  EXPECT_EQ(r[4].status, Acquired::Status::kTaken);
  EXPECT_EQ(r[4].fence, 18446744073709551615u);
  // A holder with less than a millisecond left is busy for 0 ms, as Redis says.
  EXPECT_EQ(r[5].status, Acquired::Status::kBusy);
  EXPECT_EQ(r[5].busy_for, std::chrono::milliseconds(0));
}

// An entry's error is classified as Redis's own error replies are.
TEST(AcquireReplyTest, AnEntrysErrorIsClassifiedAsAnErrorReply) {
  auto r = acquired(
      read(bulk("eTRYAGAIN Multiple keys request during rehashing of slot\neOOM command not allowed")).get(), 2);
  ASSERT_EQ(r[0].status, Acquired::Status::kFailed);
  EXPECT_EQ(r[0].error.kind, StoreError::Kind::kRetryLater);
  ASSERT_EQ(r[1].status, Acquired::Status::kFailed);
  EXPECT_EQ(r[1].error.kind, StoreError::Kind::kRefused);
  EXPECT_EQ(r[1].error.code, detail::RedisReply::kOom);
}

TEST(AcquireReplyTest, AKeyHeldAsAnotherKindIsAnInvalidArgumentNamingIt) {
  // What the kinds' acquire script answers for a semaphore of another n,
  // and the acquire script for a semaphore asked for exclusively.
  auto r = acquired(read(bulk("eLOCKWATCH-KIND lockwatch:{gpu} is held as a semaphore of 2 permit(s); this call "
                              "asked for it 3 permit(s)")).get(),
                    1);
  ASSERT_EQ(r[0].status, Acquired::Status::kFailed);
  EXPECT_EQ(r[0].error.kind, StoreError::Kind::kInvalid);
  EXPECT_EQ(r[0].error.message.find("LOCKWATCH-KIND"), std::string::npos) << r[0].error.message;
  EXPECT_NE(r[0].error.message.find("2 permit(s)"), std::string::npos) << r[0].error.message;
}

TEST(AcquireReplyTest, AnEntryOfUnknownStatusFailsItsLockAlone) {
  for (const std::string bad : {"q9", "b", "t", "e", "", "t12x", "b-5", "bx", "t-1", "T5", "t 5", "1", "0"}) {
    auto r = acquired(read(bulk("t1\n" + bad + "\nb20")).get(), 3);
    EXPECT_EQ(r[0].status, Acquired::Status::kTaken) << bad;
    expect_unexpected(r[1], "entry '" + bad + "'");
    EXPECT_EQ(r[2].status, Acquired::Status::kBusy) << bad;
    EXPECT_EQ(r[2].busy_for, std::chrono::milliseconds(20)) << bad;
  }
}

TEST(AcquireReplyTest, AReplyOfAnotherShapeFailsEveryLock) {
  struct Case {
    std::string resp;
    std::size_t locks;
  };
  const std::vector<Case> cases{
      {"*2\r\n:1\r\n:5\r\n", 1},     // the one-lock script's array of versions before
      {"*2\r\n:0\r\n:1500\r\n", 1},  // ... busy: never read as busy
      {":1\r\n", 1},                 // an integer
      {"$-1\r\n", 1},                // nil
      {"+OK\r\n", 1},                // a status
      {bulk(""), 1},                 // no entry for a lock
      {bulk("t1\nt2"), 3},           // too few entries
      {bulk("t1\nt2\nt3"), 2},       // too many
      {bulk("t1 t2"), 2},            // the old batch script's separator
      {"*1\r\n" + bulk("t1"), 1},    // an array of entries
  };
  for (const Case& c : cases) {
    auto r = acquired(read(c.resp).get(), c.locks);
    ASSERT_EQ(r.size(), c.locks);
    for (const auto& a : r) expect_unexpected(a, c.resp);
  }
}

TEST(AcquireReplyTest, TheCallsFailureIsEveryLocks) {
  const StoreError lost = StoreError::unavailable(std::string(kNode), "connection lost");
  for (const auto& a : acquired(nullptr, 3, &lost)) {
    ASSERT_EQ(a.status, Acquired::Status::kFailed);
    EXPECT_EQ(a.error.kind, StoreError::Kind::kUnavailable);
    EXPECT_EQ(a.error.message, "connection lost");
  }
  expect_unexpected(acquired(nullptr, 1)[0], "no reply and no error");
}

// Each lock's status and, when it failed (`failed`), why, read by `Reader`.
template <class Reader, class Status>
std::vector<std::pair<Status, std::string>> statuses(const redisReply* r, std::size_t locks, Status failed,
                                                     const StoreError* err) {
  Reader reply(r, err, locks, kNode);
  std::vector<std::pair<Status, std::string>> out;
  for (std::size_t k = 0; k < locks; ++k) {
    const StoreError* why = nullptr;
    Status s = reply.next(&why);
    EXPECT_EQ(s == failed, why != nullptr);
    out.emplace_back(s, why ? why->message : "");
  }
  return out;
}

auto renewed(const redisReply* r, std::size_t locks, const StoreError* err = nullptr) {
  return statuses<RenewReply>(r, locks, Renewed::kTransient, err);
}

auto released(const redisReply* r, std::size_t locks, const StoreError* err = nullptr) {
  return statuses<ReleaseReply>(r, locks, Released::kUnconfirmed, err);
}

TEST(RenewReplyTest, OneByteAnswersEachLease) {
  auto r = renewed(read(bulk("10xe")).get(), 4);
  EXPECT_EQ(r[0].first, Renewed::kYes);
  EXPECT_EQ(r[1].first, Renewed::kGone);
  EXPECT_EQ(r[2].first, Renewed::kTakenByOther);
  EXPECT_EQ(r[3].first, Renewed::kTransient);
  EXPECT_EQ(r[3].second, "Redis refused the renewal");
}

TEST(RenewReplyTest, AnUnknownByteIsTransientForItsLeaseAlone) {
  auto r = renewed(read(bulk("1?0")).get(), 3);
  EXPECT_EQ(r[0].first, Renewed::kYes);
  EXPECT_EQ(r[1].first, Renewed::kTransient);
  EXPECT_NE(r[1].second.find("unexpected reply to the renewal script"), std::string::npos) << r[1].second;
  EXPECT_EQ(r[2].first, Renewed::kGone);
}

TEST(RenewReplyTest, AReplyOfAnotherShapeIsTransientForEveryLease) {
  for (const std::string& resp : {bulk("11"), bulk("1111"), std::string(":1\r\n"), std::string("$-1\r\n"),
                                  std::string("*3\r\n:1\r\n:1\r\n:1\r\n")}) {
    for (const auto& [s, why] : renewed(read(resp).get(), 3)) {
      EXPECT_EQ(s, Renewed::kTransient) << resp;
      EXPECT_NE(why.find("unexpected reply to the renewal script"), std::string::npos) << why;
    }
  }
  const StoreError moved = detail::redis_reply_error(std::string(kNode), "MOVED 12 127.0.0.1:7001");
  for (const auto& [s, why] : renewed(nullptr, 2, &moved)) {
    EXPECT_EQ(s, Renewed::kTransient);
    EXPECT_EQ(why, "MOVED 12 127.0.0.1:7001");
  }
}

TEST(ReleaseReplyTest, OneByteAnswersEachLock) {
  auto r = released(read(bulk("10x")).get(), 3);
  EXPECT_EQ(r[0].first, Released::kYes);
  EXPECT_EQ(r[1].first, Released::kGone);
  EXPECT_EQ(r[2].first, Released::kTakenByOther);
  EXPECT_EQ(released(read(bulk("1")).get(), 1)[0].first, Released::kYes);
}

// Released, by how many subscribers the notice reached: 'u' none, 'v' one
// (kYes: the store decides whether that one was its own), '1' more.
TEST(ReleaseReplyTest, AReleaseSaysHowManyHeardItsNotice) {
  auto reader = read(bulk("uv1"));
  detail::ReleaseReply reply(reader.get(), nullptr, 3, kNode);
  const StoreError* why = nullptr;
  bool once = true;
  EXPECT_EQ(reply.next(&why, &once), Released::kYesUnheard);
  EXPECT_FALSE(once);
  EXPECT_EQ(reply.next(&why, &once), Released::kYes);
  EXPECT_TRUE(once);
  EXPECT_EQ(reply.next(&why, &once), Released::kYes);
  EXPECT_FALSE(once);
  EXPECT_EQ(why, nullptr);
}

TEST(ReleaseReplyTest, AnythingElseIsUnconfirmedNeverReleased) {
  auto r = released(read(bulk("1e")).get(), 2);
  EXPECT_EQ(r[0].first, Released::kYes);
  EXPECT_EQ(r[1].first, Released::kUnconfirmed);
  EXPECT_NE(r[1].second.find("unexpected reply to the release script"), std::string::npos) << r[1].second;
  // The one-lock script's integers of versions before, and other shapes.
  for (const std::string& resp :
       {std::string(":1\r\n"), std::string(":-1\r\n"), bulk(""), bulk("11"), std::string("$-1\r\n")}) {
    for (const auto& [s, why] : released(read(resp).get(), 1)) {
      EXPECT_EQ(s, Released::kUnconfirmed) << resp;
      EXPECT_NE(why.find("unexpected reply to the release script"), std::string::npos) << why;
    }
  }
}

TEST(InspectReplyTest, ReadsTheHolderOrSaysWhyNot) {
  LockInfo info;
  auto held = read("*5\r\n:5000\r\n:7\r\n" + bulk("tok") + "*2\r\n" + bulk("tok") + bulk("1795441148216 web-1:42:app") +
                   bulk("1795441150216"));
  EXPECT_FALSE(detail::read_inspect(held.get(), nullptr, kNode, "lockwatch:{k}", info));
  EXPECT_TRUE(info.held);
  EXPECT_EQ(info.ttl, std::chrono::milliseconds(5000));
  EXPECT_EQ(info.fencing_token, 7u);
  EXPECT_EQ(info.owner, "tok");
  EXPECT_EQ(info.kind, LockKind::exclusive());
  ASSERT_EQ(info.holders.size(), 1u);
  EXPECT_EQ(info.holders[0].token, "tok");
  EXPECT_EQ(info.holders[0].owner_name, "web-1:42:app");
  EXPECT_EQ(info.holders[0].since.time_since_epoch(), std::chrono::milliseconds(1795441148216));
  EXPECT_EQ(info.holders[0].held_for, std::chrono::milliseconds(2000));  // on the server's clock

  // A semaphore's holders; one recorded without a time (no TIME in the ACL).
  auto permits = read("*5\r\n:900\r\n:3\r\n" + bulk("lockwatch:permits:2") + "*4\r\n" + bulk("a") +
                      bulk("1795441148216 one") + bulk("b") + bulk("- two") + bulk("1795441148316"));
  EXPECT_FALSE(detail::read_inspect(permits.get(), nullptr, kNode, "lockwatch:{k}", info));
  EXPECT_EQ(info.kind, LockKind::permits(2));
  EXPECT_TRUE(info.owner.empty());
  ASSERT_EQ(info.holders.size(), 2u);
  EXPECT_EQ(info.holders[0].held_for, std::chrono::milliseconds(100));
  EXPECT_EQ(info.holders[1].owner_name, "two");
  EXPECT_EQ(info.holders[1].since, std::chrono::system_clock::time_point{});

  auto free = read("*5\r\n:-2\r\n:7\r\n" + bulk("") + "*0\r\n" + bulk("1795441148216"));
  EXPECT_FALSE(detail::read_inspect(free.get(), nullptr, kNode, "lockwatch:{k}", info));
  EXPECT_FALSE(info.held);
  EXPECT_EQ(info.fencing_token, 7u);
  EXPECT_TRUE(info.holders.empty());

  auto no_expiry = read("*5\r\n:-1\r\n:0\r\n" + bulk("x") + "*0\r\n" + bulk(""));
  auto err = detail::read_inspect(no_expiry.get(), nullptr, kNode, "lockwatch:{k}", info);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code, detail::RedisReply::kLockwatch);
  EXPECT_NE(err->message.find("exists without expiry"), std::string::npos);

  const std::string tail = "*0\r\n" + bulk("1");
  const std::vector<std::string> wrong{"*1\r\n:5000\r\n", ":1\r\n", "*3\r\n:5000\r\n:7\r\n" + bulk("t"),
                                       "*5\r\n:5000\r\n" + bulk("7") + bulk("t") + tail,
                                       "*5\r\n:5000\r\n:7\r\n:1\r\n" + tail,
                                       "*5\r\n:5000\r\n:-3\r\n" + bulk("t") + tail,
                                       "*5\r\n:5000\r\n:7\r\n" + bulk("t") + "*1\r\n" + bulk("a") + bulk("1")};
  for (const std::string& resp : wrong) {
    auto e = detail::read_inspect(read(resp).get(), nullptr, kNode, "lockwatch:{k}", info);
    ASSERT_TRUE(e) << resp;
    EXPECT_NE(e->message.find("unexpected reply to the inspect script"), std::string::npos) << e->message;
    EXPECT_FALSE(info.held);
  }
}

TEST(ForceReleaseReplyTest, OneOrZeroElseAnError) {
  bool held = false;
  EXPECT_FALSE(detail::read_force_release(read(":1\r\n").get(), nullptr, kNode, held));
  EXPECT_TRUE(held);
  EXPECT_FALSE(detail::read_force_release(read(":0\r\n").get(), nullptr, kNode, held));
  EXPECT_FALSE(held);
  for (const std::string& resp : {std::string(":2\r\n"), bulk("1"), std::string("$-1\r\n")}) {
    EXPECT_TRUE(detail::read_force_release(read(resp).get(), nullptr, kNode, held)) << resp;
    EXPECT_FALSE(held);
  }
}

TEST(RaiseFenceReplyTest, OneElseAnError) {
  EXPECT_FALSE(detail::read_raise_fence(read(":1\r\n").get(), nullptr, kNode));
  EXPECT_TRUE(detail::read_raise_fence(read(":0\r\n").get(), nullptr, kNode));
  EXPECT_TRUE(detail::read_raise_fence(read("+OK\r\n").get(), nullptr, kNode));
  const StoreError ask = detail::redis_reply_error(std::string(kNode), "ASK 12 127.0.0.1:7001");
  auto e = detail::read_raise_fence(nullptr, &ask, kNode);
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->redirect());
}

std::string claim(std::string_view status, std::string_view last = "0") {
  return "*4\r\n" + bulk(status) + bulk("1700000000") + bulk("250000") + bulk(last);
}

TEST(ClaimPeriodReplyTest, EachStatusReadsAsItsResult) {
  auto claimed = detail::read_claim_period(read(claim("1", "12")).get(), nullptr, kNode);
  EXPECT_EQ(claimed.status, ClaimResult::Status::kClaimed);
  EXPECT_EQ(claimed.last, 12);
  EXPECT_EQ(claimed.store_time, std::chrono::system_clock::time_point(std::chrono::seconds(1700000000) +
                                                                      std::chrono::milliseconds(250)));
  EXPECT_EQ(detail::read_claim_period(read(claim("0", "11")).get(), nullptr, kNode).status,
            ClaimResult::Status::kAlreadyRun);
  EXPECT_EQ(detail::read_claim_period(read(claim("2")).get(), nullptr, kNode).status, ClaimResult::Status::kNotDue);
  EXPECT_EQ(detail::read_claim_period(read(claim("-1")).get(), nullptr, kNode).status,
            ClaimResult::Status::kNotLeader);
}

TEST(ClaimPeriodReplyTest, AnUnknownStatusOrShapeFailsTheClaim) {
  for (const std::string& resp : {claim("3"), claim(""), claim("1", "x"), std::string(":1\r\n"),
                                  "*3\r\n" + bulk("1") + bulk("1") + bulk("1"),
                                  "*4\r\n:1\r\n" + bulk("1") + bulk("1") + bulk("1")}) {
    auto r = detail::read_claim_period(read(resp).get(), nullptr, kNode);
    EXPECT_EQ(r.status, ClaimResult::Status::kFailed) << resp;
    EXPECT_NE(r.error.message.find("unexpected reply to the period claim script"), std::string::npos)
        << r.error.message;
  }
}

// One table: every script by its id, its SHA-1 computed once, distinct.
TEST(ScriptTableTest, EachScriptHasItsOwnSourceAndSha1) {
  using detail::ScriptId;
  std::set<std::string> shas;
  for (ScriptId id : {ScriptId::kAcquire, ScriptId::kRenew, ScriptId::kRelease, ScriptId::kRaiseFence,
                      ScriptId::kInspect, ScriptId::kForceRelease, ScriptId::kClaimPeriod, ScriptId::kAcquireKind,
                      ScriptId::kRenewKind, ScriptId::kReleaseKind}) {
    const detail::Script& s = detail::script(id);
    EXPECT_EQ(&s, &detail::script(id)) << "one copy, in static storage";
    EXPECT_FALSE(s.source.empty());
    EXPECT_EQ(s.sha1, detail::sha1_hex(s.source));
    shas.insert(s.sha1);
  }
  EXPECT_EQ(shas.size(), 10u);
}

}  // namespace
}  // namespace lockwatch::testing
