// lib/store/memory/memory_store.hpp: locks in this process's memory
// (memory://NAME; docs/stores.md, "In this process"), on a space shared by
// the runtimes naming it (memory_space.hpp). Of the options for servers
// only command_timeout applies: a request held by a paused space (a test
// hook) fails as unavailable (a ConnectionError to users) when it passes.
//
// Threading: as LockStore (loop thread, but construction, encode() and
// check_key()). Costs: per request one lock of the space's mutex (shared
// by its runtimes), a few allocations for the answer, and for acquire and
// release a copy of the names and tokens (a paused space keeps them).
#pragma once

#include "core/reconnector.hpp"
#include "lockwatch/options.hpp"
#include "store/store_base.hpp"
#include "store/memory/memory_space.hpp"

namespace lockwatch::detail {

class MemoryStore final : public FullStore, private RequestTimer::Requests {
 public:
  static constexpr std::string_view kScheme = "memory://";

  // The space a memory:// URL names ("" for the default space). Throws
  // InvalidArgument for another scheme.
  static std::string space_name(const std::string& url);

  MemoryStore(Loop& loop, std::shared_ptr<MemorySpace> space, const Options& options);
  ~MemoryStore() override;

  // Every kind.
  void acquire(std::span<const LockRef> locks, AcquireDone done) override;
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override;
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  // The space tells every store subscribed to a name of its release.
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  // Capabilities, on the space's state (its clock is this host's).
  void raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) override;
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) override;
  void reserve_tokens(const LockRef& lock, std::uint32_t n, ReserveDone done) override;
  void withdraw(const LockRef& lock, WithdrawDone done) override;

  // Loop thread (posted by the space): `name` was released.
  void notice(const std::string& name);

 private:
  using Clock = std::chrono::steady_clock;
  // A request the space held (paused): answered by the space on resume,
  // or failed here at the command timeout or at close, whichever is first.
  struct Request {
    bool done = false;  // loop thread
    Clock::time_point sent;
    std::function<void()> fail;
  };

  // Runs `op` on the space (now, or when a paused space resumes); the
  // function it returns is the answer, run on the loop unless `fail` ran
  // first.
  void submit(std::function<std::function<void()>(MemorySpace::State&)> op, std::function<void()> fail);
  // A batch: `step` on each of `locks`, its results answered in order to
  // done(index, result, error); `failed` for each when the space did not answer.
  template <class Result, class Done, class Locks, class Step>
  void batch(std::shared_ptr<Locks> locks, Done done, Step step, Result failed, std::shared_ptr<const void> keep = {});
  // One call: `done` with `step`'s value and no error, else with an empty value and the timeout's.
  template <class Done, class Step>
  void single(Done done, Step step);
  StoreError no_answer() const;
  // The timer's side: the oldest request held, and those past the timeout failed.
  RequestTimer::Clock::time_point unanswered_since() const override;
  void overdue() override;

  Loop& loop_;
  const std::shared_ptr<MemorySpace> space_;
  const std::shared_ptr<MemoryLink> link_;
  const std::chrono::milliseconds command_timeout_;
  const std::string owner_name_;  // recorded with each grant (Options::runtime.owner_name)
  bool closed_ = false;  // loop thread
  std::set<std::string, std::less<>> subscribed_;  // loop thread
  std::deque<std::shared_ptr<Request>> held_;      // loop thread, oldest first
  RequestTimer timer_{loop_, command_timeout_, *this};  // the held requests' command timeout
};

}  // namespace lockwatch::detail
