#include "store/zookeeper/zk_nodes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <iterator>

#include "core/hex.hpp"
#include "core/whole_number.hpp"

namespace lockwatch::detail::zk {

using std::chrono::milliseconds;

namespace {

constexpr std::size_t kSeqDigits = 10;

bool keep_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ':' ||
         c == '-' || c == '=';
}

}  // namespace

std::string escape(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (unsigned char c : bytes)
    if (keep_byte(c))
      out.push_back(static_cast<char>(c));
    else
      fmt::format_to(std::back_inserter(out), "%{:02X}", c);
  return out;
}

bool unescape(std::string_view text, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size()) return false;
    int hi = hex_digit(text[i + 1]), lo = hex_digit(text[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

std::string dir_of(std::string_view name) { return std::string(kRoot) + "/" + escape(name); }

std::string hold_key(std::string_view name, std::string_view token) {
  return std::string(name) + '\0' + std::string(token);
}

NodeName parse_node(std::string_view child) {
  NodeName n;
  const std::size_t end = child.size() - kSeqDigits - 1;  // where "-<sequence>" starts
  if (child.size() < kNodePrefix.size() + kSeqDigits + 1 || !child.starts_with(kNodePrefix) || child[end] != '-')
    return n;
  if (!whole_number(child.substr(end + 1), n.seq)) return n;
  std::string_view rest = child.substr(kNodePrefix.size(), end - kNodePrefix.size());
  n.token = rest.substr(0, rest.find('.'));
  if (n.token.size() == rest.size()) return n;
  rest.remove_prefix(n.token.size() + 1);
  n.attempt = rest.substr(0, rest.find('.'));
  if (n.attempt.size() < rest.size()) n.mode = rest.substr(n.attempt.size() + 1);
  return n;
}

std::string node_prefix(std::string_view dir, std::string_view token, std::uint64_t attempt, LockKind kind) {
  const std::string mode = kinds::marker(kind, kNodeMarkers);
  return std::string(dir) + "/" + std::string(kNodePrefix) + escape(token) + "." + std::to_string(attempt) +
         (mode.empty() ? "" : "." + mode) + "-";
}

LockKind kind_of(std::string_view child) { return kinds::kind_of_marker(parse_node(child).mode, kNodeMarkers); }

std::vector<std::string> in_order(std::vector<std::string> children) {
  std::erase_if(children, [](const std::string& c) { return parse_node(c).seq < 0; });
  std::ranges::sort(children, {}, [](const std::string& c) { return parse_node(c).seq; });
  return children;
}

std::vector<std::string> holding(const std::vector<std::string>& nodes) {
  if (nodes.empty()) return {};
  const LockKind first = kind_of(nodes.front());
  std::size_t n = 1;
  if (first.mode() == LockKind::Mode::kShared) {
    while (n < nodes.size() && kind_of(nodes[n]).mode() == LockKind::Mode::kShared) ++n;
  } else if (first.mode() == LockKind::Mode::kPermits) {
    n = std::min<std::size_t>(nodes.size(), first.permit_count());
  }
  return {nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(n)};
}

std::string node_data(std::string_view token, milliseconds ttl, std::string_view owner) {
  return std::string(token) + "\n" + std::to_string(ttl.count()) + "\n" + std::string(owner);
}

std::pair<std::string, long long> parse_data(const std::string& data, std::string* owner) {
  auto nl = data.find('\n');
  if (nl == std::string::npos) return {data, 0};
  auto second = data.find('\n', nl + 1);
  const auto ttl_end = second == std::string::npos ? data.size() : second;
  long long ms = 0;
  std::from_chars(data.data() + nl + 1, data.data() + ttl_end, ms);
  if (owner != nullptr) *owner = second == std::string::npos ? std::string() : data.substr(second + 1);
  return {data.substr(0, nl), ms};
}

milliseconds mark_span(milliseconds ttl, LockKind kind) {
  if (kind.mode() == LockKind::Mode::kFair) return std::max(ttl, milliseconds(1));
  return std::clamp(ttl, milliseconds(1), kinds::kWriterMark);
}

}  // namespace lockwatch::detail::zk
