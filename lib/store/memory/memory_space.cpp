#include "store/memory/memory_space.hpp"

#include <algorithm>
#include <iterator>

#include "store/kind_rules.hpp"
#include "store/memory/memory_store.hpp"

namespace lockwatch::detail {

namespace {

using std::chrono::milliseconds;

// Names to the spaces that live. Never destroyed: a space may go after
// static destructors ran (a runtime in a static).
struct Registry {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<MemorySpace>, std::less<>> spaces;
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

}  // namespace

// ------------------------------------------------------------------- link

bool MemoryLink::post(Loop::Task task) {
  std::lock_guard lk(mu_);
  return store_ != nullptr && loop_.post(std::move(task));
}

void MemoryLink::close() {
  std::lock_guard lk(mu_);
  store_ = nullptr;
}

// ----------------------------------------------------------------- state

Acquired MemorySpace::State::acquire(const LockRef& lock, std::string_view owner_name) {
  auto now = Clock::now();
  Entry& e = entries_.try_emplace(std::string(lock.name)).first->second;
  e.purge(now);
  // Held (or waited for, fair) as another family of kinds.
  if ((!e.holders.empty() || !e.queue.empty()) && !kinds::same_family(e.kind, lock.kind))
    return Acquired::failed(StoreError::invalid("memory", kinds::refusal(lock.name, e.kind, lock.kind)));
  Acquired out;
  switch (lock.kind.mode()) {
    case LockKind::Mode::kShared: out = acquire_shared(e, lock, now); break;
    case LockKind::Mode::kPermits:
      if (e.mine(lock) == e.holders.end() && e.holders.size() >= lock.kind.permit_count())
        return Acquired::busy(e.next_expiry(now));
      out = e.grant(lock, now);
      break;
    case LockKind::Mode::kFair: out = acquire_fair(e, lock, now); break;
    case LockKind::Mode::kExclusive: out = acquire_exclusive(e, lock, now); break;
  }
  // A new grant records its owner and time; a retry keeps them.
  if (out.status != Acquired::Status::kTaken) return out;
  if (auto& h = e.holders.find(lock.token)->second; h.since == std::chrono::system_clock::time_point{}) {
    h.owner_name.assign(owner_name);
    h.since = std::chrono::system_clock::now();
  }
  return out;
}

Acquired MemorySpace::State::acquire_exclusive(Entry& e, const LockRef& lock, Clock::time_point now) {
  if (!e.holders.empty() && e.mine(lock) == e.holders.end()) {
    Acquired out = Acquired::busy(e.next_expiry(now));
    // Readers hold it: new readers wait behind this writer while it waits.
    if (e.kind.mode() == LockKind::Mode::kShared) {
      // The mark (kinds::kWriterMark) is kept while the writer tries again
      // within half of it (or at the last reader's release).
      const auto mark = std::min(lock.ttl, kinds::kWriterMark);
      e.writer_waits = now + mark;
      out.busy_for = std::min(out.busy_for, std::max(mark / 2, milliseconds(1)));
    }
    return out;
  }
  // A lock that holds the caller's token already is a retry after a lost
  // answer: the same acquisition, with the ttl set anew and the counter as
  // it stands (what the lost answer carried, unless raised since).
  e.writer_waits = Clock::time_point::min();
  return e.grant(lock, now);
}

Acquired MemorySpace::State::acquire_shared(Entry& e, const LockRef& lock, Clock::time_point now) {
  const bool writer = !e.holders.empty() && e.kind.exclusive_kind();
  if (writer || (e.mine(lock) == e.holders.end() && e.writer_waits > now))
    return Acquired::busy(writer ? e.next_expiry(now) : std::chrono::ceil<milliseconds>(e.writer_waits - now));
  e.hold(lock, now);
  return Acquired::taken(e.fence);  // the last writer's
}

// As on Redis: the caller's place in the queue is made or refreshed, and it
// is granted only when the lock is free and it is first. A waiter that is
// told busy tries again within a third of its ttl, which keeps its place.
Acquired MemorySpace::State::acquire_fair(Entry& e, const LockRef& lock, Clock::time_point now) {
  e.kind = lock.kind;
  const auto until = now + lock.ttl;
  if (e.mine(lock) != e.holders.end()) return e.grant(lock, now);  // a retry after a lost answer: the same grant
  auto place = std::ranges::find(e.queue, lock.token, &Entry::Waiter::token);
  if (place == e.queue.end()) {
    e.queue.push_back(Entry::Waiter{std::string(lock.token), until});
  } else {
    place->until = until;
  }
  if (e.holders.empty() && e.queue.front().token == lock.token) {
    e.queue.pop_front();
    return e.grant(lock, now);
  }
  const auto first_leaves = e.holders.empty() ? std::chrono::ceil<milliseconds>(e.queue.front().until - now)
                                              : e.next_expiry(now);
  return Acquired::busy(std::min(first_leaves, lock.ttl / 3));
}

MemorySpace::State::Entry* MemorySpace::State::find(std::string_view name, Clock::time_point now) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return nullptr;
  it->second.purge(now);
  return &it->second;
}

MemorySpace::State::Entry* MemorySpace::State::owned(std::string_view name, std::string_view token) {
  Entry* e = find(name, Clock::now());
  return e != nullptr && e->kind.exclusive_kind() && e->holders.contains(token) ? e : nullptr;
}

void MemorySpace::State::withdraw(const LockRef& lock) {
  auto it = entries_.find(lock.name);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  auto place = std::ranges::find(e.queue, lock.token, &Entry::Waiter::token);
  if (place == e.queue.end()) return;
  const bool was_first = place == e.queue.begin();
  e.queue.erase(place);
  e.purge(Clock::now());
  // The new first would otherwise learn it only at its next attempt.
  if (was_first && e.holders.empty() && !e.queue.empty()) notify(lock.name);
}

Renewed MemorySpace::State::renew(const LockRef& lock) {
  const auto now = Clock::now();
  Entry* e = find(lock.name, now);
  if (e == nullptr || e->holders.empty()) return Renewed::kGone;
  auto mine = e->mine(lock);
  if (mine != e->holders.end()) {
    mine->second.until = now + lock.ttl;
    return Renewed::kYes;
  }
  // An exclusive lock held by another; the other kinds' leases run out forgotten.
  return lock.kind.exclusive_kind() && e->kind.exclusive_kind() ? Renewed::kTakenByOther : Renewed::kGone;
}

Released MemorySpace::State::release(const LockRef& lock, bool notify_waiters, const MemoryLink* self) {
  Entry* e = find(lock.name, Clock::now());
  if (e == nullptr || e->holders.empty()) return Released::kGone;
  auto mine = e->mine(lock);
  if (mine == e->holders.end())
    return lock.kind.exclusive_kind() && e->kind.exclusive_kind() ? Released::kTakenByOther : Released::kGone;
  e->holders.erase(mine);
  if (lock.kind.exclusive_kind())
    return notify_waiters && notify(lock.name, self) ? Released::kYes : Released::kYesUnheard;
  // A semaphore's waiter may take the permit; a writer waits for the last reader.
  if (notify_waiters && (lock.kind.mode() == LockKind::Mode::kPermits || e->holders.empty())) notify(lock.name);
  return Released::kYes;
}

void MemorySpace::State::raise_fence(std::string_view name, std::uint64_t fence) {
  Entry& e = entries_[std::string(name)];
  e.fence = std::max(e.fence, fence);
}

std::uint64_t MemorySpace::State::reserve_tokens(const LockRef& lock, std::uint32_t n) {
  Entry* e = owned(lock.name, lock.token);
  return e == nullptr ? 0 : (e->fence += n);
}

// As the stores on servers: the lease check, the clock and the
// at-most-once record in one step.
ClaimResult MemorySpace::State::claim(std::string_view name, std::string_view token, std::int64_t period,
                                      std::chrono::system_clock::time_point start) {
  ClaimResult out;
  out.store_time = std::chrono::system_clock::now();
  Entry* e = owned(name, token);
  if (e == nullptr) {
    out.status = ClaimResult::Status::kNotLeader;
  } else if (out.store_time < start) {
    out.status = ClaimResult::Status::kNotDue;
  } else if (e->last_period && *e->last_period >= period) {
    out.status = ClaimResult::Status::kAlreadyRun;
    out.last = *e->last_period;
  } else {
    e->last_period = period;
    out.status = ClaimResult::Status::kClaimed;
    out.last = period;
  }
  return out;
}

LockInfo MemorySpace::State::inspect(std::string_view name) const {
  LockInfo info;
  auto it = entries_.find(name);
  if (it == entries_.end()) return info;
  const Entry& e = it->second;
  const auto now = Clock::now();
  const auto wall = std::chrono::system_clock::now();
  info.fencing_token = e.fence;
  // Held until the last holder's ttl runs out.
  for (const auto& [token, held] : e.holders) {
    if (held.until <= now) continue;
    info.held = true;
    info.ttl = std::max(info.ttl, std::chrono::duration_cast<milliseconds>(held.until - now));
    HolderInfo& h = info.holders.emplace_back(HolderInfo{token, held.owner_name, held.since});
    if (h.since != std::chrono::system_clock::time_point{})
      h.held_for = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(wall - h.since));
  }
  if (!info.held) return info;
  info.kind = e.kind;
  if (e.kind.single_holder()) info.owner = info.holders.front().token;
  return info;
}

std::vector<LockInfo> MemorySpace::State::list(std::string_view name_prefix, std::size_t key_from,
                                               std::size_t limit) const {
  std::vector<LockInfo> out;
  for (auto it = entries_.lower_bound(name_prefix); it != entries_.end() && out.size() < limit; ++it) {
    if (it->first.compare(0, name_prefix.size(), name_prefix) != 0) break;
    if (LockInfo info = inspect(it->first); info.held) {
      info.key = it->first.substr(key_from);
      out.push_back(std::move(info));
    }
  }
  return out;
}

bool MemorySpace::State::force_release(std::string_view name) {
  Entry* e = find(name, Clock::now());
  const bool was_held = e != nullptr && !e->holders.empty();
  if (e != nullptr) e->holders.clear();
  notify(name);
  return was_held;
}

bool MemorySpace::State::notify(std::string_view name, const MemoryLink* self) {
  auto it = subscribers_.find(name);
  if (it == subscribers_.end()) return false;
  bool others = false;
  for (const auto& link : it->second) {
    others = others || link.get() != self;
    link->post([link, n = std::string(name)] {
      if (MemoryStore* store = link->store()) store->notice(n);
    });
  }
  return others;
}

// ----------------------------------------------------------------- space

std::shared_ptr<MemorySpace> MemorySpace::open(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  auto& slot = r.spaces[name];
  if (auto live = slot.lock()) return live;
  // The deleter forgets the name, unless a new space took it meanwhile.
  std::shared_ptr<MemorySpace> space(new MemorySpace(name), [](MemorySpace* s) {
    const std::unique_ptr<MemorySpace> gone(s);  // deleted once the registry's lock is let go
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    auto it = r.spaces.find(s->name());
    if (it != r.spaces.end() && it->second.expired()) r.spaces.erase(it);
  });
  slot = space;
  return space;
}

std::shared_ptr<MemorySpace> MemorySpace::find(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  auto it = r.spaces.find(name);
  return it == r.spaces.end() ? nullptr : it->second.lock();
}

bool MemorySpace::run(const std::shared_ptr<MemoryLink>& from, Op op) {
  std::lock_guard lk(mu_);
  if (paused_) {
    held_.emplace_back(from, std::move(op));
    return false;
  }
  op(state_);
  return true;
}

void MemorySpace::subscribe(const std::shared_ptr<MemoryLink>& link, std::string_view name) {
  std::lock_guard lk(mu_);
  state_.subscribers_[std::string(name)].insert(link);
}

void MemorySpace::unsubscribe(const std::shared_ptr<MemoryLink>& link, std::string_view name) {
  std::lock_guard lk(mu_);
  auto it = state_.subscribers_.find(name);
  if (it == state_.subscribers_.end()) return;
  it->second.erase(link);
  if (it->second.empty()) state_.subscribers_.erase(it);
}

void MemorySpace::detach(const std::shared_ptr<MemoryLink>& link) {
  std::deque<std::pair<std::shared_ptr<MemoryLink>, Op>> dropped;  // destroyed outside the lock
  std::lock_guard lk(mu_);
  for (auto it = state_.subscribers_.begin(); it != state_.subscribers_.end();) {
    it->second.erase(link);
    it = it->second.empty() ? state_.subscribers_.erase(it) : std::next(it);
  }
  auto gone = std::stable_partition(held_.begin(), held_.end(), [&](const auto& h) { return h.first != link; });
  std::move(gone, held_.end(), std::back_inserter(dropped));
  held_.erase(gone, held_.end());
}

void MemorySpace::steal(std::string_view name, std::string_view owner, milliseconds ttl) {
  std::lock_guard lk(mu_);
  State::Entry& e = state_.entries_[std::string(name)];
  e.holders.clear();
  e.holders[std::string(owner)].until = Clock::now() + ttl;
  e.kind = LockKind::exclusive();
}

std::size_t MemorySpace::fair_waiters(std::string_view name) const {
  std::lock_guard lk(mu_);
  auto it = state_.entries_.find(name);
  if (it == state_.entries_.end()) return 0;
  const auto now = Clock::now();
  return static_cast<std::size_t>(std::count_if(it->second.queue.begin(), it->second.queue.end(),
                                                [now](const State::Entry::Waiter& w) { return w.until > now; }));
}

std::optional<std::int64_t> MemorySpace::last_period(std::string_view name) const {
  std::lock_guard lk(mu_);
  auto it = state_.entries_.find(name);
  return it == state_.entries_.end() ? std::nullopt : it->second.last_period;
}

void MemorySpace::clear() {
  std::lock_guard lk(mu_);
  state_.entries_.clear();
}

void MemorySpace::pause() {
  std::lock_guard lk(mu_);
  paused_ = true;
}

void MemorySpace::resume() {
  std::lock_guard lk(mu_);
  paused_ = false;
  for (auto& [link, op] : held_) op(state_);
  held_.clear();
}

}  // namespace lockwatch::detail
