// lib/store/sqlcommon/batching.hpp: how the SQL stores cut what one loop
// turn queued into statements, and which command connection takes one.
//
// Every statement takes its rows in name order, so that two statements
// never wait on each other's rows in opposite orders; one statement
// carries at most kChunk locks. Templates over the store's pending
// records (anything with a `name`) and its connection type (anything with
// `pending()`). Loop thread, as the stores.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <memory>
#include <vector>

namespace lockwatch::detail::sqlcommon {

// The locks one statement carries at most.
inline constexpr std::size_t kChunk = 512;

// Hands `send` the items of `all`, kChunk at a time, in their order.
template <class T, class Send>
void in_chunks(std::vector<T>& all, Send&& send) {
  for (std::size_t from = 0; from < all.size(); from += kChunk) {
    const std::size_t to = std::min(all.size(), from + kChunk);
    send(std::vector<T>(std::make_move_iterator(all.begin() + from), std::make_move_iterator(all.begin() + to)));
  }
}

// Sorts `all` by name (stably: a name's requests keep their order).
template <class T>
void by_name(std::vector<T>& all) {
  std::stable_sort(all.begin(), all.end(), [](const T& a, const T& b) { return a.name < b.name; });
}

// The command connection with the fewest requests pending (the first on a tie).
template <class Connection>
Connection& least_pending(const std::vector<std::unique_ptr<Connection>>& connections) {
  Connection* best = connections.front().get();
  for (const auto& c : connections)
    if (c->pending() < best->pending()) best = c.get();
  return *best;
}

}  // namespace lockwatch::detail::sqlcommon
