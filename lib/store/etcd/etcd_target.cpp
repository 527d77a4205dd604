#include "store/etcd/etcd_target.hpp"

#include <string_view>

#include "core/url.hpp"

namespace lockwatch::detail {

namespace {

int member_port(const std::string& url, std::string_view text) {
  int port = text.empty() || text.size() > 5 ? -1 : 0;  // -1: not a number
  for (char c : text)
    if (port >= 0) port = c >= '0' && c <= '9' ? port * 10 + (c - '0') : -1;
  if (port < 1 || port > 65535) throw_bad_url(url, "a member's port is not a number from 1 to 65535");
  return port;
}

EtcdTarget::Member parse_member(const std::string& url, std::string_view text) {
  EtcdTarget::Member m;
  if (text.empty()) throw_bad_url(url, "an empty member (expected etcd://host:port[,host:port...])");
  if (text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close == 1) throw_bad_url(url, "a bracketed IPv6 address is not closed");
    m.host = std::string(text.substr(1, close - 1));
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw_bad_url(url, "expected ':port' after a bracketed IPv6 address");
      m.port = member_port(url, rest.substr(1));
    }
    return m;
  }
  auto colon = text.find(':');
  m.host = std::string(text.substr(0, colon));
  if (m.host.empty()) throw_bad_url(url, "a member without a host");
  constexpr std::string_view kHostChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._";
  if (m.host.find_first_not_of(kHostChars) != std::string::npos)
    throw_bad_url(url, "a member's host is not a name or an address");
  if (colon != std::string_view::npos) m.port = member_port(url, text.substr(colon + 1));
  return m;
}

}  // namespace

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
  while (true) {
    auto comma = rest.find(',');
    t.members.push_back(parse_member(url, rest.substr(0, comma)));
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
