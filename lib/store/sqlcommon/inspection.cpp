#include "store/sqlcommon/inspection.hpp"

#include <algorithm>

#include "store/kind_rules.hpp"

namespace lockwatch::detail::sqlcommon {

HolderInfo holder(std::string token, std::string owner_name, std::optional<long long> since_us, long long held_us) {
  HolderInfo h;
  h.token = std::move(token);
  h.owner_name = std::move(owner_name);
  if (!since_us) return h;
  h.since = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(*since_us)));
  h.held_for = std::chrono::milliseconds(std::max(0LL, held_us / 1000));
  return h;
}

void Inspection::lock_row(long long us_left, std::uint64_t fence, std::string owner, HolderInfo exclusive_holder) {
  info_.held = us_left > 0 && !owner.empty();
  info_.ttl = info_.held ? ms_up(us_left) : std::chrono::milliseconds(0);
  info_.fencing_token = fence;
  if (!info_.held) return;
  info_.kind = kinds::kind_of_marker(owner);
  if (!info_.kind.exclusive_kind()) return;
  info_.holders.push_back(std::move(exclusive_holder));
  info_.owner = std::move(owner);
}

void Inspection::finish() {
  if (failed_) return;
  // A fair lock's owner is its one holder's token (the row holds the marker).
  if (info_.kind.mode() == LockKind::Mode::kFair && !info_.holders.empty()) info_.owner = info_.holders.front().token;
  done_(info_, nullptr);
}

void Inspection::fail(const StoreError* error) {
  if (failed_) return;
  failed_ = true;
  done_(LockInfo{}, error);
}

namespace {

struct Listing {
  std::vector<std::string> names;
  std::vector<LockInfo> infos;
  std::size_t key_prefix = 0;
  std::size_t answered = 0;
  std::optional<StoreError> error;
  LockListing::ListDone done;

  void finish() {
    if (error) return done({}, &*error);
    std::vector<LockInfo> out;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (!infos[i].held) continue;
      infos[i].key = names[i].substr(std::min(key_prefix, names[i].size()));
      out.push_back(std::move(infos[i]));
    }
    done(std::move(out), nullptr);
  }
};

}  // namespace

void list_inspected(OperatorTools& tools, std::vector<std::string> names, std::size_t key_prefix,
                    LockListing::ListDone done) {
  auto listing = std::make_shared<Listing>();
  listing->names = std::move(names);
  listing->infos.resize(listing->names.size());
  listing->key_prefix = key_prefix;
  listing->done = std::move(done);
  if (listing->names.empty()) return listing->finish();
  for (std::size_t i = 0; i < listing->names.size(); ++i)
    tools.inspect(listing->names[i], [listing, i](const LockInfo& info, const StoreError* e) {
      if (e && !listing->error) listing->error = *e;
      listing->infos[i] = info;
      if (++listing->answered == listing->names.size()) listing->finish();
    });
}

}  // namespace lockwatch::detail::sqlcommon
