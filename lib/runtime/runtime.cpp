// Admission and the stop order (detail::RuntimeImpl), the public Runtime and
// LockHandle. The parts they wire together: wait_queue, watchdog,
// wheel_clock; the store behind them: store/.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <string_view>
#include <utility>

#include "lockwatch/locked.hpp"
#include "core/error_values.hpp"
#include "core/option_checks.hpp"
#include "runtime/store_errors.hpp"
#include "store/capabilities.hpp"
#include "core/timing.hpp"
#include "core/url.hpp"
#include "runtime/lock_set.hpp"
#include "runtime/runtime_impl.hpp"
#include "store/registry.hpp"

namespace lockwatch {

using detail::Acquisition;
using detail::LeaseRecord;
using std::chrono::milliseconds;

Retries::Retries(int count) : count_(count) {
  if (count < 0) throw InvalidArgument(fmt::format("retries must be >= 0 or lockwatch::forever, got {}", count));
}

detail::RuntimeImpl::RuntimeImpl(Options opts, const detail::StoreFactory& make_store)
    : options(std::move(opts)),
      pool(options.runtime.threads, options.runtime.busy_poll),
      events(event_thread, options.observability.log, detail::owner_name(options)),
      store(make_store(loop, options)),
      clock(loop, options, stats),
      watchdog(*store, clock, notifier, options, stats, events),
      waits(*store, clock, options, stats,
            detail::WaitQueue::Hooks{
                [this](const auto& a, std::uint64_t fence, Clock::time_point sent) { taken(a, fence, sent); },
                [this](const auto& a, std::exception_ptr err, bool busy) { fail(a, std::move(err), busy); }}) {
  if (auto w = detail::deprecated_url_warning(options); !w.empty()) events.log(LogLevel::kWarning, std::move(w));
  watchdog.on_finished([this](const std::shared_ptr<LeaseRecord>& l) { lease_finished(l); });
  clock.after_advance([this] { watchdog.flush(); });
  clock.on_lag([this](Clock::duration lag) { events.metrics().loop_lag.observe(lag); });
  std::promise<void> started;
  auto ready = started.get_future();
  std::exception_ptr listen_error;
  loop.post([this, &started, &listen_error] {
    clock.start();
    detail::StoreEvents se;
    se.released = [this](std::string_view name) { waits.on_released(name); };
    se.subscribed = [this](std::string_view name) { waits.on_subscribed(name); };
    se.subscriptions_lost = [this] { waits.on_subscriptions_lost(); };
    se.connection = [this](const std::string& endpoint, bool up, const std::string& why) {
      events.connection(endpoint, up, why);
    };
    se.log = [this](bool warning, const std::string& line) {
      events.log(warning ? LogLevel::kWarning : LogLevel::kInfo, line);
    };
    se.redirected = [this](bool ask) { events.metrics().redirects[ask ? 1 : 0].fetch_add(1, std::memory_order_relaxed); };
    store->start(std::move(se));
    if (!options.observability.metrics_listen.empty()) {
      try {
        metrics_server = std::make_unique<detail::MetricsServer>(loop, options.observability.metrics_listen,
                                                                 [this] { return render_metrics(); });
      } catch (...) {
        listen_error = std::current_exception();
      }
    }
    started.set_value();
  });
  ready.wait();
  if (listen_error) {
    stop();
    std::rethrow_exception(listen_error);
  }
}

std::string detail::RuntimeImpl::render_metrics() const { return events.metrics().render(stats); }

// ---------------------------------------------------------------- admission

void detail::RuntimeImpl::check_key(const std::string& key) const {
  if (key.empty()) throw InvalidArgument("lock key is empty");
  if (key.size() > options.runtime.max_key_bytes)
    throw InvalidArgument(fmt::format("lock key is {} bytes; the limit (Options::runtime.max_key_bytes) is {}",
                                      key.size(), options.runtime.max_key_bytes));
  if (const char* why = store->check_key(key)) throw InvalidArgument(why);
}

void detail::RuntimeImpl::validate(detail::LockSpec& spec) const {
  if (!spec.set.empty() || spec.key.empty()) check_set(spec);
  if (spec.set.empty()) check_key(spec.key);
  if (spec.ttl <= milliseconds(0) || spec.ttl > max_ttl)
    throw InvalidArgument(fmt::format("ttl must be 1 .. {} ms (7 days), got {} ms", max_ttl.count(), spec.ttl.count()));
  if (spec.wait < milliseconds(0) || spec.wait > max_wait)
    throw InvalidArgument(fmt::format("wait must be 0 .. {} ms (7 days), got {} ms", max_wait.count(), spec.wait.count()));
  if (spec.kind.mode() == LockKind::Mode::kPermits && spec.kind.permit_count() == 0)
    throw InvalidArgument("permits(n) needs n >= 1");
  if (!spec.context.empty()) detail::check_context(spec.context);
  // Fair locks only where the store offers a FairQueue (check_kind): a
  // fair waiter that gives up must leave the store's queue, or it would
  // stall the waiters behind it for its ttl.
  if (const char* why = store->check_kind(spec.kind))
    throw Unsupported(fmt::format("{} locks: {} cannot hold them ({})", spec.kind.describe(), store_kind(), why));
  if (spec.renew_weight == 0) spec.renew_weight = options.watchdog.renew_weight;
  detail::check_renew_weight(spec.renew_weight);
  // The renewal fires at ttl*weight (or earlier, see renew_after), up to a
  // tick early, and must be confirmed before the local deadline (ttl - drift,
  // less a tick: Watchdog::deadline_of).
  auto window = spec.ttl - detail::drift_for(options.watchdog, spec.ttl) -
                std::chrono::ceil<milliseconds>(detail::renew_after(options.watchdog, spec.ttl, spec.renew_weight));
  auto needed = 2 * options.watchdog.tick + milliseconds(2);
  if (window < needed)
    throw InvalidArgument(fmt::format(
        "ttl {} ms is too short: renewing at {:.2f} of it leaves {} ms after the drift allowance, but the tick ({} "
        "ms) needs {} ms",
        spec.ttl.count(), spec.renew_weight, window.count(), options.watchdog.tick.count(), needed.count()));
}

std::shared_ptr<Acquisition> detail::RuntimeImpl::make_acquisition(detail::LockSpec spec, detail::Completion how) {
  {
    std::lock_guard lk(mu);
    if (stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
    ++active_calls;
  }
  auto a = std::make_shared<Acquisition>(std::move(how));
  a->name = store->encode(spec.key);
  a->ttl_ms = detail::TtlText(spec.ttl);
  a->spec = std::move(spec);
  a->started = Clock::now();
  return a;
}

std::shared_ptr<Acquisition> detail::RuntimeImpl::start_handle(detail::LockSpec spec,
                                                         const std::shared_ptr<detail::HandleCall>& call) {
  auto a = make_acquisition(std::move(spec), detail::Completion::deliver(call));
  call->runtime = weak_from_this();
  call->acquisition = a;
  if (!loop.post([this, a] { start_acquire(a); })) {
    a->completion.fail(std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
    call_done();
  }
  return a;
}

void detail::RuntimeImpl::acquire_together(std::vector<detail::LockSpec> specs, detail::AcquireEach each) {
  for (auto& spec : specs) validate(spec);  // throws before anything starts
  auto shared_each = std::make_shared<detail::AcquireEach>(std::move(each));
  std::weak_ptr<ThreadPool> notifier = notifier_pool;
  std::vector<std::shared_ptr<Acquisition>> made;
  made.reserve(specs.size());
  std::exception_ptr stopped;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto call = std::make_shared<detail::HandleCall>();
    call->key = specs[i].key;
    call->complete = [notifier, shared_each, i](std::exception_ptr e, LockHandle lh) mutable {
      detail::post_completion(notifier, [shared_each, i, e, lh = std::move(lh)]() mutable { (*shared_each)(i, e, std::move(lh)); });
    };
    if (!stopped) {
      try {
        auto a = make_acquisition(std::move(specs[i]), detail::Completion::deliver(call));
        call->runtime = weak_from_this();
        call->acquisition = a;
        made.push_back(std::move(a));
        continue;
      } catch (...) {
        stopped = std::current_exception();
      }
    }
    if (call->claim(detail::HandleCall::kDone)) call->deliver(stopped, LockHandle());
  }
  // One task: the store sees every request in the same turn of its loop,
  // and batches them as it batches any requests sent together.
  auto task = [this, made] {
    for (const auto& a : made) start_acquire(a);
  };
  if (!made.empty() && !loop.post(task)) {
    for (const auto& a : made) {
      a->completion.fail(std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
      call_done();
    }
  }
}

std::future<LockHandle> detail::RuntimeImpl::acquire(detail::LockSpec spec) {
  validate(spec);
  // The future form is the handler form whose handler fulfils a promise
  // (on the loop thread: no user code runs there).
  if (!spec.set.empty()) {
    if (stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
    auto promise = std::make_shared<std::promise<LockHandle>>();
    auto future = promise->get_future();
    detail::SetAcquirer::start(*this, std::move(spec), {}, [promise](std::exception_ptr e, LockHandle h) {
      if (e)
        promise->set_exception(e);
      else
        promise->set_value(std::move(h));
    });
    return future;
  }
  // The call and its promise in one block; `complete` keeps the promise's
  // address only (std::function keeps that inline) and moves the promise
  // out to fulfil it, so the block keeps no hold on the handle: a future
  // dropped unread releases the lock with it.
  struct PromisedCall {
    detail::HandleCall call;
    std::promise<LockHandle> promise;
  };
  auto block = std::make_shared<PromisedCall>();
  auto future = block->promise.get_future();
  std::shared_ptr<detail::HandleCall> call(block, &block->call);
  call->key = spec.key;
  call->complete = [p = &block->promise](std::exception_ptr e, LockHandle h) {
    std::promise<LockHandle> promise = std::move(*p);
    if (e)
      promise.set_exception(e);
    else
      promise.set_value(std::move(h));
  };
  start_handle(std::move(spec), call);
  return future;
}

AcquireTicket detail::RuntimeImpl::acquire(detail::LockSpec spec, detail::AcquireCallback handler) {
  if (!handler) throw InvalidArgument("Runtime::async_acquire: the handler is empty");
  validate(spec);
  if (!spec.set.empty()) {
    if (stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
    return detail::SetAcquirer::start(*this, std::move(spec), {}, std::move(handler));
  }
  auto call = std::make_shared<detail::HandleCall>();
  call->key = spec.key;
  // Called on the loop (or the cancelling thread): the handler itself runs
  // on the notifier.
  call->complete = [notifier = std::weak_ptr<ThreadPool>(notifier_pool), h = std::move(handler)](
                       std::exception_ptr e, LockHandle lh) mutable {
    detail::post_completion(notifier, [h = std::move(h), e, lh = std::move(lh)]() mutable { h(e, std::move(lh)); });
  };
  start_handle(std::move(spec), call);
  return detail::RuntimeAccess::ticket(std::move(call));
}

void detail::RuntimeImpl::cancel_acquire(const std::shared_ptr<Acquisition>& a) {
  // Ended meanwhile (granted and given back, or failed), or one attempt
  // with no wait in flight (its answer finds it cancelled): nothing here.
  if (a->wait_over() || a->spec.wait == milliseconds(0)) return;
  waits.cancel(a.get(), std::make_exception_ptr(Cancelled(a->spec.key)));
}

void detail::RuntimeImpl::check_set(detail::LockSpec& spec) const {
  auto& keys = spec.set;
  if (keys.empty()) throw InvalidArgument("lock key is empty (or lockwatch::all_of names no key)");
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  if (keys.size() > max_set_keys)
    throw InvalidArgument(fmt::format("lockwatch::all_of names {} distinct keys; a set holds at most {}", keys.size(),
                                      max_set_keys));
  for (const auto& k : keys) check_key(k);
  if (keys.size() == 1) {  // all_of(k) and all_of(k, k) are the key k
    spec.key = std::move(keys.front());
    keys.clear();
    return;
  }
  spec.key = fmt::format("all_of({})", fmt::join(keys, ", "));
}

// A call inside one that holds its key runs within that holding: an
// exclusive holding covers a shared call, and a holding covers a call of
// its own kind. Any other would wait for the holding around it forever.
void detail::check_reentrant(const std::string& key, const LockKind& held, const LockKind& asked) {
  if (held == asked || (held.exclusive_kind() && asked.mode() == LockKind::Mode::kShared)) return;
  throw InvalidArgument(fmt::format(
      "the lock '{}' is held {} on this thread: a call inside it cannot take it {} (it would wait for itself)", key,
      held.describe(), asked.describe()));
}

void detail::RuntimeImpl::dispatch(detail::LockSpec spec, std::shared_ptr<detail::Call> call) {
  validate(spec);
  if (!spec.set.empty()) {
    dispatch_set(std::move(spec), std::move(call));
    return;
  }

  // Reentrant and nested calls run on this thread.
  auto& held_here = detail::leases_on_this_thread();
  auto run_reentrant = [&](const LeaseRecord* l) {
    {
      detail::ThreadLeaseScope scope(this, l);
      call->run();
    }
    // lost_detail belongs to the loop thread: the reason alone here.
    call->finish(l->lost() ? std::make_exception_ptr(LeaseLost(l->key(), *l->lost_reason())) : nullptr);
  };
  for (auto it = held_here.rbegin(); it != held_here.rend(); ++it) {
    if (it->runtime == this && it->lease->key() == spec.key) {
      detail::check_reentrant(spec.key, it->lease->kind, spec.kind);
      run_reentrant(it->lease);  // the scope in it may move the vector: `it` is not used after
      return;
    }
  }
  bool nested = !held_here.empty();

  auto a = make_acquisition(std::move(spec), nested ? detail::Completion::run_inline(std::move(call))
                                                    : detail::Completion::on_pool(std::move(call)));
  std::future<std::shared_ptr<LeaseRecord>> granted;
  std::future<void> finished;
  if (auto* w = a->completion.inline_wait()) {
    granted = w->granted.get_future();
    finished = w->finished->get_future();
  }
  if (!loop.post([this, a] { start_acquire(a); })) {
    a->completion.fail(std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
    call_done();
    return;
  }
  if (!nested) return;

  // Nested call on another key: this thread waits for the lock (every
  // acquisition completes: by reply, wait deadline or command timeout),
  // runs the work itself, and returns once the lock is released.
  std::shared_ptr<LeaseRecord> l = granted.get();
  if (l) {
    {
      detail::ThreadLeaseScope scope(this, l.get());
      l->call->run();
    }
    loop.post([this, l] { work_ended(l); });
  }
  finished.wait();
}

void detail::RuntimeImpl::call_done() {
  std::lock_guard lk(mu);
  if (--active_calls == 0) cv.notify_all();
}

void detail::RuntimeImpl::start_acquire(std::shared_ptr<Acquisition> a) {
  events.wait_started(a->spec.key, a->spec.context, a->started);
  if (stopping.load()) {
    fail(a, std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
    return;
  }
  a->token = tokens.next();
  waits.start(std::move(a));
}

void detail::RuntimeImpl::fail(const std::shared_ptr<Acquisition>& a, std::exception_ptr err, bool busy) {
  // The wait queue says whether it was busy: no exception is rethrown to
  // find out. A cancelled wait is neither.
  const auto waited = Clock::now() - a->started;
  if (a->completion.cancelled()) {
    events.wait_cancelled(a->spec.key, a->spec.context, waited);
  } else if (busy) {
    events.busy(a->spec.key, waited, a->spec.pattern, a->spec.context);
  } else {
    events.acquire_failed(a->spec.key, err, waited, a->spec.context);
  }
  a->end_wait(false);
  a->completion.fail(err);
  call_done();
}

void detail::RuntimeImpl::taken(const std::shared_ptr<Acquisition>& a, std::uint64_t fence, Clock::time_point sent) {
  auto l = watchdog.grant(*a, fence, sent);
  start_lease(a, l);
  reserve_ahead(l);
}

void detail::RuntimeImpl::start_lease(const std::shared_ptr<Acquisition>& a, const std::shared_ptr<LeaseRecord>& l) {
  events.acquired(a->spec.key, l->fencing_token(), l->granted_at - a->started, a->spec.pattern, a->spec.context);
  if (stopping.load()) l->request_stop();
  if (!links) links = std::make_shared<const detail::RuntimeLinks>(weak_from_this(), notifier_pool);
  l->links = links;
  // Nobody will hold it when its handle was cancelled while the grant was
  // on its way, or when it was granted after the stop began (nobody is left
  // to release it, and the stop would wait for it): it is given back at
  // once, as a dropped handle is. After the stop, its work never starts and
  // its call fails with RuntimeStopped, as waiting ones did.
  using Way = detail::Completion::Way;
  detail::HandleCall* handle = a->completion.handle();
  const bool after_stop = stop_begun && a->completion.way() != Way::kInline;
  const bool claimed = handle && handle->claim(detail::HandleCall::kDone);
  if (after_stop || (handle && !claimed)) {
    if (claimed) {
      handle->acquisition.reset();
      handle->deliver(std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped while the lock was taken")),
                      LockHandle());
    } else if (!handle) {
      l->give_up_start();
      stopped_before_start(l);  // complete_call() fails the call so
    }
    work_ended(l);
    return;
  }
  switch (a->completion.way()) {
    case Way::kHandle:
      handle->acquisition.reset();
      // The handle lives only in what `complete` keeps (dropped with it, so
      // a future dropped unread releases the lock with it).
      handle->deliver(nullptr, detail::HandleAccess::make(l));
      break;
    case Way::kInline:
      a->completion.inline_wait()->granted.set_value(l);
      break;
    case Way::kPool:
      run_on_pool(l);
      break;
  }
}

void detail::RuntimeImpl::stopped_before_start(const std::shared_ptr<LeaseRecord>& l) {
  // Its hold span ends here: a lost lease reports no release.
  if (l->mark_lost(LostReason::kRuntimeStopped))
    events.stopped_before_start(l->key(), l->context(), Clock::now() - l->granted_at, l->fencing_token());
}

void detail::RuntimeImpl::run_on_pool(const std::shared_ptr<LeaseRecord>& l) {
  // The work's end comes back to the loop: adaptive polling waits for it
  // as for a reply (counted until the work's post is made).
  struct Expected {
    detail::Loop& loop;
    explicit Expected(detail::Loop& lp) : loop(lp) {}
    Expected(const Expected&) = delete;
    Expected& operator=(const Expected&) = delete;
    ~Expected() { loop.expect(-1); }
  };
  loop.expect(1);
  try {
    pool.post([this, l] {
      Expected expected(loop);
      // Given up while it waited (Options::runtime.queue_timeout): answered already.
      if (!l->begin_work()) return;
      // A wait for a worker that used a fifth of the ttl or more is made
      // good before the work counts on remaining(): one round trip, on this
      // rare path only (bounded by the command timeout).
      if (l->remaining() < l->ttl() * 4 / 5) {
        auto answered = std::make_shared<std::promise<void>>();
        auto renewed = answered->get_future();
        if (loop.post([this, l, answered] { watchdog.renew_at_start(l, answered); }))
          renewed.wait_for(options.connection.command_timeout + 2 * options.watchdog.tick);
      }
      {
        detail::ThreadLeaseScope scope(this, l.get());
        l->call->run();
      }
      loop.post([this, l] { work_ended(l); });
    });
  } catch (...) {
    loop.expect(-1);
    // The pool refused (stopping): the work never ran; give the lock back.
    l->give_up_start();
    stopped_before_start(l);
    work_ended(l);
  }
}

void detail::RuntimeImpl::lease_finished(const std::shared_ptr<LeaseRecord>& l) {
  l->complete_call();
  waits.on_lease_finished(l->name.view(), l->kind, l->yield_on_release);
  call_done();
}


// ----------------------------------------------------------- operators' tools

// The key checked as a lock's would be, then the store's name for it.
std::string detail::RuntimeImpl::operator_name(const std::string& key) const {
  detail::LockSpec spec;
  spec.key = key;
  spec.ttl = milliseconds(60000);  // any valid ttl: only the key is in question
  validate(spec);
  if (stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
  return store->encode(key);
}

// ---------------------------------------------------------- JobHost

detail::JobHost& detail::JobHost::of(Runtime& runtime) noexcept { return detail::RuntimeAccess::impl(runtime); }

detail::JobClaims& detail::RuntimeImpl::job_claims() { return detail::require<detail::JobClaims>(*store, store_kind()); }

void detail::RuntimeImpl::check_lease(detail::LockSpec& spec) const {
  validate(spec);
  if (stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
}

// The leases this runtime hands out are its LeaseRecords.
void detail::RuntimeImpl::with_lease(const Lease& lease, const std::function<void()>& body) {
  detail::ThreadLeaseScope scope(this, static_cast<const detail::LeaseRecord*>(&lease));
  body();
}

std::string detail::RuntimeImpl::owner_token(const Lease& lease) const {
  return static_cast<const detail::LeaseRecord&>(lease).token.str();
}

std::string detail::RuntimeImpl::store_kind() const {
  const std::string& url = detail::store_url(options);
  auto sep = url.find("://");
  return "the " + (sep == std::string::npos ? url : url.substr(0, sep + 3)) + " store";
}

std::future<LockState> detail::RuntimeImpl::inspect(std::string key) {
  auto promise = std::make_shared<std::promise<LockState>>();
  auto future = promise->get_future();
  auto& tools = detail::require<detail::OperatorTools>(*store, store_kind());
  if (!loop.post([&tools, promise, name = operator_name(key), key]() mutable {
        tools.inspect(name, [promise, key = std::move(key)](const detail::LockInfo& info, const detail::StoreError* err) {
          if (err)
            promise->set_exception(detail::to_exception(*err));
          else
            promise->set_value(detail::to_lock_state(key, info));
        });
      }))
    throw RuntimeStopped("lockwatch runtime is stopping");
  return future;
}

std::uint64_t detail::RuntimeImpl::observe_releases(const std::string& key, std::function<void()> look) {
  if (!store->release_events()) return 0;
  const std::uint64_t id = next_observer.fetch_add(1, std::memory_order_relaxed);
  if (!loop.post([this, id, name = operator_name(key), look = std::move(look)]() mutable {
        waits.observe(id, name, std::move(look));
      }))
    return 0;
  return id;
}

void detail::RuntimeImpl::keep_observing(std::uint64_t id) {
  if (id != 0) (void)loop.post([this, id] { waits.keep_observing(id); });
}

void detail::RuntimeImpl::unobserve_releases(std::uint64_t id) {
  if (id != 0) (void)loop.post([this, id] { waits.unobserve(id); });
}

std::future<detail::LockInfo> detail::RuntimeImpl::inspect_info(std::string key) {
  auto promise = std::make_shared<std::promise<detail::LockInfo>>();
  auto future = promise->get_future();
  auto& tools = detail::require<detail::OperatorTools>(*store, store_kind());
  if (!loop.post([&tools, promise, name = operator_name(key)] {
        tools.inspect(name, [promise](const detail::LockInfo& info, const detail::StoreError* err) {
          if (err)
            promise->set_exception(detail::to_exception(*err));
          else
            promise->set_value(info);
        });
      }))
    throw RuntimeStopped("lockwatch runtime is stopping");
  return future;
}

std::future<bool> detail::RuntimeImpl::force_release(std::string key) {
  auto promise = std::make_shared<std::promise<bool>>();
  auto future = promise->get_future();
  auto& tools = detail::require<detail::OperatorTools>(*store, store_kind());
  if (!loop.post([&tools, promise, name = operator_name(key)] {
        tools.force_release(name, [promise](bool held, const detail::StoreError* err) {
          if (err)
            promise->set_exception(detail::to_exception(*err));
          else
            promise->set_value(held);
        });
      }))
    throw RuntimeStopped("lockwatch runtime is stopping");
  return future;
}

// ---------------------------------------------------------------- stopping

void detail::RuntimeImpl::begin_stop() {
  stop_begun = true;
  waits.fail_all(std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped while waiting for the lock")));
  // Nobody may be left to release a handle: the runtime gives them back,
  // and a handle that outlives it reads lost (kRuntimeStopped) from now on,
  // so its remaining() no longer vouches for a lock it does not hold.
  for (auto& l : watchdog.stop_all()) {
    watchdog.lose(l, LostReason::kRuntimeStopped, "the runtime was destroyed and released the lock");
    work_ended(l);
  }
}

void detail::RuntimeImpl::close_all() {
  if (metrics_server) metrics_server->close();
  clock.close();
  store->close();
}

void detail::RuntimeImpl::stop() {
  {
    std::lock_guard lk(mu);
    stopping.store(true);
  }
  loop.post([this] { begin_stop(); });
  {
    // In-flight acquisitions end by reply or command timeout; running work
    // was asked to stop and is awaited.
    std::unique_lock lk(mu);
    cv.wait(lk, [this] { return active_calls == 0; });
  }
  pool.shutdown();
  notifier.shutdown();  // the last handlers (RuntimeStopped) run first
  loop.shutdown([this] { close_all(); });
  event_thread.shutdown();  // after the loop: its last events are told
  // The loop has joined: what it owned belongs to this thread now.
  waits.clear();
  watchdog.clear();
}

std::unique_ptr<Runtime> detail::RuntimeAccess::make(Options options, const StoreFactory& make_store) {
  options.validate();
  return std::unique_ptr<Runtime>(new Runtime(std::make_shared<detail::RuntimeImpl>(std::move(options), make_store)));
}

// ------------------------------------------------------------------ public

Runtime::Runtime(Options options) {
  options.validate();
  impl_ = std::make_shared<Impl>(std::move(options), &detail::make_store);
}

namespace {
detail::LockSpec spec_of(LockRequest r) {
  detail::LockSpec spec;
  detail::put_key(spec, std::move(r.key));
  spec.ttl = r.ttl;
  spec.retries = r.retries.count();
  spec.wait = r.wait;
  spec.kind = r.kind;
  spec.context = std::move(r.context);
  spec.renew_weight = r.renew_weight;
  spec.pattern = r.metrics_pattern.id();
  return spec;
}
}  // namespace

std::future<LockHandle> Runtime::acquire(LockRequest request) { return impl_->acquire(spec_of(std::move(request))); }

std::future<LockHandle> Runtime::acquire(std::string key, std::chrono::milliseconds ttl) {
  return acquire(LockRequest{.key = std::move(key), .ttl = ttl});
}

AcquireTicket Runtime::async_acquire(LockRequest request, AcquireHandler handler) {
  if (!handler) throw InvalidArgument("Runtime::async_acquire: the handler is empty");
  // Shared, so that a request refused before it started still reaches it.
  auto h = std::make_shared<AcquireHandler>(std::move(handler));
  try {
    return impl_->acquire(spec_of(std::move(request)), [h](std::exception_ptr e, LockHandle lh) {
      (*h)(detail::code_of(e), std::move(lh));
    });
  } catch (...) {
    // Refused before anything started: the handler learns it as it learns
    // any outcome, off this thread, and nothing is thrown.
    detail::post_completion(impl_->notifier_pool,
                            [h, ec = detail::code_of(std::current_exception())] { (*h)(ec, LockHandle()); });
    return AcquireTicket();
  }
}

MetricsPattern::MetricsPattern(std::string_view text) noexcept : id_(detail::pattern_id(text)) {}

AcquireTicket Runtime::dispatch_acquire(LockRequest request, detail::AcquireCallback handler) {
  return impl_->acquire(spec_of(std::move(request)), std::move(handler));
}

bool AcquireTicket::cancel() noexcept {
  if (!call_ || !call_->claim(detail::HandleCall::kCancelled)) return false;
  try {
    call_->deliver(std::make_exception_ptr(Cancelled(call_->key)), LockHandle());
    if (call_->cancel_set) call_->cancel_set();  // a set: the key it is taking now
    // Out of the wait queue, on the loop. A pending acquisition keeps its
    // runtime from stopping, so the runtime is there.
    if (auto a = call_->acquisition.lock()) {
      if (auto rt = call_->runtime.lock()) {
        detail::RuntimeImpl* impl = rt.get();
        impl->loop.post([impl, a] { impl->cancel_acquire(a); });
      }
    }
  } catch (...) {
    // Out of memory: the wait runs out by itself.
  }
  return true;
}

void detail::post_completion(const std::weak_ptr<ThreadPool>& notifier, UniqueFunction task) noexcept {
  // Kept outside the pool's queue until it is surely taken: a refused post
  // must not lose it.
  auto held = std::make_shared<UniqueFunction>(std::move(task));
  if (auto pool = notifier.lock()) {
    try {
      pool->post([held] { (*held)(); });
      return;
    } catch (...) {
    }
  }
  try {
    std::thread([held] { (*held)(); }).detach();
  } catch (...) {
  }
}

std::future<LockState> Runtime::inspect(std::string key) { return impl_->inspect(std::move(key)); }
std::future<bool> Runtime::force_release(std::string key) { return impl_->force_release(std::move(key)); }

// ------------------------------------------------------------- LockHandle

LockHandle& LockHandle::operator=(LockHandle&& other) noexcept {
  if (this != &other) {
    if (state_) {
      try {
        (void)release();
      } catch (...) {
      }
    }
    state_ = std::move(other.state_);
    set_ = other.set_;
  }
  return *this;
}

LockHandle::~LockHandle() {
  if (state_) {
    try {
      (void)release();
    } catch (...) {
    }
  }
}

const Lease& LockHandle::lease() const noexcept {
  if (set_) return static_cast<const detail::SetRecord&>(*state_);
  return static_cast<const detail::LeaseRecord&>(*state_);
}

void LockHandle::release(std::function<void(std::error_code)> handler) {
  if (!handler) throw InvalidArgument("LockHandle::release: the handler is empty");
  release_typed([h = std::move(handler)](std::exception_ptr e) { h(detail::code_of(e)); });
}

void LockHandle::release_typed(std::function<void(std::exception_ptr)> handler) {
  if (!state_) throw InvalidArgument("LockHandle::release() on a handle that holds no lock");
  if (!handler) throw InvalidArgument("LockHandle::release: the handler is empty");
  auto state = std::move(state_);
  state->released(std::move(handler));
  if (set_) {
    detail::SetRecord::release_keys(std::static_pointer_cast<detail::SetRecord>(std::move(state)));
    return;
  }
  if (auto rt = state->runtime()) {
    auto l = std::static_pointer_cast<detail::LeaseRecord>(std::move(state));
    detail::RuntimeImpl* impl = rt.get();
    impl->loop.post([impl, l] { impl->work_ended(l); });
  }
}

LeaseScope LockHandle::enter() const {
  if (!state_) throw InvalidArgument("LockHandle::enter() on a handle that holds no lock");
  return LeaseScope(state_->runtime().get(), &lease());
}

LeaseScope::LeaseScope(const void* runtime, const Lease* lease) : lease_(lease) {
  auto& held = detail::leases_on_this_thread();
  if (detail::LeaseAccess::is_set(*lease)) {
    // One entry per key, each showing the set's lease.
    const auto& parts = static_cast<const detail::SetRecord*>(lease)->parts();
    held.reserve(held.size() + parts.size());
    for (const auto* part : parts) held.push_back({runtime, part, lease});
    entries_ = parts.size();
    return;
  }
  held.push_back({runtime, static_cast<const detail::LeaseRecord*>(lease), lease});
}

LeaseScope::~LeaseScope() {
  // Innermost last: scopes end in reverse order, but one ended out of
  // order still takes only its own entries away.
  auto& held = detail::leases_on_this_thread();
  for (std::size_t n = 0; n < entries_; ++n) {
    for (auto it = held.rbegin(); it != held.rend(); ++it) {
      if (it->shown == lease_) {
        held.erase(std::next(it).base());
        break;
      }
    }
  }
}

std::future<void> LockHandle::release() {
  if (!state_) throw InvalidArgument("LockHandle::release() on a handle that holds no lock");
  auto state = std::move(state_);
  auto future = state->released();
  if (set_) {
    detail::SetRecord::release_keys(std::static_pointer_cast<detail::SetRecord>(std::move(state)));
    return future;
  }
  if (auto rt = state->runtime()) {
    auto l = std::static_pointer_cast<detail::LeaseRecord>(std::move(state));
    detail::RuntimeImpl* impl = rt.get();
    // Refused only once the runtime closed, after it released the lock.
    impl->loop.post([impl, l] { impl->work_ended(l); });
  }
  return future;
}

Runtime::~Runtime() {
  if (impl_) impl_->stop();
}

Runtime& Runtime::default_runtime() {
  static Runtime rt(Options::from_env());
  return rt;
}

const Options& Runtime::options() const noexcept { return impl_->options; }
ThreadPool& Runtime::pool() noexcept { return impl_->pool; }
std::string Runtime::metrics_text() const { return impl_->render_metrics(); }
std::string Runtime::metrics_address() const {
  return impl_->metrics_server ? impl_->metrics_server->address() : std::string();
}
void Runtime::add_observer(std::shared_ptr<Observer> observer) { impl_->events.add(std::move(observer)); }

std::size_t Runtime::held_leases() const noexcept { return impl_->watchdog.held(); }

RuntimeStats Runtime::stats() const noexcept {
  const auto& c = impl_->stats;
  RuntimeStats s;
  s.held_leases = c.held.load(std::memory_order_relaxed);
  s.acquired = c.acquired.load(std::memory_order_relaxed);
  s.renewals_sent = c.renewals_sent.load(std::memory_order_relaxed);
  s.renew_commands = c.renew_commands.load(std::memory_order_relaxed);
  s.leases_lost = c.leases_lost.load(std::memory_order_relaxed);
  s.local_handoffs = c.local_handoffs.load(std::memory_order_relaxed);
  s.token_reservations = c.token_reservations.load(std::memory_order_relaxed);
  s.attempts_queued = c.attempts_queued.load(std::memory_order_relaxed);
  s.timer_wakeups = c.timer_wakeups.load(std::memory_order_relaxed);
  s.min_renewal_slack = std::chrono::microseconds(c.min_renewal_slack_us.load(std::memory_order_relaxed));
  return s;
}

void Runtime::dispatch(LockRequest request, std::shared_ptr<detail::Call> call) {
  impl_->dispatch(spec_of(std::move(request)), std::move(call));
}

}  // namespace lockwatch
