#include "store/etcd/etcd_target.hpp"

#include <string_view>

#include "core/url.hpp"

namespace lockwatch::detail {

std::string EtcdTarget::Member::address() const { return host_port(host, port); }

EtcdTarget EtcdTarget::parse(const std::string& url) {
  constexpr std::string_view kScheme = "etcd://", kTlsScheme = "etcds://";
  EtcdTarget t;
  t.tls = url.compare(0, kTlsScheme.size(), kTlsScheme) == 0;
  if (!t.tls && url.compare(0, kScheme.size(), kScheme) != 0)
    throw_bad_url(url, "expected etcd://host:port[,host:port...]");
  std::string_view rest = std::string_view(url).substr(t.tls ? kTlsScheme.size() : kScheme.size());
  if (take_credentials(url, rest, t.user, t.password) && t.user.empty())
    throw_bad_url(url, "credentials without a user (expected etcd://user:password@host:port)");
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#") != std::string_view::npos)
    throw_bad_url(url, "an etcd:// URL names its members only: no path and no parameters");
  if (rest.empty()) throw_bad_url(url, "no member (expected etcd://host:port[,host:port...])");
  constexpr std::string_view kHostChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._";
  while (true) {
    auto comma = rest.find(',');
    std::string_view text = rest.substr(0, comma);
    if (text.empty()) throw_bad_url(url, "an empty member (expected etcd://host:port[,host:port...])");
    Member m;
    m.host = std::string(split_host_port(url, text, m.port));
    if (m.host.empty()) throw_bad_url(url, "a member without a host");
    // A bracketed host is an IPv6 address, passed to gRPC as it is.
    if (text.front() != '[' && m.host.find_first_not_of(kHostChars) != std::string::npos)
      throw_bad_url(url, "a member's host is not a name or an address");
    t.members.push_back(std::move(m));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return t;
}

std::string EtcdTarget::name() const {
  std::string out = tls ? "etcds://" : "etcd://";
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i > 0) out += ',';
    out += members[i].address();
  }
  return out;
}

}  // namespace lockwatch::detail
