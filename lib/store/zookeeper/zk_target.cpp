#include "store/zookeeper/zk_target.hpp"

#include <ranges>
#include <string_view>

#include "core/url.hpp"

namespace lockwatch::detail {

ZkTarget ZkTarget::parse(const std::string& url) {
  constexpr std::string_view kScheme = "zookeeper://";
  std::string_view rest(url);
  if (rest.substr(0, kScheme.size()) != kScheme)
    throw_bad_url(url, "expected zookeeper://[user:password@]host:port[,host:port...][/chroot]");
  rest.remove_prefix(kScheme.size());
  if (rest.find_first_of("?#") != std::string_view::npos) throw_bad_url(url, "a zookeeper:// URL takes no parameters");
  ZkTarget t;
  if (auto at = rest.rfind('@'); at != std::string_view::npos) {
    if (rest.substr(0, at).find(':') == std::string_view::npos)
      throw_bad_url(url, "digest authentication needs user:password");
    take_credentials(url, rest, t.user, t.password);
    if (t.user.empty()) throw_bad_url(url, "an empty user");
    if (t.user.find(':') != std::string::npos || t.user.find('\0') != std::string::npos ||
        t.password.find('\0') != std::string::npos)
      throw_bad_url(url, "a digest user holds no ':' and neither part a NUL");
  }
  std::string_view hosts = rest.substr(0, rest.find('/'));
  if (std::string_view chroot = rest.substr(hosts.size()); chroot.size() > 1) {  // not "" or "/"
    t.chroot = percent_decode(url, chroot);
    for (const auto part : std::views::split(std::string_view(t.chroot).substr(1), '/')) {
      const std::string_view seg(part.begin(), part.end());
      if (seg.empty() || seg == "." || seg == ".." || seg.find('\0') != std::string_view::npos || seg == "zookeeper")
        throw_bad_url(url, "a bad chroot: its segments must be non-empty, not '.', '..' or 'zookeeper'");
    }
  }
  if (hosts.empty()) throw_bad_url(url, "no host: expected zookeeper://host:port[,host:port...]");
  for (const auto part : std::views::split(hosts, ',')) {
    int port = 2181;
    std::string_view host = split_host_port(url, std::string_view(part.begin(), part.end()), port);
    if (host.empty()) throw_bad_url(url, "an empty host in the member list");
    for (char c : host)
      if (c == '%' || c == '/' || c == ',' || c == '@' || static_cast<unsigned char>(c) <= ' ')
        throw_bad_url(url, "a bad host name");
    t.hosts.emplace_back(std::string(host), port);
  }
  return t;
}

std::string ZkTarget::name() const {
  std::string out;
  for (const auto& [host, port] : hosts) out += (out.empty() ? "" : ",") + host_port(host, port);
  return "zookeeper://" + out + chroot;
}

}  // namespace lockwatch::detail
