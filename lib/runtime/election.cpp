// Leader election on the runtime's exclusive lock (lockwatch/election.hpp).
//
// A campaign is one Runtime::acquire with a handler that waits as long as
// the runtime allows (max_wait), and starts again if that runs out. The
// won lock's handle is the leadership; its lease's end (lost, or released
// by resign()) fires the Leadership's stop source. Who leads is read with
// the operators' inspect (the holder's owner token and the key's fencing
// counter). on_change runs a thread that reads it at once when this
// Election wins, resigns or loses, on each release notice for the key
// (detail::RuntimeImpl::observe_releases), then soon again while nobody leads
// (10 ms, doubling: the next leader is usually a waiter woken by the same
// notice), just after the leader's lease would end unrenewed (a leader
// that died publishes nothing), and at the latest every ttl (1 s at most);
// on a store without notices, every ttl/4 (10 ms .. 1 s).
#include "lockwatch/election.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/lease_record.hpp"
#include "runtime/runtime_impl.hpp"

namespace lockwatch {

using std::chrono::milliseconds;

struct Leadership::State {
  std::uint64_t term = 0;
  std::string identity;
  std::stop_source stop;
  // The lease's state, kept so that lease() stays valid after the release.
  std::shared_ptr<detail::HandleState> kept;
  const Lease* lease = nullptr;
  LockHandle handle;  // guarded by the Election's mutex; empty once given up
};

struct Election::State : std::enable_shared_from_this<Election::State> {
  using Handler = std::function<void(const std::optional<LeaderInfo>&)>;
  // How a campaign ends, once: a promise's setter or the caller's handler.
  using Finish = std::function<void(std::exception_ptr, Leadership)>;
  State(Runtime& rt, std::string n, milliseconds t) : runtime(rt), name(std::move(n)), ttl(t) {}

  Runtime& runtime;
  const std::string name;
  const milliseconds ttl;

  std::mutex mu;
  bool campaigning = false;            // guarded by mu
  AcquireTicket ticket;                // guarded by mu: the campaign's acquisition
  std::shared_ptr<Leadership::State> leading;  // guarded by mu
  // The leader last seen in the store and the term first reported for it
  // (see the header: a store's counter may be above the term).
  std::string seen_owner;              // guarded by mu
  std::uint64_t seen_term = 0;         // guarded by mu

  // on_change.
  std::vector<Handler> handlers;       // guarded by mu
  bool poked = false;                  // guarded by mu
  std::condition_variable_any wake;
  bool closing = false;                // guarded by mu: the Election is being destroyed
  std::jthread watcher;                // guarded by mu; started by the first on_change
  // The watcher's observer of the key's release notices (0: none), given
  // up by the Election's destructor: the watcher, once stopped, never
  // touches the runtime (an Election destroyed by its own handler leaves
  // it running on, detached, while the runtime may go).
  std::uint64_t observer = 0;          // guarded by mu

  void start_campaign(std::shared_ptr<Finish> finish);
  void campaign_done(const std::shared_ptr<Finish>& finish, std::exception_ptr error, LockHandle handle);
  void begin(Finish finish);
  // Gives up the campaign or the leadership; the lock's handle, if any, to release.
  LockHandle give_up();
  void ended(const std::shared_ptr<Leadership::State>& l);
  void poke();
  // Who leads now; `left`, if given, gets what its lease has left.
  std::optional<LeaderInfo> read(milliseconds* left = nullptr);
  void watch(std::stop_token stop);
};

void Election::State::poke() {
  {
    std::lock_guard lk(mu);
    poked = true;
  }
  wake.notify_all();
}

void Election::State::start_campaign(std::shared_ptr<Finish> finish) {
  std::weak_ptr<State> weak = weak_from_this();
  // Called with mu held: the handler never runs inside acquire().
  // Never handed on in-process: a leader is named by its own owner token.
  detail::LockSpec spec;
  spec.key = name;
  spec.ttl = ttl;
  spec.retries = -1;
  spec.wait = max_wait;
  spec.handoff = false;
  ticket = detail::RuntimeAccess::impl(runtime).acquire(std::move(spec), [weak, finish](std::exception_ptr error, LockHandle h) {
    if (auto self = weak.lock()) {
      self->campaign_done(finish, std::move(error), std::move(h));
      return;
    }
    // The Election is gone: the handle, dropped, releases the lock.
    (*finish)(error ? error : std::make_exception_ptr(Cancelled(h ? h.lease().key() : std::string())), Leadership());
  });
}

void Election::State::campaign_done(const std::shared_ptr<Finish>& finish, std::exception_ptr error,
                                    LockHandle handle) {
  if (error) {
    bool again = false;
    try {
      std::rethrow_exception(error);
    } catch (const LockNotAcquired&) {
      again = true;  // max_wait ran out: a campaign waits as long as it takes
    } catch (...) {
    }
    std::unique_lock lk(mu);
    if (again && campaigning) {
      try {
        start_campaign(finish);
        return;
      } catch (...) {
        error = std::current_exception();
      }
    }
    campaigning = false;
    lk.unlock();
    (*finish)(error, Leadership());
    return;
  }
  auto l = std::make_shared<Leadership::State>();
  l->term = handle.lease().fencing_token();
  auto& impl = detail::RuntimeAccess::impl(runtime);
  l->identity = impl.owner_token(handle.lease());
  l->kept = detail::HandleAccess::state(handle);
  l->lease = &handle.lease();
  {
    std::unique_lock lk(mu);
    if (!campaigning) {
      // resign() came first: the lock goes back (the handle's destructor).
      lk.unlock();
      (*finish)(std::make_exception_ptr(Cancelled(name)), Leadership());
      return;
    }
    campaigning = false;
    leading = l;
    l->handle = std::move(handle);
    seen_owner = l->identity;
    seen_term = l->term;
  }
  std::weak_ptr<State> weak = weak_from_this();
  std::weak_ptr<Leadership::State> weak_l = l;
  l->lease->on_lost([weak, weak_l](std::optional<LostReason>) {
    auto l = weak_l.lock();
    if (!l) return;
    l->stop.request_stop();
    if (auto self = weak.lock()) self->ended(l);
  });
  (*finish)(nullptr, Leadership(l));
  poke();
}

void Election::State::ended(const std::shared_ptr<Leadership::State>& l) {
  LockHandle dropped;  // released outside the mutex
  {
    std::lock_guard lk(mu);
    if (leading == l) {
      leading.reset();
      dropped = std::move(l->handle);
    }
  }
  poke();
}

std::optional<LeaderInfo> Election::State::read(milliseconds* left) {
  auto f = detail::RuntimeAccess::impl(runtime).inspect_info(name);
  const detail::LockInfo info = f.get();
  std::lock_guard lk(mu);
  if (!info.held || info.owner.empty()) return std::nullopt;
  if (left != nullptr) *left = info.ttl;
  const std::string owner = info.holders.empty() ? std::string() : info.holders.front().owner_name;
  if (leading && leading->identity == info.owner) return LeaderInfo{info.owner, leading->term, owner};
  if (info.owner != seen_owner) {
    // A leader first seen: the counter now is its term or above it, and
    // below the next leader's; never below a term reported before.
    seen_term = std::max(info.fencing_token, seen_term + 1);
    seen_owner = info.owner;
  }
  return LeaderInfo{info.owner, seen_term, owner};
}

void Election::State::watch(std::stop_token stop) {
  auto& impl = detail::RuntimeAccess::impl(runtime);
  std::uint64_t observing = 0;
  try {
    observing = impl.observe_releases(name, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->poke();
    });
  } catch (...) {
    // The runtime stops: reads fail from now on, and the thread waits to be stopped.
  }
  {
    std::lock_guard lk(mu);
    observer = observing;
  }
  const milliseconds every = std::clamp(observing != 0 ? ttl : ttl / 4, milliseconds(10), milliseconds(1000));
  constexpr milliseconds kSoon{10};
  milliseconds soon{0};  // after a wake-up while nobody leads: the next read's delay (0: none due)
  std::optional<std::optional<LeaderInfo>> last;  // nothing reported yet
  std::size_t told = 0;  // handlers that heard `last`
  while (!stop.stop_requested()) {
    std::optional<LeaderInfo> now;
    milliseconds left{0};
    bool known = true;
    try {
      now = read(&left);
    } catch (...) {
      known = false;  // the store did not answer: nothing changed that we know of
    }
    if (known) {
      // Everyone hears a change; a handler attached since the last report
      // hears the current view.
      const bool changed = !last || *last != now;
      last = now;
      std::vector<Handler> hs;
      {
        std::lock_guard lk(mu);
        hs.assign(handlers.begin() + static_cast<std::ptrdiff_t>(changed ? 0 : told), handlers.end());
        told = handlers.size();
      }
      for (auto& h : hs) {
        try {
          h(now);
        } catch (...) {
        }
      }
    }
    milliseconds next = every;
    if (known && now) {
      if (left.count() > 0) next = std::min(next, left + kSoon);  // just after its lease would end unrenewed
      soon = milliseconds(0);
    } else if (known && soon.count() != 0) {
      next = std::min(next, soon);
      soon = std::min(soon * 2, every);
    }
    // Stopped (the Election is being destroyed, maybe by that handler):
    // the runtime is not ours to touch any more.
    if (stop.stop_requested()) break;
    impl.keep_observing(observing);
    std::unique_lock lk(mu);
    if (wake.wait_for(lk, stop, next, [this] { return poked; })) soon = kSoon;
    poked = false;
  }
}

// ------------------------------------------------------------- Leadership

std::uint64_t Leadership::term() const noexcept { return state_->term; }
std::stop_token Leadership::stop_token() const noexcept { return state_->stop.get_token(); }
const std::string& Leadership::identity() const noexcept { return state_->identity; }
const Lease& Leadership::lease() const noexcept { return *state_->lease; }

// --------------------------------------------------------------- Election

Election::Election(Runtime& runtime, std::string name, milliseconds ttl)
    : state_(std::make_shared<State>(runtime, std::move(name), ttl)) {
  if (state_->name.empty()) throw InvalidArgument("an election's name is its lock's key: it must not be empty");
  if (ttl <= milliseconds(0) || ttl > max_ttl)
    throw InvalidArgument(fmt::format("ttl must be 1 .. {} ms (7 days), got {} ms", max_ttl.count(), ttl.count()));
}

Election::~Election() {
  std::jthread watcher;
  {
    std::lock_guard lk(state_->mu);
    state_->closing = true;
    watcher = std::move(state_->watcher);
  }
  try {
    (void)resign();
  } catch (...) {
  }
  if (watcher.joinable()) {
    watcher.request_stop();  // wakes it (its wait takes the stop token)
    // From one of its own handlers the thread cannot wait for itself: it
    // ends on its own once the handler returns, on the state it keeps.
    if (watcher.get_id() == std::this_thread::get_id())
      watcher.detach();
    else
      watcher.join();
  }
  std::uint64_t observer;
  {
    std::lock_guard lk(state_->mu);
    observer = std::exchange(state_->observer, 0);
  }
  detail::RuntimeAccess::impl(state_->runtime).unobserve_releases(observer);
}

void Election::State::begin(Finish finish) {
  std::lock_guard lk(mu);
  if (campaigning || leading) throw InvalidArgument("this Election campaigns or leads already: resign() first");
  start_campaign(std::make_shared<Finish>(std::move(finish)));  // throws before anything started
  campaigning = true;
}

std::future<Leadership> Election::campaign() {
  auto promise = std::make_shared<std::promise<Leadership>>();
  auto future = promise->get_future();
  state_->begin([promise](std::exception_ptr error, Leadership won) {
    if (error)
      promise->set_exception(error);
    else
      promise->set_value(std::move(won));
  });
  return future;
}

void Election::campaign(std::function<void(std::error_code, Leadership)> handler) {
  if (!handler) throw InvalidArgument("Election::campaign: the handler is empty");
  // Runs where the acquisition's handler does: the notifier.
  state_->begin([h = std::move(handler)](std::exception_ptr e, Leadership l) { h(detail::code_of(e), std::move(l)); });
}

LockHandle Election::State::give_up() {
  AcquireTicket cancelled;
  std::shared_ptr<Leadership::State> l;
  LockHandle handle;
  {
    std::lock_guard lk(mu);
    if (campaigning) {
      campaigning = false;
      cancelled = ticket;
    }
    l = std::move(leading);
    leading.reset();
    if (l) handle = std::move(l->handle);
  }
  // A grant racing the cancel sees the campaign given up and gives the lock back.
  if (cancelled) (void)cancelled.cancel();
  if (l) l->stop.request_stop();
  poke();
  return handle;
}

std::future<void> Election::resign() {
  LockHandle handle = state_->give_up();
  if (handle) {
    try {
      return handle.release();
    } catch (...) {
    }
  }
  std::promise<void> none;
  none.set_value();
  return none.get_future();
}

void Election::resign(std::function<void(std::error_code)> handler) {
  if (!handler) throw InvalidArgument("Election::resign: the handler is empty");
  LockHandle handle = state_->give_up();
  if (handle) {
    handle.release(std::move(handler));
    return;
  }
  // Nothing to give up: the handler still runs on the notifier, not here.
  auto& impl = detail::RuntimeAccess::impl(state_->runtime);
  detail::post_completion(impl.notifier(), [h = std::move(handler)]() mutable { h({}); });
}

std::optional<LeaderInfo> Election::leader() { return state_->read(); }

void Election::on_change(std::function<void(const std::optional<LeaderInfo>&)> handler) {
  {
    std::lock_guard lk(state_->mu);
    state_->handlers.push_back(std::move(handler));
    state_->poked = true;  // a new handler hears the current view at once
    // Started under the mutex, which its first read takes: no handler runs
    // (and none can destroy the Election) before it is in place. The thread
    // keeps the state, so one destroyed by its own handler ends cleanly.
    if (!state_->watcher.joinable() && !state_->closing)
      state_->watcher = std::jthread([s = state_](std::stop_token stop) { s->watch(stop); });
  }
  state_->wake.notify_all();
}

}  // namespace lockwatch
