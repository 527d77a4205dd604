#include "store/redis/subscriptions.hpp"

#include <algorithm>
#include <utility>

#include "core/guarded.hpp"
#include "store/redis/connection.hpp"
#include "store/redis/redis_error.hpp"

namespace lockwatch::detail {

// Told to the store through guarded(): nothing may unwind into the
// connection's read.
constexpr const char* kToStore = "a subscription callback";

void Subscriptions::write(bool subscribe, const std::string& channel) {
  static constexpr std::string_view kCommand[2][2] = {{"UNSUBSCRIBE", "SUBSCRIBE"}, {"SUNSUBSCRIBE", "SSUBSCRIBE"}};
  wire_.write({kCommand[sharded_][subscribe], channel});
  if (subscribe || sharded_) sent_.push_back(Sent{subscribe, channel});
}

bool Subscriptions::handled(std::string_view kind, std::string_view channel) {
  const bool sub = kind == (sharded_ ? "ssubscribe" : "subscribe");
  if (!sub && (!sharded_ || kind != "sunsubscribe")) return false;
  // The answer to our own command, if one for this channel is unanswered.
  auto sent = std::find_if(sent_.begin(), sent_.end(),
                           [&](const Sent& s) { return s.subscribe == sub && s.channel == channel; });
  const bool answer = sent != sent_.end();
  if (answer)
    sent_.erase(sent);
  else if (!sharded_)
    return false;  // not ours (a connect command's)
  auto wanted = channels_.find(std::string(channel));
  if (sub) {
    if (wanted != channels_.end()) return false;  // confirmed: reported
    // Unsubscribed meanwhile (the unsubscribe went before the node had
    // answered, or not at all): undo it so the node keeps nothing for us.
    // A second one is harmless.
    if (wire_.can_write()) write(false, std::string(channel));
    return true;
  }
  if (answer || wanted == channels_.end()) return false;
  // Unsolicited: the node lost the channel's slot.
  channels_.erase(wanted);
  if (wire_.hooks_.on_dropped) guarded(kToStore, [&] { wire_.hooks_.on_dropped(channel, nullptr); });
  return true;
}

void Subscriptions::error(const StoreError& why) {
  if (!sharded_) {
    if (!wire_.hooks_.on_refused) return;
    StoreError refused = why;
    if (redis_acl_refusal(refused)) refused.message += " (sent: SUBSCRIBE or UNSUBSCRIBE)";
    guarded(kToStore, [&] { wire_.hooks_.on_refused(refused); });
    return;
  }
  // It answers the oldest SSUBSCRIBE or SUNSUBSCRIBE.
  if (sent_.empty()) return;
  Sent sent = std::move(sent_.front());
  sent_.pop_front();
  if (!sent.subscribe || channels_.erase(sent.channel) == 0) return;
  if (wire_.hooks_.on_dropped) guarded(kToStore, [&] { wire_.hooks_.on_dropped(sent.channel, &why); });
}

void Subscriptions::resubscribe() {
  sent_.clear();
  for (const auto& ch : channels_) write(true, ch);
}

}  // namespace lockwatch::detail
