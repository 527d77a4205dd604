// lib/store/redis/subscriptions.hpp: what a pub/sub connection listens to,
// apart from the connection that carries it. The connection reads and
// writes; a Subscriptions keeps the channels wanted, writes what subscribes
// and unsubscribes them, and reads the answers. Two small policies:
//
//   classic  SUBSCRIBE / UNSUBSCRIBE (one node, Sentinel). The answer to a
//            SUBSCRIBE that unsubscribe() followed before it came is not
//            reported (a waiter told it listens would sleep through every
//            release notice); an error answering one is a refusal (the
//            user's ACL refused the channel), told through on_refused.
//   sharded  SSUBSCRIBE / SUNSUBSCRIBE (Redis Cluster), one channel per
//            command, kept in order to match each answer to its command. A
//            channel the node gives up is dropped from the set and told
//            through on_dropped with why: an unsolicited `sunsubscribe`
//            (the node lost the channel's slot) or an error answering its
//            SSUBSCRIBE (MOVED: another node serves the slot). A
//            confirmation for a channel no longer wanted is unsubscribed
//            again and not reported.
//
// Threading: the loop thread, as its connection. Costs: a set of the
// channels wanted, and what is unanswered.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <unordered_set>

#include "store/store_error.hpp"

namespace lockwatch::detail {

class RedisConnection;

class Subscriptions {
 public:
  // `wire` writes a command on its current link (write()), if one is up
  // to write it on (can_write()); what is dropped or refused is told
  // through its hooks (Hooks::on_dropped is the sharded policy's,
  // Hooks::on_refused the classic one's).
  Subscriptions(bool sharded, RedisConnection& wire) : sharded_(sharded), wire_(wire) {}

  // Wanted from now on; false if it was already.
  bool want(const std::string& channel) { return channels_.insert(channel).second; }
  // Not wanted any more; false if it was not.
  bool unwant(const std::string& channel) { return channels_.erase(channel) != 0; }
  // Writes the command that subscribes (or unsubscribes) `channel`.
  void write(bool subscribe, const std::string& channel);
  // A new link: what was unanswered went with the old one; every channel
  // wanted is subscribed again.
  void resubscribe();
  // A push for `channel` of this `kind` ("subscribe", "smessage", ...):
  // true when it is handled here and not to be reported.
  bool handled(std::string_view kind, std::string_view channel);
  // An error reply that answers no request: it answers a subscription.
  void error(const StoreError& why);

 private:
  struct Sent {
    bool subscribe;
    std::string channel;
  };
  const bool sharded_;
  RedisConnection& wire_;
  std::unordered_set<std::string> channels_;
  // Written on the current link and not answered yet, in order: every
  // sharded command, the classic SUBSCRIBEs.
  std::deque<Sent> sent_;
};

}  // namespace lockwatch::detail
