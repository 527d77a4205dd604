#include "store/quorum_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>

#include "core/timing.hpp"

namespace lockwatch::detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// One call's tally per lock of the batch, and its caller.
template <class Tally, class Done>
struct Batch {
  Batch(std::size_t locks, Done d) : tally(locks), done(std::move(d)) {}
  std::vector<Tally> tally;
  Done done;
};

// How many stores answered each status (of `N`) for one lock of a batch,
// and the reason kept for a failure.
template <class Status, std::size_t N>
struct Votes {
  std::array<std::uint16_t, N> by_status{};
  std::size_t replies = 0;
  bool decided = false;
  std::unique_ptr<StoreError> why;
  Votes& count(Status s) {
    ++replies;
    ++by_status[static_cast<std::size_t>(s)];
    return *this;
  }
  std::size_t operator[](Status s) const { return by_status[static_cast<std::size_t>(s)]; }
};

std::chrono::system_clock::time_point median(std::vector<std::chrono::system_clock::time_point> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A quorum's traits: the first store's key rules (they agree); release events
// and shared locks where every store has them (a reader's majority and a
// writer's share a store, which holds one or the other). No permits
// (3 stores, n = 2: holders on {1,2}, {2,3} and {1,3} leave 2 on each
// store) and no fair locks: the reasons are their messages.
StoreTraits member_traits(const std::vector<std::unique_ptr<LockStore>>& stores) {
  StoreTraits t;
  if (!stores.empty()) t.keys = stores.front()->traits().keys;
  t.release_events = std::all_of(stores.begin(), stores.end(), [](const auto& s) { return s->release_events(); });
  auto refusing = std::find_if(stores.begin(), stores.end(),
                               [](const auto& s) { return s->check_kind(LockKind::shared()) != nullptr; });
  t.no_shared = refusing == stores.end() ? nullptr : (*refusing)->check_kind(LockKind::shared());
  t.no_permits =
      "a quorum cannot bound a semaphore: each store counts its own holders, and majorities of different "
      "holders overlap, so more than n could hold";
  t.no_fair =
      "a quorum cannot keep one order of waiters: each store queues its own, and majorities of different "
      "queues could grant out of arrival order";
  return t;
}

}  // namespace

QuorumStore::QuorumStore(std::vector<std::unique_ptr<LockStore>> stores, std::vector<std::string> names,
                         const WatchdogOptions& watchdog)
    : StoreBase(member_traits(stores)),
      stores_(std::move(stores)),
      names_(std::move(names)),
      watchdog_(watchdog),
      quorum_(stores_.size() / 2 + 1) {
  // A majority must agree on each token it hands out, and every store must
  // answer the same questions: each member offers all three.
  for (std::size_t i = 0; i < stores_.size(); ++i) {
    require<FenceRaising>(*stores_[i], names_[i]);
    require<JobClaims>(*stores_[i], names_[i]);
    require<OperatorTools>(*stores_[i], names_[i]);
  }
  offer({.job_claims = this, .operator_tools = this, .lock_listing = this});
}

void QuorumStore::started() {
  // A release publishes on every store; any one notice wakes the waiter,
  // and a subscription on any store is enough to be told.
  for (auto& s : stores_) s->start(events_);
}

// ------------------------------------------------------------------ acquire

struct QuorumStore::AcquireBatch {
  struct Lock : OwnedLock {
    using OwnedLock::OwnedLock;
    std::size_t busy = 0;
    std::vector<std::size_t> took;  // stores that set our token
    std::uint64_t fence = 0;  // the highest counter of those that took it before a majority did
    milliseconds min_busy = milliseconds::max();  // the least a busy store answered
    std::vector<std::string> errors;  // one per store that failed
    // The most telling failure: one that is not kUnavailable once any was.
    std::unique_ptr<StoreError> telling;
    bool finished = false;  // the caller was answered, or is about to be
    std::size_t raise_asked = 0, raise_replies = 0, raise_ok = 0;
    // A majority took it (its counters are being raised), or it was given up.
    bool decided() const { return finished || raise_asked > 0; }
  };
  std::vector<Lock> locks;
  Clock::time_point sent;
  AcquireDone done;
};

void QuorumStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto b = std::make_shared<AcquireBatch>(AcquireBatch{{locks.begin(), locks.end()}, Clock::now(), std::move(done)});
  for (std::size_t i = 0; i < stores_.size(); ++i) {
    stores_[i]->acquire(locks, [this, b, i](std::size_t k, const Acquired& r) { on_acquire_vote(b, i, k, r); });
  }
}

void QuorumStore::on_acquire_vote(const std::shared_ptr<AcquireBatch>& b, std::size_t store, std::size_t k,
                                  const Acquired& r) {
  auto& t = b->locks[k];
  const std::size_t n = stores_.size();
  const bool took_here = r.status == Acquired::Status::kTaken;
  if (took_here) {
    t.took.push_back(store);
    if (!t.decided()) t.fence = std::max(t.fence, r.fence);
  } else if (r.status == Acquired::Status::kBusy) {
    t.busy++;
    t.min_busy = std::min(t.min_busy, r.busy_for);
  } else {
    t.errors.push_back(fmt::format("{}: {}", names_[store], r.error.describe()));
    keep_most_telling(t.telling, r.error);
  }
  if (t.decided()) {
    // Raising: a late taker is raised too (one more chance at a majority);
    // a late failure may make it hopeless.
    if (!t.finished && took_here) raise_on(b, k, store);
    return check_raised(b, k);
  }
  if (t.took.size() >= quorum_) {
    if (Clock::now() >= lease_deadline(watchdog_, b->sent, t.ttl))
      return give_back(b, k, Acquired::failed(StoreError::unavailable(
                                 names_[store], "a majority took the lock only after its validity time")));
    for (std::size_t s : std::vector<std::size_t>(t.took)) raise_on(b, k, s);
    return;
  }
  if (t.busy + t.errors.size() > n - quorum_) {
    // A majority is out of reach.
    Acquired out;
    if (t.busy > 0 && t.took.size() + t.busy >= quorum_) {
      out = Acquired::busy(t.min_busy);
    } else if (t.telling && !t.telling->unavailable()) {
      out.error = *t.telling;
    } else {
      out.error = StoreError::unavailable(
          t.errors.empty() ? names_[store] : fmt::format("{}", fmt::join(t.errors, "; ")),
          fmt::format("no majority: {} of {} nodes failed, {} busy", t.errors.size(), n, t.busy));
    }
    give_back(b, k, out);
  }
}

void QuorumStore::raise_on(const std::shared_ptr<AcquireBatch>& b, std::size_t k, std::size_t store) {
  auto& t = b->locks[k];
  t.raise_asked++;
  capability<FenceRaising>(*stores_[store])->raise_fence(t.name, t.fence, [this, b, k](bool ok) {
    auto& t = b->locks[k];
    t.raise_replies++;
    if (ok) t.raise_ok++;
    check_raised(b, k);
  });
}

// Taken once a majority's counters are raised to the token; hopeless once
// every store answered and too few raises succeeded.
void QuorumStore::check_raised(const std::shared_ptr<AcquireBatch>& b, std::size_t k) {
  auto& t = b->locks[k];
  const bool raised = t.raise_ok >= quorum_;
  // Every store answered the acquisition, and each raise asked of one answered.
  const bool all_heard = t.took.size() + t.busy + t.errors.size() == stores_.size() && t.raise_replies == t.raise_asked;
  if (t.finished || !(raised || all_heard)) return;
  // The validity time again: a raise that came back late must not hand
  // out a lease whose keys may have expired meanwhile, and whose token a
  // later majority may have handed out too (found by
  // model/redlock_fence.pml with two acquisitions overlapping).
  if (raised && Clock::now() < lease_deadline(watchdog_, b->sent, t.ttl)) {
    t.finished = true;
    return b->done(k, Acquired::taken(t.fence));
  }
  const char* why = raised ? "a majority raised its fencing counters only after the validity time"
                           : "could not raise a majority's fencing counters";
  give_back(b, k, Acquired::failed(StoreError::unavailable(names_[t.took.empty() ? 0 : t.took.front()], why)));
}

// A failed attempt gives back what it took, on every store (a late success
// is undone by the release queued behind it), before the caller hears.
void QuorumStore::give_back(const std::shared_ptr<AcquireBatch>& b, std::size_t k, Acquired out) {
  auto& t = b->locks[k];
  t.finished = true;  // no other path may answer meanwhile
  LockRef ref = t.ref();
  release(std::span<const LockRef>(&ref, 1), false,
          [b, k, out](std::size_t, Released, const StoreError*) { b->done(k, out); });
}

// -------------------------------------------------------------------- renew

std::size_t QuorumStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) {
  auto b = std::make_shared<Batch<Votes<Renewed, 4>, RenewDone>>(locks.size(), std::move(done));
  const std::size_t n = stores_.size();
  std::size_t commands = 0;
  for (std::size_t i = 0; i < n; ++i) {
    commands += stores_[i]->renew(locks, keepalive, [this, b, n](std::size_t k, Renewed v, const StoreError* why) {
      auto& t = b->tally[k];
      if (t.decided) return;
      // The first failure's reason (allocated only then).
      if (v == Renewed::kTransient && !t.why && why != nullptr) t.why = std::make_unique<StoreError>(*why);
      const std::size_t ok = t.count(v)[Renewed::kYes];
      const std::size_t no = t[Renewed::kGone] + t[Renewed::kTakenByOther];
      if (ok < quorum_ && no <= n - quorum_ && t.replies < n) return;  // not decided yet
      t.decided = true;
      if (ok >= quorum_) return b->done(k, Renewed::kYes, nullptr);
      if (no > n - quorum_)
        return b->done(k, t[Renewed::kTakenByOther] ? Renewed::kTakenByOther : Renewed::kGone, nullptr);
      b->done(k, Renewed::kTransient, t.why.get());
    });
  }
  return commands;
}

// ------------------------------------------------------------------ release

void QuorumStore::release(std::span<const LockRef> locks, bool notify, ReleaseDone done) {
  auto b = std::make_shared<Batch<Votes<Released, 5>, ReleaseDone>>(locks.size(), std::move(done));
  const std::size_t n = stores_.size();
  for (std::size_t i = 0; i < n; ++i) {
    stores_[i]->release(locks, notify, [this, b, n](std::size_t k, Released v, const StoreError* why) {
      auto& t = b->tally[k];
      if (v == Released::kUnconfirmed && why != nullptr) keep_most_telling(t.why, *why);
      if (t.count(v).replies < n) return;
      if (n - t[Released::kUnconfirmed] < quorum_) return b->done(k, Released::kUnconfirmed, t.why.get());
      // Unheard (its notice reached only our own subscription, or none) only
      // if no node's notice reached another: a waiter may listen on any of them.
      const std::size_t unheard = t[Released::kYesUnheard];
      if (t[Released::kYes] + unheard >= quorum_)
        return b->done(k, unheard == n ? Released::kYesUnheard : Released::kYes, nullptr);
      b->done(k, t[Released::kTakenByOther] ? Released::kTakenByOther : Released::kGone, nullptr);
    });
  }
}

// ------------------------------------------------------------ scheduled jobs

void QuorumStore::server_time(TimeDone done) {
  auto t = std::make_shared<Answers<std::chrono::system_clock::time_point, TimeDone>>(std::move(done));
  for (auto& s : stores_) {
    capability<JobClaims>(*s)->server_time([this, t](std::chrono::system_clock::time_point now, const StoreError* err) {
      if (!t->heard(err, stores_.size(), now)) return;
      if (t->values.size() >= quorum_) return t->done(median(t->values), nullptr);
      t->done({}, t->error.get());  // a store that did not answer failed, with an error
    });
  }
}

void QuorumStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                               std::chrono::system_clock::time_point start, ClaimDone done) {
  using S = ClaimResult::Status;
  // The answers' store times, their votes and the last period run any reported.
  struct Tally : Answers<std::chrono::system_clock::time_point, ClaimDone> {
    using Answers::Answers;
    Votes<S, 5> votes;
    std::int64_t last = 0;
  };
  auto t = std::make_shared<Tally>(std::move(done));
  for (auto& s : stores_) {
    capability<JobClaims>(*s)->claim_period(name, token, period, start, [this, t](const ClaimResult& r) {
      t->votes.count(r.status);
      if (r.status == S::kAlreadyRun) t->last = std::max(t->last, r.last);
      if (!t->heard(r.status == S::kFailed ? &r.error : nullptr, stores_.size(), r.store_time)) return;
      const std::size_t n = stores_.size();
      const auto& v = t->votes;
      ClaimResult out;
      if (!t->values.empty()) out.store_time = median(t->values);
      if (v[S::kClaimed] >= quorum_) {
        out.status = S::kClaimed;
      } else if (v[S::kNotLeader] > n - quorum_) {
        out.status = S::kNotLeader;
      } else if (v[S::kNotDue] > n - quorum_) {
        out.status = S::kNotDue;
      } else if (v[S::kAlreadyRun] > 0 && v[S::kClaimed] + v[S::kAlreadyRun] >= quorum_) {
        // Recorded on a majority (in this call or before): the period is
        // spent, whether or not some call of it reached a majority.
        out.status = S::kAlreadyRun;
        out.last = t->last;
      } else {
        out.status = S::kFailed;
        out.error = t->error ? *t->error
                             : StoreError::unavailable("quorum", "no majority agreed on the period claim");
      }
      t->done(out);
    });
  }
}

// ---------------------------------------------------------------- operators

// Held when a majority holds it for one owner: the ttl is the least of
// theirs, the holders those a majority records (a reader's share is on a
// majority of its own), each as the first store that answered records it
// (its grant time on that store's clock). The counter is the highest any
// store has. With it, the most stores that agree on one owner.
std::pair<LockInfo, std::size_t> QuorumStore::majority_view(const std::vector<LockInfo>& infos) const {
  LockInfo out;
  std::map<std::string, std::vector<const LockInfo*>> by_owner;
  std::size_t largest = 0;
  for (const auto& i : infos) {
    out.fencing_token = std::max(out.fencing_token, i.fencing_token);
    if (i.held) by_owner[i.owner].push_back(&i);
  }
  for (const auto& [owner, held] : by_owner) {
    largest = std::max(largest, held.size());
    if (held.size() < quorum_) continue;
    out.held = true;
    out.owner = owner;
    out.kind = held.front()->kind;
    out.key = held.front()->key;
    out.ttl = std::ranges::min(held, {}, &LockInfo::ttl)->ttl;
    // How many of them record each holder; each listed as the first records it.
    std::map<std::string_view, std::size_t> votes;
    for (const auto* i : held)
      for (const auto& h : i->holders) votes[h.token]++;
    for (const auto& h : held.front()->holders)
      if (votes[h.token] >= quorum_) out.holders.push_back(h);
  }
  return {std::move(out), largest};
}

void QuorumStore::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  auto t = std::make_shared<Answers<std::vector<LockInfo>, ListDone>>(std::move(done));
  // Each store lists in its own order: every one is asked for all it has
  // (up to the runtime's bound), so that a majority's locks meet here.
  constexpr std::size_t kEach = 10000;
  if (!std::all_of(stores_.begin(), stores_.end(), [](const auto& s) { return capability<LockListing>(*s); })) {
    const StoreError none = StoreError::invalid("quorum", "a store of the quorum cannot list its locks");
    return t->done({}, &none);
  }
  for (auto& s : stores_) {
    LockListing* listing = capability<LockListing>(*s);
    listing->list_locks(prefix, kEach, [this, t, limit](std::vector<LockInfo> locks, const StoreError* err) {
      if (!t->heard(err, stores_.size(), std::move(locks))) return;
      // A store that did not answer failed, with an error.
      if (t->values.size() < quorum_) return t->done({}, t->error.get());
      std::map<std::string, std::vector<LockInfo>> by_key;
      for (auto& each : t->values)
        for (auto& l : each) by_key[l.key].push_back(std::move(l));
      std::vector<LockInfo> out;
      for (const auto& [key, infos] : by_key) {
        if (out.size() >= limit) break;
        LockInfo view = majority_view(infos).first;
        if (view.held) out.push_back(std::move(view));
      }
      t->done(std::move(out), nullptr);
    });
  }
}

void QuorumStore::inspect(std::string_view name, InspectDone done) {
  auto t = std::make_shared<Answers<LockInfo, InspectDone>>(std::move(done));
  for (auto& s : stores_) {
    capability<OperatorTools>(*s)->inspect(name, [this, t](const LockInfo& info, const StoreError* err) {
      if (!t->heard(err, stores_.size(), info)) return;
      auto [out, largest] = majority_view(t->values);
      // Free only if the silent stores could not make a majority for
      // anyone with those that answered. Here some did not answer (had
      // all, a majority holds it or none can), each failing with an error.
      const std::size_t silent = stores_.size() - t->values.size();
      if (!out.held && (largest + silent >= quorum_ || t->values.size() < quorum_)) {
        const StoreError unknown = StoreError::unavailable(
            "quorum", fmt::format("cannot tell whether the lock is held: {} of {} nodes did not answer ({})", silent,
                                  stores_.size(), t->error->describe()));
        return t->done(LockInfo{}, &unknown);
      }
      t->done(out, nullptr);
    });
  }
}

void QuorumStore::force_release(std::string_view name, ForceDone done) {
  auto t = std::make_shared<Answers<bool, ForceDone>>(std::move(done));
  for (auto& s : stores_) {
    capability<OperatorTools>(*s)->force_release(name, [this, t](bool held, const StoreError* err) {
      if (!t->heard(err, stores_.size(), held)) return;
      t->done(std::ranges::count(t->values, true) > 0, t->values.size() >= quorum_ ? nullptr : t->error.get());
    });
  }
}

void QuorumStore::subscribe(std::string_view name) { for (auto& s : stores_) s->subscribe(name); }
void QuorumStore::unsubscribe(std::string_view name) { for (auto& s : stores_) s->unsubscribe(name); }
void QuorumStore::poll_replies() { for (auto& s : stores_) s->poll_replies(); }
void QuorumStore::close() { for (auto& s : stores_) s->close(); }

}  // namespace lockwatch::detail
