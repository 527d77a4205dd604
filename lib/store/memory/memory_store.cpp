#include "store/memory/memory_store.hpp"

#include "core/option_checks.hpp"

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "core/loop.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

std::string MemoryStore::space_name(const std::string& url) {
  if (url.compare(0, kScheme.size(), kScheme) != 0)
    throw InvalidArgument(fmt::format("malformed URL '{}': expected memory://[name]", url));
  return url.substr(kScheme.size());
}

MemoryStore::MemoryStore(Loop& loop, std::shared_ptr<MemorySpace> space, const Options& options)
    : StoreBase(StoreTraits{.keys = KeyRules{options.runtime.key_prefix},
                            .release_events = true,
                            .no_shared = nullptr,
                            .no_permits = nullptr}),
      loop_(loop),
      space_(std::move(space)),
      link_(std::make_shared<MemoryLink>(loop, this)),
      command_timeout_(options.connection.command_timeout),
      owner_name_(owner_name(options)) {
  offer({.fence_raising = this,
         .job_claims = this,
         .operator_tools = this,
         .lock_listing = this,
         .fair_queue = this,
         .token_blocks = this});
}

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
      if (req->done) return;
      req->done = true;
      answer();
    });
  });
  if (ran) return;
  req->sent = Clock::now();
  req->fail = std::move(fail);
  held_.push_back(std::move(req));
  arm_timeout();
}

void MemoryStore::arm_timeout() {
  if (closed_) return;
  if (!started_) {
    uv_timer_init(loop_.uv(), &timer_);
    timer_.data = this;
    started_ = true;
  }
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&timer_)) || held_.empty()) return;
  auto due = held_.front()->sent + command_timeout_ - Clock::now();
  auto ms = std::max<long long>(1, std::chrono::ceil<milliseconds>(due).count());
  uv_timer_start(&timer_, &MemoryStore::on_timeout, static_cast<std::uint64_t>(ms), 0);
}

void MemoryStore::on_timeout(uv_timer_t* timer) {
  auto* self = static_cast<MemoryStore*>(timer->data);
  auto now = Clock::now();
  std::vector<std::shared_ptr<Request>> expired;
  while (!self->held_.empty()) {
    auto& front = self->held_.front();
    if (!front->done && now - front->sent < self->command_timeout_) break;
    if (!front->done) expired.push_back(front);
    self->held_.pop_front();
  }
  // The failures may send new requests: the queue is consistent first.
  self->arm_timeout();
  for (auto& r : expired) {
    r->done = true;
    r->fail();
  }
}

void MemoryStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto owned = std::make_shared<std::vector<OwnedLock>>(locks.begin(), locks.end());
  auto shared_done = std::make_shared<AcquireDone>(std::move(done));
  submit(
      [owned, shared_done, this](MemorySpace::State& s) -> std::function<void()> {
        std::vector<Acquired> out;
        out.reserve(owned->size());
        for (const auto& l : *owned) out.push_back(s.acquire(l.ref(), owner_name_));
        return [out = std::move(out), shared_done] {
          for (std::size_t k = 0; k < out.size(); ++k) (*shared_done)(k, out[k]);
        };
      },
      [n = locks.size(), shared_done, err = no_answer()] {
        const Acquired failed = Acquired::failed(err);
        for (std::size_t k = 0; k < n; ++k) (*shared_done)(k, failed);
      });
}

std::size_t MemoryStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
                               RenewDone done) {
  // The names and tokens stay valid while `keepalive` lives: only the
  // views are copied (the array holding them is the caller's).
  auto refs = std::make_shared<std::vector<LockRef>>(locks.begin(), locks.end());
  auto shared_done = std::make_shared<RenewDone>(std::move(done));
  submit(
      [refs, keepalive = std::move(keepalive), shared_done](MemorySpace::State& s) mutable -> std::function<void()> {
        std::vector<Renewed> out;
        out.reserve(refs->size());
        for (const auto& l : *refs) out.push_back(s.renew(l));
        // The leases go with the answer, and so are let go on the loop.
        return [out = std::move(out), shared_done, keepalive = std::move(keepalive)] {
          for (std::size_t k = 0; k < out.size(); ++k) (*shared_done)(k, out[k], nullptr);
        };
      },
      [n = locks.size(), shared_done, err = no_answer()] {
        for (std::size_t k = 0; k < n; ++k) (*shared_done)(k, Renewed::kTransient, &err);
      });
  return 1;
}

void MemoryStore::release(std::span<const LockRef> locks, bool notify, ReleaseDone done) {
  auto owned = std::make_shared<std::vector<OwnedLock>>(locks.begin(), locks.end());
  auto shared_done = std::make_shared<ReleaseDone>(std::move(done));
  submit(
      [owned, notify, shared_done, self = link_.get()](MemorySpace::State& s) -> std::function<void()> {
        std::vector<Released> out;
        out.reserve(owned->size());
        for (const auto& l : *owned) out.push_back(s.release(l.ref(), notify, self));
        return [out = std::move(out), shared_done] {
          for (std::size_t k = 0; k < out.size(); ++k) (*shared_done)(k, out[k], nullptr);
        };
      },
      [n = locks.size(), shared_done, err = no_answer()] {
        for (std::size_t k = 0; k < n; ++k) (*shared_done)(k, Released::kUnconfirmed, &err);
      });
}

void MemoryStore::raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) {
  auto shared_done = std::make_shared<std::function<void(bool)>>(std::move(done));
  submit(
      [n = std::string(name), fence, shared_done](MemorySpace::State& s) -> std::function<void()> {
        s.raise_fence(n, fence);
        return [shared_done] { (*shared_done)(true); };
      },
      [shared_done] { (*shared_done)(false); });
}

void MemoryStore::reserve_tokens(const LockRef& lock, std::uint32_t n, ReserveDone done) {
  auto shared_done = std::make_shared<ReserveDone>(std::move(done));
  submit(
      [owned = OwnedLock(lock), n, shared_done](MemorySpace::State& s) -> std::function<void()> {
        return [last = s.reserve_tokens(owned.ref(), n), shared_done] { (*shared_done)(last, nullptr); };
      },
      [shared_done, err = no_answer()] { (*shared_done)(0, &err); });
}

void MemoryStore::server_time(
    std::function<void(std::chrono::system_clock::time_point, const StoreError*)> done) {
  auto shared_done = std::make_shared<decltype(done)>(std::move(done));
  submit(
      [shared_done](MemorySpace::State&) -> std::function<void()> {
        return [now = std::chrono::system_clock::now(), shared_done] { (*shared_done)(now, nullptr); };
      },
      [shared_done, err = no_answer()] { (*shared_done)({}, &err); });
}

void MemoryStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                               std::chrono::system_clock::time_point start,
                               ClaimDone done) {
  auto shared_done = std::make_shared<decltype(done)>(std::move(done));
  submit(
      [n = std::string(name), t = std::string(token), period, start,
       shared_done](MemorySpace::State& s) -> std::function<void()> {
        return [out = s.claim(n, t, period, start), shared_done] { (*shared_done)(out); };
      },
      [shared_done, err = no_answer()] {
        ClaimResult out;
        out.error = err;
        (*shared_done)(out);
      });
}

void MemoryStore::inspect(std::string_view name, InspectDone done) {
  auto shared_done = std::make_shared<decltype(done)>(std::move(done));
  submit(
      [n = std::string(name), shared_done](MemorySpace::State& s) -> std::function<void()> {
        return [info = s.inspect(n), shared_done] { (*shared_done)(info, nullptr); };
      },
      [shared_done, err = no_answer()] { (*shared_done)(LockInfo{}, &err); });
}

void MemoryStore::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  auto shared_done = std::make_shared<decltype(done)>(std::move(done));
  const std::string name_prefix = traits().keys.prefix;
  submit(
      [p = encode(prefix), name_prefix, limit, shared_done](MemorySpace::State& s) -> std::function<void()> {
        std::vector<LockInfo> out;
        for (auto& [name, info] : s.list(p, limit)) {
          info.key = name.substr(name_prefix.size());
          out.push_back(std::move(info));
        }
        return [out = std::move(out), shared_done]() mutable { (*shared_done)(std::move(out), nullptr); };
      },
      [shared_done, err = no_answer()] { (*shared_done)({}, &err); });
}

void MemoryStore::force_release(std::string_view name, ForceDone done) {
  auto shared_done = std::make_shared<decltype(done)>(std::move(done));
  submit(
      [n = std::string(name), shared_done](MemorySpace::State& s) -> std::function<void()> {
        return [was = s.force_release(n), shared_done] { (*shared_done)(was, nullptr); };
      },
      [shared_done, err = no_answer()] { (*shared_done)(false, &err); });
}

void MemoryStore::withdraw(const LockRef& lock, WithdrawDone done) {
  auto owned = std::make_shared<OwnedLock>(lock);
  auto shared_done = std::make_shared<WithdrawDone>(std::move(done));
  submit(
      [owned, shared_done](MemorySpace::State& s) -> std::function<void()> {
        s.withdraw(owned->ref());
        return [shared_done] { (*shared_done)(nullptr); };
      },
      [shared_done, err = no_answer()] { (*shared_done)(&err); });
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
    if (r->done) continue;
    r->done = true;
    if (!loop_.post([fail = r->fail] { fail(); })) r->fail();  // the loop refuses posts only after close()
  }
  held_.clear();
  if (started_) uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

}  // namespace lockwatch::detail
