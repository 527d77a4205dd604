#include "store/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ranges>

#include "core/url.hpp"
#include "lockwatch/errors.hpp"
#include "store/memory/memory_kind.hpp"
#include "store/redis/redis_kinds.hpp"
#include "store/etcd/etcd_kind.hpp"
#include "store/postgresql/pg_kind.hpp"
#include "store/sql/sql_kind.hpp"
#include "store/zookeeper/zk_kind.hpp"

namespace lockwatch::detail {

namespace {

// Scheme to store: one line per kind.
constexpr const StoreKind* kKinds[] = {
    &kRedisStore, &kRedisClusterStore, &kSqlStore, &kPostgresStore, &kZooKeeperStore, &kEtcdStore, &kMemoryStore,
};

bool serves(const StoreKind& kind, std::string_view scheme) {
  return std::ranges::any_of(std::views::split(kind.schemes, ' '),
                             [&](const auto s) { return std::string_view(s.begin(), s.end()) == scheme; });
}

std::string supported() {
  return fmt::format("{}", fmt::join(kKinds | std::views::transform(&StoreKind::usage), ", "));
}

const StoreKind& kind_of(const std::string& url) {
  std::string_view scheme = scheme_of(url);
  if (scheme.empty())
    throw InvalidArgument(
        fmt::format("malformed URL '{}': no scheme; lockwatch supports {}", url_for_messages(url), supported()));
  for (const StoreKind* k : kKinds) {
    if (!serves(*k, scheme)) continue;
    if (!k->missing_feature.empty()) throw_missing_feature(url, k->missing_feature);
    return *k;
  }
  throw InvalidArgument(fmt::format("unsupported URL scheme '{}://' in '{}': lockwatch supports {}", scheme,
                                    url_for_messages(url), supported()));
}

}  // namespace

void throw_missing_feature(const std::string& url, std::string_view feature) {
  throw Unsupported(fmt::format("'{}' needs lockwatch built with the Meson feature {}, which this build left out",
                                url_for_messages(url), feature));
}

void check_store_options(const Options& options) {
  const std::string& url = store_url(options);
  kind_of(url).check(url, options);
}

std::unique_ptr<LockStore> make_store(Loop& loop, const Options& options) {
  check_store_options(options);
  const std::string& url = store_url(options);
  return kind_of(url).make(loop, url, options);
}

}  // namespace lockwatch::detail

namespace lockwatch {

std::vector<std::string> store_url_forms() {
  std::vector<std::string> out;
  for (const detail::StoreKind* k : detail::kKinds) {
    std::string line(k->usage);
    if (!k->missing_feature.empty())
      line += fmt::format(" [not in this build: the Meson feature {}]", k->missing_feature);
    out.push_back(std::move(line));
  }
  return out;
}

}  // namespace lockwatch
