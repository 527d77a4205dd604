#include "store/sqlcommon/inspection.hpp"

#include <algorithm>
#include <utility>

#include "core/countdown.hpp"
#include "store/kind_rules.hpp"

namespace lockwatch::detail::sqlcommon {

HolderInfo holder(const Rows& rows, int row, int at) {
  HolderInfo h;
  h.token = rows.bytes(row, at);
  h.owner_name = rows.bytes(row, at + 1);
  if (rows.null(row, at + 2)) return h;
  h.since = from_micros(rows.micros(row, at + 2));
  h.held_for = std::chrono::milliseconds(std::max(0LL, to_ll(rows.at(row, at + 3)) / 1000));
  return h;
}

void Inspection::lock_answer(const Rows& rows, const StoreError* error) {
  if (error) return std::exchange(done_, {})(LockInfo{}, error);
  if (rows.size() != 1) return;
  const long long us_left = to_ll(rows.at(0, 0));
  std::string owner = rows.bytes(0, 2);
  info_.held = us_left > 0 && !owner.empty();
  info_.ttl = info_.held ? ms_up(us_left) : std::chrono::milliseconds(0);
  info_.fencing_token = static_cast<std::uint64_t>(to_ll(rows.at(0, 1)));
  if (!info_.held) return;
  info_.kind = kinds::kind_of_marker(owner);
  if (!info_.kind.exclusive_kind()) return;
  info_.holders.push_back(holder(rows, 0, 2));
  info_.owner = std::move(owner);
}

void Inspection::holders_answer(const Rows& rows, const StoreError* error) {
  if (!done_) return;  // the lock row's answer failed, and answered
  if (error) return done_(LockInfo{}, error);
  if (info_.held && !info_.kind.exclusive_kind())
    for (int r = 0; r < rows.size(); ++r) info_.holders.push_back(holder(rows, r, 0));
  // A fair lock's owner is its one holder's token (the row holds the marker).
  if (info_.kind.mode() == LockKind::Mode::kFair && !info_.holders.empty()) info_.owner = info_.holders.front().token;
  done_(info_, nullptr);
}

void read_claim(ClaimResult& out, const Rows& rows, int at, bool claimed, std::int64_t period) {
  out.store_time = from_micros(rows.micros(0, at));
  out.last = to_ll(rows.at(0, at + 3));  // NULL: none ever, 0
  if (claimed) {
    out.status = ClaimResult::Status::kClaimed;
    out.last = period;
  } else if (!rows.yes(0, at + 1)) {
    out.status = ClaimResult::Status::kNotLeader;
  } else if (!rows.null(0, at + 3) && out.last >= period) {
    out.status = ClaimResult::Status::kAlreadyRun;
  } else {
    out.status = ClaimResult::Status::kNotDue;
  }
}

void list_inspected(OperatorTools& tools, const Rows& rows, std::size_t key_prefix, LockListing::ListDone done) {
  std::vector<std::pair<std::string, LockInfo>> inspected;  // each name, with its answer
  for (int r = 0; r < rows.size(); ++r)
    if (std::string name; rows.read_bytes(r, 0, name)) inspected.emplace_back(std::move(name), LockInfo{});
  if (inspected.empty()) return done({}, nullptr);
  const std::size_t n = inspected.size();
  auto all = Countdown<StoreError, decltype(inspected)>::make(
      n, std::move(inspected), [key_prefix, done = std::move(done)](auto& c) {
        if (c.failure) return done({}, &*c.failure);
        std::vector<LockInfo> out;
        for (auto& [name, info] : c) {
          if (!info.held) continue;
          info.key = name.substr(std::min(key_prefix, name.size()));
          out.push_back(std::move(info));
        }
        done(std::move(out), nullptr);
      });
  for (auto& each : *all)
    tools.inspect(each.first, [all, &info = each.second](const LockInfo& answer, const StoreError* e) {
      info = answer;
      all->answered(e);
    });
}

}  // namespace lockwatch::detail::sqlcommon
