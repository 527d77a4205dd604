// lib/store/zookeeper/zk_nodes.hpp: how a lock lies on a ZooKeeper
// ensemble, as names and data (docs/zookeeper.md, "What a lock is" and
// "Kinds of lock"): the lock's directory, its nodes' names
// (lock-<owner token>.<attempt>[.<mode>]-<sequence>) and data (token, ttl,
// owner name), which of a listing's nodes hold the lock, and the
// directory's `fence` and `period` nodes.
//
// Threading: pure functions, any thread. Costs: string work only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store/kind_rules.hpp"

namespace lockwatch::detail::zk {

// Where every lock's directory lives (under the URL's chroot).
inline constexpr const char* kRoot = "/lockwatch";
// The longest lock name (key_prefix + key), in bytes; escaped, a node
// name is at most three times as long.
inline constexpr std::size_t kMaxNameBytes = 255;
inline constexpr std::string_view kNodePrefix = "lock-";
inline constexpr const char* kFenceNode = "fence";
inline constexpr const char* kPeriodNode = "period";
// The kinds' marks in a node's name (node_prefix(), kind_of()).
inline constexpr kinds::Markers kNodeMarkers{"r", "p", "f"};

// A name or token as node-name text: letters, digits and "_:-=" as they
// are, any other byte as %XX.
std::string escape(std::string_view bytes);
// escape() undone; false if `text` is not escaped text.
bool unescape(std::string_view text, std::string& out);
// A lock's directory: kRoot + "/" + the name escaped.
std::string dir_of(std::string_view name);
// The key the store's tables know a lock by (name + '\0' + token).
std::string hold_key(std::string_view name, std::string_view token);

// A child's name in its parts, lock-<token>.<attempt>[.<mode>]-<sequence>
// (an escaped token has no '.'): `seq` -1 when it is not one of ours.
struct NodeName {
  std::int64_t seq = -1;
  std::string_view token, attempt, mode;  // the token escaped
};
NodeName parse_node(std::string_view child);
// The path of the node `token`'s `attempt` makes in `dir`, but for the
// sequence the ensemble appends; its mode says `kind` (none: exclusive).
std::string node_prefix(std::string_view dir, std::string_view token, std::uint64_t attempt, LockKind kind);
// How a child holds (its mode); a node a client without kinds made is a
// writer, so that such a client and this one never hold a reader beside a
// writer; an unknown mode too (the strictest reading).
LockKind kind_of(std::string_view child);
// The lock's nodes in sequence order.
std::vector<std::string> in_order(std::vector<std::string> children);
// Of a lock's nodes in order, those that hold it: the lowest (exclusive,
// fair), the readers below the first writer's node (shared), the n lowest
// (permits(n)).
std::vector<std::string> holding(const std::vector<std::string>& nodes);

// "<token>\n<ttl ms>\n<owner name>" (an owner name has no control
// characters; versions before wrote no third line).
std::string node_data(std::string_view token, std::chrono::milliseconds ttl, std::string_view owner);
// A node's data: the owner token and the ttl (ms; 0 when unreadable).
std::pair<std::string, long long> parse_data(const std::string& data, std::string* owner = nullptr);

// How long a waiting node is kept without an attempt of its own: a fair
// waiter's node is its place in the queue and lasts its ttl after its last
// attempt (the runtime tries again within a third of it); a writer's mark
// lasts kinds::kWriterMark at most.
std::chrono::milliseconds mark_span(std::chrono::milliseconds ttl, LockKind kind);

}  // namespace lockwatch::detail::zk
