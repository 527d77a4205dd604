#include "store/memory/memory_store.hpp"

#include "core/option_checks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/loop.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

std::string MemoryStore::space_name(const std::string& url) {
  if (url.compare(0, kScheme.size(), kScheme) != 0)
    throw InvalidArgument(fmt::format("malformed URL '{}': expected memory://[name]", url));
  return url.substr(kScheme.size());
}

MemoryStore::MemoryStore(Loop& loop, std::shared_ptr<MemorySpace> space, const Options& options)
    : FullStore(KeyRules{options.runtime.key_prefix}),
      loop_(loop),
      space_(std::move(space)),
      link_(std::make_shared<MemoryLink>(loop, this)),
      command_timeout_(options.connection.command_timeout),
      owner_name_(owner_name(options)) {}

MemoryStore::~MemoryStore() {
  // close() did this already, unless the store never ran.
  space_->detach(link_);
  link_->close();
}

StoreError MemoryStore::no_answer() const {
  return StoreError::unavailable(
      std::string(kScheme) + space_->name(),
      fmt::format("no answer within the command timeout ({} ms): the space is paused", command_timeout_.count()));
}

void MemoryStore::submit(std::function<std::function<void()>(MemorySpace::State&)> op, std::function<void()> fail) {
  auto req = std::make_shared<Request>();
  bool ran = space_->run(link_, [req, link = link_, op = std::move(op)](MemorySpace::State& state) {
    // Posted even when run inside this call: an answer never runs inside it.
    link->post([req, answer = op(state)] {
      if (!std::exchange(req->done, true)) answer();
    });
  });
  if (ran) return;
  req->sent = Clock::now();
  req->fail = std::move(fail);
  held_.push_back(std::move(req));
  timer_.start();  // once, on the loop thread
  timer_.watch();
}

RequestTimer::Clock::time_point MemoryStore::unanswered_since() const {
  const auto r = std::find_if(held_.begin(), held_.end(), [](const auto& r) { return !r->done; });
  return r == held_.end() ? RequestTimer::kNone : (*r)->sent;
}

void MemoryStore::overdue() {
  const auto now = Clock::now();
  std::vector<std::shared_ptr<Request>> expired;
  while (!held_.empty() && (held_.front()->done || now - held_.front()->sent >= command_timeout_)) {
    if (!std::exchange(held_.front()->done, true)) expired.push_back(held_.front());
    held_.pop_front();
  }
  // The failures may send new requests: the queue is consistent first.
  for (auto& r : expired) r->fail();
}

template <class Result, class Done, class Locks, class Step>
void MemoryStore::batch(std::shared_ptr<Locks> locks, Done done, Step step, Result failed,
                        std::shared_ptr<const void> keep) {
  auto d = std::make_shared<Done>(std::move(done));
  const std::size_t n = locks->size();
  submit(
      [locks = std::move(locks), d, step, keep = std::move(keep)](MemorySpace::State& s) mutable
          -> std::function<void()> {
        std::vector<Result> out;
        out.reserve(locks->size());
        for (const auto& l : *locks) out.push_back(step(s, l));
        // A renewal's leases (`keep`) go with the answer, and so are let go on the loop.
        return [out = std::move(out), d, keep = std::move(keep)] {
          for (std::size_t k = 0; k < out.size(); ++k) (*d)(k, out[k], nullptr);
        };
      },
      [d, n, failed = std::move(failed), err = no_answer()] {
        for (std::size_t k = 0; k < n; ++k) (*d)(k, failed, &err);
      });
}

template <class Done, class Step>
void MemoryStore::single(Done done, Step step) {
  auto d = std::make_shared<Done>(std::move(done));
  submit(
      [d, step = std::move(step)](MemorySpace::State& s) -> std::function<void()> {
        return [v = step(s), d]() mutable { (*d)(std::move(v), nullptr); };
      },
      [d, err = no_answer()] { (*d)(decltype(step(std::declval<MemorySpace::State&>())){}, &err); });
}

void MemoryStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  batch<Acquired>(
      std::make_shared<std::vector<OwnedLock>>(locks.begin(), locks.end()),
      // An Acquired carries its own error.
      [done = std::move(done)](std::size_t k, const Acquired& r, const StoreError*) { done(k, r); },
      [this](MemorySpace::State& s, const OwnedLock& l) { return s.acquire(l.ref(), owner_name_); },
      Acquired::failed(no_answer()));
}

std::size_t MemoryStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
                               RenewDone done) {
  // The names and tokens stay valid while `keepalive` lives: only the
  // views are copied (the array holding them is the caller's).
  batch<Renewed>(
      std::make_shared<std::vector<LockRef>>(locks.begin(), locks.end()), std::move(done),
      [](MemorySpace::State& s, const LockRef& l) { return s.renew(l); }, Renewed::kTransient, std::move(keepalive));
  return 1;
}

void MemoryStore::release(std::span<const LockRef> locks, bool notify, ReleaseDone done) {
  batch<Released>(
      std::make_shared<std::vector<OwnedLock>>(locks.begin(), locks.end()), std::move(done),
      [notify, self = link_.get()](MemorySpace::State& s, const OwnedLock& l) {
        return s.release(l.ref(), notify, self);
      },
      Released::kUnconfirmed);
}

void MemoryStore::raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) {
  single([done = std::move(done)](bool ok, const StoreError*) { done(ok); },
         [n = std::string(name), fence](MemorySpace::State& s) {
           s.raise_fence(n, fence);
           return true;
         });
}

void MemoryStore::reserve_tokens(const LockRef& lock, std::uint32_t n, ReserveDone done) {
  single(std::move(done),
         [owned = OwnedLock(lock), n](MemorySpace::State& s) { return s.reserve_tokens(owned.ref(), n); });
}

void MemoryStore::server_time(TimeDone done) {
  single(std::move(done), [](MemorySpace::State&) { return std::chrono::system_clock::now(); });
}

void MemoryStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                               std::chrono::system_clock::time_point start, ClaimDone done) {
  single(
      [done = std::move(done)](ClaimResult out, const StoreError* error) {
        if (error != nullptr) out.error = *error;  // kFailed
        done(out);
      },
      [n = std::string(name), t = std::string(token), period, start](MemorySpace::State& s) {
        return s.claim(n, t, period, start);
      });
}

void MemoryStore::inspect(std::string_view name, InspectDone done) {
  single(std::move(done), [n = std::string(name)](MemorySpace::State& s) { return s.inspect(n); });
}

void MemoryStore::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  single(std::move(done), [p = encode(prefix), key_from = traits().keys.prefix.size(), limit](MemorySpace::State& s) {
    return s.list(p, key_from, limit);
  });
}

void MemoryStore::force_release(std::string_view name, ForceDone done) {
  single(std::move(done), [n = std::string(name)](MemorySpace::State& s) { return s.force_release(n); });
}

void MemoryStore::withdraw(const LockRef& lock, WithdrawDone done) {
  single([done = std::move(done)](bool, const StoreError* error) { done(error); },
         [owned = OwnedLock(lock)](MemorySpace::State& s) {
           s.withdraw(owned.ref());
           return true;
         });
}

void MemoryStore::subscribe(std::string_view name) {
  if (closed_ || !subscribed_.emplace(name).second) return;
  space_->subscribe(link_, name);
  loop_.post([this, n = std::string(name)] {
    if (!closed_ && events_.subscribed && subscribed_.count(n)) events_.subscribed(n);
  });
}

void MemoryStore::unsubscribe(std::string_view name) {
  auto it = subscribed_.find(name);
  if (it == subscribed_.end()) return;
  subscribed_.erase(it);
  space_->unsubscribe(link_, name);
}

void MemoryStore::notice(const std::string& name) {
  if (!closed_ && events_.released && subscribed_.count(name)) events_.released(name);
}

void MemoryStore::close() {
  if (closed_) return;
  closed_ = true;
  // Detached first: the space runs nothing of ours after this, then no
  // post of any kind lands.
  space_->detach(link_);
  link_->close();
  subscribed_.clear();
  // What the space still held fails, each once, after close() returns.
  for (auto& r : held_) {
    if (std::exchange(r->done, true)) continue;
    if (!loop_.post([fail = r->fail] { fail(); })) r->fail();  // the loop refuses posts only after close()
  }
  held_.clear();
  timer_.close();
}

}  // namespace lockwatch::detail
