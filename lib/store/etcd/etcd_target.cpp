#include "store/etcd/etcd_target.hpp"

#include <ranges>
#include <string_view>

#include "core/url.hpp"

namespace lockwatch::detail {

std::string EtcdTarget::Member::address() const { return host_port(host, port); }

EtcdTarget EtcdTarget::parse(const std::string& url) {
  const std::string_view scheme = scheme_of(url);
  EtcdTarget t;
  t.tls = scheme == "etcds";
  if (!t.tls && scheme != "etcd") throw_bad_url(url, "expected etcd://host:port[,host:port...]");
  std::string_view rest = std::string_view(url).substr(scheme.size() + 3);  // after "://"
  if (take_credentials(url, rest, t.user, t.password) && t.user.empty())
    throw_bad_url(url, "credentials without a user (expected etcd://user:password@host:port)");
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#") != std::string_view::npos)
    throw_bad_url(url, "an etcd:// URL names its members only: no path and no parameters");
  if (rest.empty()) throw_bad_url(url, "no member (expected etcd://host:port[,host:port...])");
  constexpr std::string_view kHostChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._";
  for (const auto part : std::views::split(rest, ',')) {
    const std::string_view text(part.begin(), part.end());
    if (text.empty()) throw_bad_url(url, "an empty member (expected etcd://host:port[,host:port...])");
    Member m;
    m.host = std::string(split_host_port(url, text, m.port));
    if (m.host.empty()) throw_bad_url(url, "a member without a host");
    // A bracketed host is an IPv6 address, passed to gRPC as it is.
    if (text.front() != '[' && m.host.find_first_not_of(kHostChars) != std::string::npos)
      throw_bad_url(url, "a member's host is not a name or an address");
    t.members.push_back(std::move(m));
  }
  return t;
}

std::string EtcdTarget::name() const {
  std::string out;
  for (const auto& m : members) out += (out.empty() ? "" : ",") + m.address();
  return (tls ? "etcds://" : "etcd://") + out;
}

}  // namespace lockwatch::detail
