#include "store/redis/topology.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <vector>

#include "core/hex.hpp"
#include "core/token.hpp"
#include "core/url.hpp"
#include "core/whole_number.hpp"
#include "lockwatch/errors.hpp"
#include "store/redis/layout.hpp"

namespace lockwatch::detail {

HostList::HostList(const std::string& url) : scheme(url.starts_with("rediss") ? "rediss://" : "redis://") {
  std::string rest = url.substr(url.find("://") + 3);
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    credentials = rest.substr(0, at + 1);
    rest.erase(0, at + 1);
  }
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    path = rest.substr(slash);
    rest.resize(slash);
  }
  for (std::size_t start = 0, comma = 0; comma != std::string::npos; start = comma + 1) {
    comma = rest.find(',', start);
    hosts.push_back(rest.substr(start, comma - start));  // the last to the end
  }
}

Topology Topology::parse(const std::string& url) {
  Topology t;
  if (!url.starts_with("rediss-sentinel://") && !url.starts_with("redis-sentinel://")) {
    t.masters = Endpoint::parse_list(url);
    return t;
  }
  // Over TLS (the list's scheme) the sentinels and the master alike.
  // redis-sentinel://[cred@]h:p,h:p/name[/db]: reuse the redis:// parser
  // for the credentials, each sentinel and the db.
  const HostList list(url);
  if (list.path.size() < 2) throw_bad_url(url, "expected redis-sentinel://host:port[,host:port...]/master-name");
  const auto s2 = list.path.find('/', 1);
  t.master_name = list.path.substr(1, s2 - 1);
  if (t.master_name.empty()) throw_bad_url(url, "no master name");
  const std::string db = s2 == std::string::npos ? std::string() : list.path.substr(s2);
  for (const auto& host : list.hosts) t.sentinels.push_back(Endpoint::parse(list.scheme + host));
  t.master = Endpoint::parse(list.scheme + list.credentials + "unresolved:1" + db);
  t.master.host.clear();
  t.master.port = 0;  // found through the sentinels
  return t;
}

StoreLayout StoreLayout::make_redisson() {
  // As Java's UUID.randomUUID(): 122 random bits, version 4, variant 10.
  const OwnerToken t = TokenGenerator().next();
  std::string hex = t.str();
  hex[12] = '4';
  hex[16] = "89ab"[hex_digit(hex[16]) & 3];
  StoreLayout out;
  out.kind = RedisLayout::kRedisson;
  out.client_id = hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" + hex.substr(16, 4) + "-" +
                  hex.substr(20);
  return out;
}

std::string StoreLayout::field(std::string_view token) const {
  constexpr std::size_t kDigits = 15;
  std::uint64_t id = 0;
  if (token.size() >= kDigits && token.find_first_not_of("0123456789abcdef") >= kDigits) {
    std::from_chars(token.data(), token.data() + kDigits, id, 16);
  } else {
    id = 14695981039346656037ull;  // FNV-1a
    for (char c : token) id = (id ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    id >>= 4;
  }
  std::string out;
  out.reserve(client_id.size() + 21);
  out.append(client_id).push_back(':');
  return out.append(std::to_string(id));
}

namespace {

int url_int(const std::string& url, std::string_view name, const std::string& value, int lo, int hi) {
  const auto n = whole_number<int>(value);
  if (!n || *n < lo || *n > hi)
    throw InvalidArgument(fmt::format("'{}': {} must be a whole number from {} to {}, not '{}'", url_for_messages(url),
                                      name, lo, hi, value));
  return *n;
}

}  // namespace

RedisUrl split_redis_url(const std::string& url) {
  RedisUrl out;
  // The query follows the hosts (and a password, which may hold a '?'
  // only %-escaped; a value in the query, an '@' only %-escaped).
  const auto at = url.rfind('@');
  const auto q = url.find('?', at == std::string::npos ? 0 : at);
  out.url = url.substr(0, q);
  std::string_view query = q == std::string::npos ? std::string_view() : std::string_view(url).substr(q + 1);
  std::vector<std::string_view> seen;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (param.empty()) continue;
    const auto eq = param.find('=');
    const std::string_view name = param.substr(0, eq);
    const std::string value = eq == std::string_view::npos ? std::string() : percent_decode(url, param.substr(eq + 1));
    if (std::find(seen.begin(), seen.end(), name) != seen.end())
      throw InvalidArgument(fmt::format("'{}' gives {} twice", url_for_messages(url), name));
    seen.push_back(name);
    if (name == "layout") {
      if (value != "lockwatch" && value != "redisson")
        throw InvalidArgument(fmt::format("unknown layout '{}' in '{}': the layouts are 'lockwatch' (the default) "
                                          "and 'redisson' (Redisson's RLock, shared with Java services)",
                                          value, url_for_messages(url)));
      out.layout = value == "redisson" ? RedisLayout::kRedisson : RedisLayout::kLockwatch;
    } else if (name == "min_replicas") {
      out.replicas.min = url_int(url, name, value, 0, 16);
    } else if (name == "replica_ack_timeout") {
      out.replicas.ack_timeout = std::chrono::milliseconds(url_int(url, name, value, 1, 60000));
    } else if (name == "sentinel_user") {
      out.sentinel_user = value;
    } else if (name == "sentinel_password") {
      out.sentinel_password = value;
    } else {
      throw InvalidArgument(fmt::format("unknown parameter '{}' in '{}': a Redis URL takes layout, min_replicas, "
                                        "replica_ack_timeout, sentinel_user and sentinel_password",
                                        name, url_for_messages(url)));
    }
  }
  return out;
}

}  // namespace lockwatch::detail
