// lib/store/sqlcommon/batching.hpp: how the SQL stores cut what one loop
// turn queued into statements.
//
// Every statement takes its rows in name order, so that two statements
// never wait on each other's rows in opposite orders; one statement
// carries at most kChunk locks. Templates over the store's pending
// records (anything with a `name`). Loop thread, as the stores.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <vector>

namespace lockwatch::detail::sqlcommon {

// The locks one statement carries at most.
inline constexpr std::size_t kChunk = 512;

// Hands `send` the items of `all`, `size` (kChunk) at a time, in their order.
template <class T, class Send>
void in_chunks(std::vector<T>& all, Send&& send, std::size_t size = kChunk) {
  for (std::size_t from = 0; from < all.size(); from += size) {
    const std::size_t to = std::min(all.size(), from + size);
    send(std::vector<T>(std::make_move_iterator(all.begin() + from), std::make_move_iterator(all.begin() + to)));
  }
}

// Sorts `all` by name (stably: a name's requests keep their order).
template <class T>
void by_name(std::vector<T>& all) {
  std::stable_sort(all.begin(), all.end(), [](const T& a, const T& b) { return a.name < b.name; });
}

}  // namespace lockwatch::detail::sqlcommon
