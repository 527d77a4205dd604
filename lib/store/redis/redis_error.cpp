#include "store/redis/redis_error.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "core/whole_number.hpp"
#include "store/redis/cluster_slot.hpp"

namespace lockwatch::detail {

namespace {

// The word of each RedisReply from kErr to kLockwatchKind, in the enum's order.
constexpr std::array<std::string_view, 20> kRedisReplyWords{
    "ERR",      "WRONGTYPE",   "OOM",   "NOSCRIPT", "BUSY",      "READONLY", "NOREPLICAS", "MASTERDOWN", "LOADING",
    "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK",      "CROSSSLOT", "NOAUTH",   "WRONGPASS",  "NOPERM",     "EXECABORT",
    "LOCKWATCH", "LOCKWATCH-KIND"};
static_assert(kRedisReplyWords.size() == static_cast<std::size_t>(RedisReply::kOther) - 1);

std::string reply_word(int code) {
  if (code >= 1 && code < static_cast<int>(RedisReply::kOther)) return std::string(kRedisReplyWords[code - 1]);
  return "another error reply";
}

// The first word of a Redis error line: its code ("MOVED", "WRONGTYPE", "ERR").
std::string_view first_word(std::string_view message) { return message.substr(0, message.find(' ')); }

// What follows the code and a space ("" when nothing does).
std::string_view after_code(std::string_view message, std::string_view code) {
  return message.substr(std::min(message.size(), code.size() + 1));
}

// "<slot> <host>:<port>" after MOVED or ASK; nullopt when it is not that.
std::optional<ClusterRedirect> parse_redirect(std::string_view rest) {
  const auto space = rest.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view hp = rest.substr(space + 1);
  const auto colon = hp.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const auto slot = whole_number<std::uint16_t>(rest.substr(0, space));
  const auto port = whole_number<int>(hp.substr(colon + 1));
  if (!slot || *slot >= kClusterSlots || !port || *port < 1 || *port > 65535) return std::nullopt;
  return ClusterRedirect{false, *slot, std::string(hp.substr(0, colon)), *port};
}

// A command a script called, refused by the user's ACL: Redis answers ERR
// with these words (7.0: "The user executing the script can't run this
// command ...", "... can't access at least one of the keys ...", "...
// can't publish to the channel ..."; 7.2 on: "ACL failure in script: User
// u has no permissions to run the 'x' command"), where a command sent
// directly gets NOPERM.
bool script_acl_refusal(std::string_view text) {
  return text.starts_with("The user executing the script can't") || text.starts_with("ACL failure in script:");
}

}  // namespace

const StoreCategory& redis_category() noexcept {
  // The reply's whole line is the message, its first word included.
  static const StoreCategory category("lockwatch.redis", reply_word, "redis {0} answered an error: {3}");
  return category;
}

RedisReply redis_reply_code(std::string_view word) noexcept {
  const auto at = std::find(kRedisReplyWords.begin(), kRedisReplyWords.end(), word);
  return static_cast<RedisReply>(at - kRedisReplyWords.begin() + 1);  // kOther past the end
}

StoreError redis_reply_error(std::string endpoint, std::string_view message) {
  const std::string_view code = first_word(message);
  StoreError e = StoreError::refused(std::move(endpoint), std::string(message), redis_reply_code(code));
  if (code == "MOVED" || code == "ASK") {
    if (parse_redirect(after_code(message, code))) e.kind = StoreError::Kind::kRedirect;
  } else if (code == "TRYAGAIN" || code == "CLUSTERDOWN" || code == "LOADING" || code == "MASTERDOWN") {
    e.kind = StoreError::Kind::kRetryLater;
  } else if (code == "NOAUTH" || code == "WRONGPASS" || code == "NOPERM" ||
             (code == "ERR" && script_acl_refusal(after_code(message, code)))) {
    e.kind = StoreError::Kind::kAuth;
  } else if (code == "LOCKWATCH-KIND") {
    // A key held as another kind of lock (or a semaphore of another n).
    e.kind = StoreError::Kind::kInvalid;
    e.message = std::string(after_code(message, code));
  }
  return e;
}

std::optional<ClusterRedirect> cluster_redirect(const StoreError& e) {
  if (!e.redirect()) return std::nullopt;
  auto to = parse_redirect(after_code(e.message, first_word(e.message)));
  if (to) to->ask = e.code == RedisReply::kAsk;
  return to;
}

bool is_ask(const StoreError& e) noexcept { return e.redirect() && e.code == RedisReply::kAsk; }

bool redis_acl_refusal(const StoreError& e) noexcept {
  return e.kind == StoreError::Kind::kAuth && (e.code == RedisReply::kNoPerm || e.code == RedisReply::kErr);
}

}  // namespace lockwatch::detail
