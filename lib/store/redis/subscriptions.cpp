#include "store/redis/subscriptions.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/guarded.hpp"
#include "store/redis/redis_error.hpp"

namespace lockwatch::detail {

namespace {

// Told to the store through guarded(): nothing may unwind into the
// connection's read.
constexpr const char* kToStore = "a subscription callback";

class ClassicSubscriptions final : public Subscriptions {
 public:
  ClassicSubscriptions(Wire& wire, Refused on_refused) : Subscriptions(wire), on_refused_(std::move(on_refused)) {}

  void write(bool subscribe, const std::string& channel) override {
    wire_.write({subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", channel});
    if (subscribe) ++unanswered_[channel];
  }

  bool handled(std::string_view kind, std::string_view channel) override {
    if (kind != "subscribe") return false;
    auto sent = unanswered_.find(std::string(channel));
    if (sent == unanswered_.end()) return false;  // not ours (a connect command's)
    const std::string ch = sent->first;
    if (--sent->second == 0) unanswered_.erase(sent);
    if (channels_.count(ch) != 0) return false;
    // Answering a SUBSCRIBE that unsubscribe() followed: not listened to
    // once the UNSUBSCRIBE is read. Undone once more in case that was not
    // sent (before the link was up); a second one is harmless.
    if (wire_.can_write()) write(false, ch);
    return true;
  }

  void error(const StoreError& why) override {
    if (!on_refused_) return;
    StoreError refused = why;
    if (redis_acl_refusal(refused)) refused.message += " (sent: SUBSCRIBE or UNSUBSCRIBE)";
    guarded(kToStore, [&] { on_refused_(refused); });
  }

 private:
  void forget_unanswered() override { unanswered_.clear(); }
  Refused on_refused_;
  // SUBSCRIBEs written on the current link and not answered yet.
  std::unordered_map<std::string, std::uint32_t> unanswered_;
};

class ShardedSubscriptions final : public Subscriptions {
 public:
  ShardedSubscriptions(Wire& wire, Dropped on_dropped) : Subscriptions(wire), on_dropped_(std::move(on_dropped)) {}

  void write(bool subscribe, const std::string& channel) override {
    wire_.write({subscribe ? "SSUBSCRIBE" : "SUNSUBSCRIBE", channel});
    sent_.push_back(Sent{subscribe, channel});
  }

  bool handled(std::string_view kind, std::string_view channel) override {
    const bool sub = kind == "ssubscribe";
    if (!sub && kind != "sunsubscribe") return false;
    // The answer to our own command, if one for this channel is unanswered.
    auto sent = std::find_if(sent_.begin(), sent_.end(),
                             [&](const Sent& s) { return s.subscribe == sub && s.channel == channel; });
    const bool answer = sent != sent_.end();
    if (answer) sent_.erase(sent);
    auto wanted = channels_.find(std::string(channel));
    if (sub) {
      if (wanted != channels_.end()) return false;  // confirmed: reported
      // Unsubscribed meanwhile (the SUNSUBSCRIBE went before the node had
      // answered, or not at all): undo it so the node keeps nothing for us.
      if (wire_.can_write()) write(false, std::string(channel));
      return true;
    }
    if (answer || wanted == channels_.end()) return false;
    // Unsolicited: the node lost the channel's slot.
    const std::string ch = *wanted;
    channels_.erase(wanted);
    if (on_dropped_) guarded(kToStore, [&] { on_dropped_(ch, nullptr); });
    return true;
  }

  void error(const StoreError& why) override {
    // It answers the oldest SSUBSCRIBE or SUNSUBSCRIBE.
    if (sent_.empty()) return;
    Sent sent = std::move(sent_.front());
    sent_.pop_front();
    if (!sent.subscribe) return;
    auto wanted = channels_.find(sent.channel);
    if (wanted == channels_.end()) return;
    channels_.erase(wanted);
    if (on_dropped_) guarded(kToStore, [&] { on_dropped_(sent.channel, &why); });
  }

 private:
  struct Sent {
    bool subscribe;
    std::string channel;
  };
  void forget_unanswered() override { sent_.clear(); }
  Dropped on_dropped_;
  std::deque<Sent> sent_;  // written on the current link and not answered yet, in order
};

}  // namespace

std::unique_ptr<Subscriptions> Subscriptions::make(bool sharded, Wire& wire, Dropped on_dropped, Refused on_refused) {
  if (sharded) return std::make_unique<ShardedSubscriptions>(wire, std::move(on_dropped));
  return std::make_unique<ClassicSubscriptions>(wire, std::move(on_refused));
}

void Subscriptions::resubscribe() {
  forget_unanswered();
  for (const auto& ch : channels_) write(true, ch);
}

}  // namespace lockwatch::detail
