#include "store/redis/topology.hpp"

#include "core/url.hpp"

namespace lockwatch::detail {

Topology Topology::parse(const std::string& url) {
  Topology t;
  constexpr std::string_view kSentinel = "redis-sentinel://";
  constexpr std::string_view kTlsSentinel = "rediss-sentinel://";
  const bool tls = url.compare(0, kTlsSentinel.size(), kTlsSentinel) == 0;
  if (!tls && url.compare(0, kSentinel.size(), kSentinel) != 0) {
    t.masters = Endpoint::parse_list(url);
    return t;
  }
  // Over TLS the sentinels and the master alike.
  const std::string scheme = tls ? "rediss://" : "redis://";
  // redis-sentinel://[cred@]h:p,h:p/name[/db]: reuse the redis:// parser
  // for the credentials, each sentinel and the db.
  std::string rest = url.substr(tls ? kTlsSentinel.size() : kSentinel.size());
  std::string cred;
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    cred = rest.substr(0, at + 1);
    rest = rest.substr(at + 1);
  }
  auto slash = rest.find('/');
  if (slash == std::string::npos || slash + 1 >= rest.size()) throw_bad_url(url, "expected redis-sentinel://host:port[,host:port...]/master-name");
  std::string hosts = rest.substr(0, slash);
  std::string tail = rest.substr(slash + 1);
  std::string db;
  if (auto s2 = tail.find('/'); s2 != std::string::npos) {
    db = tail.substr(s2);
    tail = tail.substr(0, s2);
  }
  if (tail.empty()) throw_bad_url(url, "no master name");
  t.master_name = tail;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = hosts.find(',', start);
    std::string one = hosts.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    t.sentinels.push_back(Endpoint::parse(scheme + one));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  t.master = Endpoint::parse(scheme + cred + "unresolved:1" + db);
  t.master.host.clear();
  t.master.port = 0;  // found through the sentinels
  return t;
}

}  // namespace lockwatch::detail
