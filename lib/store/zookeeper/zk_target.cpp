#include "store/zookeeper/zk_target.hpp"

#include <charconv>
#include <string_view>

#include "core/url.hpp"

namespace lockwatch::detail {

namespace {

constexpr std::string_view kScheme = "zookeeper://";

int parse_port(const std::string& url, std::string_view text) {
  int port = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) throw_bad_url(url, "bad port");
  if (port <= 0 || port > 65535) throw_bad_url(url, "port out of range");
  return port;
}

std::string with_brackets(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

}  // namespace

ZkTarget ZkTarget::parse(const std::string& url) {
  std::string_view rest(url);
  if (rest.substr(0, kScheme.size()) != kScheme)
    throw_bad_url(url, "expected zookeeper://[user:password@]host:port[,host:port...][/chroot]");
  rest.remove_prefix(kScheme.size());
  if (rest.find('?') != std::string_view::npos || rest.find('#') != std::string_view::npos)
    throw_bad_url(url, "a zookeeper:// URL takes no parameters");
  ZkTarget t;
  if (auto at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view cred = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    auto colon = cred.find(':');
    if (colon == std::string_view::npos) throw_bad_url(url, "digest authentication needs user:password");
    t.user = percent_decode(url, cred.substr(0, colon));
    t.password = percent_decode(url, cred.substr(colon + 1));
    if (t.user.empty()) throw_bad_url(url, "an empty user");
    if (t.user.find(':') != std::string::npos || t.user.find('\0') != std::string::npos ||
        t.password.find('\0') != std::string::npos)
      throw_bad_url(url, "a digest user holds no ':' and neither part a NUL");
  }
  std::string_view hosts = rest;
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    hosts = rest.substr(0, slash);
    std::string_view chroot = rest.substr(slash);
    if (chroot != "/") {
      std::string decoded = percent_decode(url, chroot);
      std::string_view segs(decoded);
      segs.remove_prefix(1);
      while (true) {
        auto next = segs.find('/');
        std::string_view seg = segs.substr(0, next);
        if (seg.empty() || seg == "." || seg == ".." || seg.find('\0') != std::string_view::npos ||
            seg == "zookeeper")
          throw_bad_url(url, "a bad chroot: its segments must be non-empty, not '.', '..' or 'zookeeper'");
        if (next == std::string_view::npos) break;
        segs.remove_prefix(next + 1);
      }
      t.chroot = std::move(decoded);
    }
  }
  if (hosts.empty()) throw_bad_url(url, "no host: expected zookeeper://host:port[,host:port...]");
  while (true) {
    auto comma = hosts.find(',');
    std::string_view hp = hosts.substr(0, comma);
    std::string_view host = hp;
    int port = 2181;
    if (!hp.empty() && hp.front() == '[') {
      auto close = hp.find(']');
      if (close == std::string_view::npos) throw_bad_url(url, "unclosed '[' in host");
      host = hp.substr(1, close - 1);
      std::string_view after = hp.substr(close + 1);
      if (!after.empty()) {
        if (after.front() != ':') throw_bad_url(url, "bad port");
        port = parse_port(url, after.substr(1));
      }
    } else if (auto colon = hp.rfind(':'); colon != std::string_view::npos) {
      host = hp.substr(0, colon);
      port = parse_port(url, hp.substr(colon + 1));
    }
    if (host.empty()) throw_bad_url(url, "an empty host in the member list");
    for (char c : host)
      if (c == '%' || c == '/' || c == ',' || c == '@' || static_cast<unsigned char>(c) <= ' ')
        throw_bad_url(url, "a bad host name");
    t.hosts.emplace_back(std::string(host), port);
    if (comma == std::string_view::npos) break;
    hosts.remove_prefix(comma + 1);
  }
  return t;
}

std::string ZkTarget::connect_string() const {
  std::string out;
  for (const auto& [host, port] : hosts) {
    if (!out.empty()) out += ',';
    out += with_brackets(host) + ":" + std::to_string(port);
  }
  return out + chroot;
}

std::string ZkTarget::name() const { return "zookeeper://" + connect_string(); }

}  // namespace lockwatch::detail
