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

std::shared_ptr<detail::RuntimeImpl> detail::RuntimeImpl::make(Options opts, const detail::StoreFactory& make_store) {
  auto impl = std::make_shared<RuntimeImpl>(std::move(opts), make_store);
  impl->table_.set_links(impl, impl->notifier_pool_);
  return impl;
}

detail::RuntimeImpl::RuntimeImpl(Options opts, const detail::StoreFactory& make_store)
    : options_(std::move(opts)),
      pool_(options_.runtime.threads, options_.runtime.busy_poll),
      events_(event_thread_, options_.observability.log, detail::owner_name(options_)),
      store_(make_store(loop_, options_)),
      clock_(loop_, options_, stats_),
      table_({.options = options_,
              .stats = stats_,
              .events = events_,
              .loop = loop_,
              .pool = pool_,
              .notifier = *notifier_pool_,
              .store = *store_,
              .clock = clock_,
              .admission = admission_,
              .runtime = this}) {
  if (auto w = detail::deprecated_url_warning(options_); !w.empty()) events_.log(LogLevel::kWarning, std::move(w));
  clock_.on_lag([this](Clock::duration lag) { events_.metrics().loop_lag.observe(lag); });
  std::promise<void> started;
  auto ready = started.get_future();
  std::exception_ptr listen_error;
  loop_.post([this, &started, &listen_error] {
    clock_.start();
    detail::StoreEvents se;
    table_.listen(se);
    se.connection = [this](const std::string& endpoint, bool up, const std::string& why) {
      events_.connection(endpoint, up, why);
    };
    se.log = [this](bool warning, const std::string& line) {
      events_.log(warning ? LogLevel::kWarning : LogLevel::kInfo, line);
    };
    se.redirected = [this](bool ask) { events_.metrics().redirects[ask ? 1 : 0].fetch_add(1, std::memory_order_relaxed); };
    store_->start(std::move(se));
    if (!options_.observability.metrics_listen.empty()) {
      try {
        metrics_server_ = std::make_unique<detail::MetricsServer>(loop_, options_.observability.metrics_listen,
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

std::string detail::RuntimeImpl::render_metrics() const { return events_.metrics().render(stats_); }

// ---------------------------------------------------------------- admission

void detail::RuntimeImpl::check_key(const std::string& key) const {
  if (key.empty()) throw InvalidArgument("lock key is empty");
  if (key.size() > options_.runtime.max_key_bytes)
    throw InvalidArgument(fmt::format("lock key is {} bytes; the limit (Options::runtime.max_key_bytes) is {}",
                                      key.size(), options_.runtime.max_key_bytes));
  if (const char* why = store_->check_key(key)) throw InvalidArgument(why);
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
  if (const char* why = store_->check_kind(spec.kind))
    throw Unsupported(fmt::format("{} locks: {} cannot hold them ({})", spec.kind.describe(), store_kind(), why));
  if (spec.renew_weight == 0) spec.renew_weight = options_.watchdog.renew_weight;
  detail::check_renew_weight(spec.renew_weight);
  // The renewal fires at ttl*weight (or earlier, see renew_after), up to a
  // tick early, and must be confirmed before the local deadline (ttl - drift,
  // less a tick: Watchdog::deadline_of).
  auto window = spec.ttl - detail::drift_for(options_.watchdog, spec.ttl) -
                std::chrono::ceil<milliseconds>(detail::renew_after(options_.watchdog, spec.ttl, spec.renew_weight));
  auto needed = 2 * options_.watchdog.tick + milliseconds(2);
  if (window < needed)
    throw InvalidArgument(fmt::format(
        "ttl {} ms is too short: renewing at {:.2f} of it leaves {} ms after the drift allowance, but the tick ({} "
        "ms) needs {} ms",
        spec.ttl.count(), spec.renew_weight, window.count(), options_.watchdog.tick.count(), needed.count()));
}

std::shared_ptr<Acquisition> detail::RuntimeImpl::make_acquisition(detail::LockSpec spec, detail::Completion how) {
  admission_.begin();
  auto a = std::make_shared<Acquisition>(std::move(how));
  store_->encode(spec.key, a->name);
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
  begin(a);
  return a;
}

void detail::RuntimeImpl::begin(const std::shared_ptr<Acquisition>& a) {
  if (!write_directly(a)) post_start(a);
}

bool detail::RuntimeImpl::write_directly(const std::shared_ptr<Acquisition>& a) {
  // The loop would wake only to send it: this thread writes it, and the
  // loop wakes for the answer alone.
  // The acquisition's start, read just before on this thread, stands for
  // the time of the send: earlier, so the lease's deadline counted from it
  // errs short.
  const auto sent = a->started;
  if (direct_ == nullptr || a->spec.wait != milliseconds(0) || !a->spec.kind.exclusive_kind() ||
      !direct_->lane_open_at(sent))
    return false;
  {
    std::lock_guard lk(direct_tokens_mu_);
    a->token = direct_tokens_.next();
  }
  return direct_->acquire_direct(a->ref(), [this, a, sent](const detail::Acquired& out) {
    table_.answered_direct(a, out, sent);
  });
}

void detail::RuntimeImpl::acquire_together(std::vector<detail::LockSpec> specs, detail::AcquireEach each) {
  for (auto& spec : specs) validate(spec);  // throws before anything starts
  auto shared_each = std::make_shared<detail::AcquireEach>(std::move(each));
  std::weak_ptr<ThreadPool> notifier = notifier_pool_;
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
  if (!made.empty()) post_start(std::move(made));
}

bool detail::RuntimeImpl::post_start(std::vector<std::shared_ptr<Acquisition>> made) {
  table_.will_start(made.size());
  if (loop_.post([this, made] {
        for (const auto& a : made) table_.start(a);
      }))
    return true;
  table_.will_start(-static_cast<std::ptrdiff_t>(made.size()));
  for (const auto& a : made) refuse_start(a);
  return false;
}

bool detail::RuntimeImpl::post_start(std::shared_ptr<Acquisition> a) {
  table_.will_start(1);
  if (loop_.post([this, a] { table_.start(a); })) return true;
  table_.will_start(-1);
  refuse_start(a);
  return false;
}

void detail::RuntimeImpl::refuse_start(const std::shared_ptr<Acquisition>& a) {
  a->completion.fail(std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
  admission_.end();
}

std::future<LockHandle> detail::RuntimeImpl::acquire(detail::LockSpec spec) {
  validate(spec);
  // The future form is the handler form whose handler fulfils a promise
  // (on the loop thread: no user code runs there).
  if (!spec.set.empty()) {
    admission_.check();
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
  auto [call, future] = promised_call(spec.key);
  start_handle(std::move(spec), call);
  return std::move(future);
}

std::pair<std::shared_ptr<detail::HandleCall>, std::future<LockHandle>> detail::RuntimeImpl::promised_call(
    const std::string& key) {
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
  call->key = key;
  call->complete = [p = &block->promise](std::exception_ptr e, LockHandle h) {
    std::promise<LockHandle> promise = std::move(*p);
    if (e)
      promise.set_exception(e);
    else
      promise.set_value(std::move(h));
  };
  return {std::move(call), std::move(future)};
}

LockHandle detail::RuntimeImpl::lock(detail::LockSpec spec) {
  if (direct_ == nullptr || !spec.set.empty() || spec.wait != milliseconds(0) || !spec.kind.exclusive_kind())
    return acquire(std::move(spec)).get();
  validate(spec);
  auto [call, future] = promised_call(spec.key);
  auto a = make_acquisition(std::move(spec), detail::Completion::deliver(call));
  call->runtime = weak_from_this();
  call->acquisition = a;
  if (auto l = take_here(a, *call)) return detail::HandleAccess::make(std::move(l));
  return future.get();
}

std::shared_ptr<detail::LeaseRecord> detail::RuntimeImpl::take_here(const std::shared_ptr<Acquisition>& a,
                                                                    detail::HandleCall& call) {
  const auto sent = a->started;
  std::optional<detail::Acquired> answer;
  if (direct_->lane_open_at(sent)) {
    {
      std::lock_guard lk(direct_tokens_mu_);
      a->token = direct_tokens_.next();
    }
    (void)direct_->acquire_blocking(a->ref(), [&answer](const detail::Acquired& out) { answer = out; });
  }
  if (!answer) {  // nothing sent: the way of acquire()
    begin(a);
    return nullptr;
  }
  if (answer->status != detail::Acquired::Status::kTaken || !call.claim(detail::HandleCall::kDone)) {
    // Busy, failed or perhaps taken: the loop decides as for any answer,
    // and the call's future tells.
    if (!loop_.post([this, a, out = std::move(*answer), sent] { table_.answered_direct(a, out, sent); }))
      refuse_start(a);
    return nullptr;
  }
  a->step = detail::Step::kHeld;
  auto l = table_.grant_to_caller(*a, answer->fence, sent);
  call.acquisition.reset();  // `a` keeps the call: not the other way round
  // The loop takes the lease in before its first renewal is due; until
  // then nothing wakes it for this call.
  (void)loop_.post_by([this, a, l] { table_.adopt(a, l); },  // admitted: the loop takes it
                      detail::Watchdog::adopt_by(*l, sent));
  if (admission_.stopping())  // granted as the stop began: the stop gives it back
    throw RuntimeStopped("lockwatch runtime stopped while the lock was taken");
  return l;
}

bool detail::RuntimeImpl::release_here(const std::shared_ptr<LeaseRecord>& l, LockHandle& handle) {
  const auto ended = Clock::now();
  if (direct_ == nullptr || !direct_->lane_open_at(ended) || !table_.nobody_waits() ||
      !l->mark_release_written_early())
    return false;
  const detail::LeaseLock lock(*store_, *l);
  Released status = Released::kUnconfirmed;
  std::optional<detail::StoreError> why;
  if (!direct_->release_blocking(lock.ref(), [&](Released s, const detail::StoreError* e) {
        status = s;
        if (e != nullptr) why = *e;
      })) {
    // Nothing sent: the lease is the caller's again, and the loop takes it
    // in now (the adoption may have passed it by meanwhile), before the
    // release the caller then asks of it.
    l->unmark_release_written_early();
    (void)loop_.post([this, l] { table_.adopt_lease(l); });
    return false;
  }
  const auto confirmed = Clock::now();
  detail::HandleAccess::forget(handle);
  auto end = [this, l, status, why = std::move(why), ended, confirmed] {
    table_.end_before_adoption(l, status, why ? &*why : nullptr, ended, confirmed);
  };
  if ((status == Released::kYes || status == Released::kYesUnheard) && ended < l->deadline()) {
    // Released in time: the loop only counts it, when it next looks.
    (void)loop_.post_by(std::move(end), Clock::time_point::max());
    return true;
  }
  // Not cleanly: the loop judges it (lost, unconfirmed), and the caller
  // learns its verdict as release() would tell it.
  auto verdict = l->released();
  (void)loop_.post(std::move(end));
  verdict.get();
  return true;
}

AcquireTicket detail::RuntimeImpl::acquire(detail::LockSpec spec, detail::AcquireCallback handler) {
  if (!handler) throw InvalidArgument("Runtime::async_acquire: the handler is empty");
  validate(spec);
  if (!spec.set.empty()) {
    admission_.check();
    return detail::SetAcquirer::start(*this, std::move(spec), {}, std::move(handler));
  }
  auto call = std::make_shared<detail::HandleCall>();
  call->key = spec.key;
  // Called on the loop (or the cancelling thread): the handler itself runs
  // on the notifier.
  call->complete = [notifier = std::weak_ptr<ThreadPool>(notifier_pool_), h = std::move(handler)](
                       std::exception_ptr e, LockHandle lh) mutable {
    detail::post_completion(notifier, [h = std::move(h), e, lh = std::move(lh)]() mutable { h(e, std::move(lh)); });
  };
  start_handle(std::move(spec), call);
  return detail::RuntimeAccess::ticket(std::move(call));
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

void detail::RuntimeImpl::dispatch(detail::LockSpec spec, std::shared_ptr<LockedWork> call) {
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
  if (!nested) {
    begin(a);
    return;
  }
  if (!post_start(a)) return;

  // Nested call on another key: this thread waits for the lock (every
  // acquisition completes: by reply, wait deadline or command timeout),
  // runs the work itself, and returns once the lock is released.
  std::shared_ptr<LeaseRecord> l = granted.get();
  if (l) {
    {
      detail::ThreadLeaseScope scope(this, l.get());
      l->call->run();
    }
    end_work(l);
  }
  finished.wait();
}


// ----------------------------------------------------------- operators' tools

// The key checked as a lock's would be, then the store's name for it.
std::string detail::RuntimeImpl::operator_name(const std::string& key) const {
  detail::LockSpec spec;
  spec.key = key;
  spec.ttl = milliseconds(60000);  // any valid ttl: only the key is in question
  validate(spec);
  admission_.check();
  return store_->encode(key);
}

// ---------------------------------------------------------- JobHost

detail::JobHost& detail::JobHost::of(Runtime& runtime) noexcept { return detail::RuntimeAccess::impl(runtime); }

detail::JobClaims& detail::RuntimeImpl::job_claims() { return detail::require<detail::JobClaims>(*store_, store_kind()); }

void detail::RuntimeImpl::check_lease(detail::LockSpec& spec) const {
  validate(spec);
  admission_.check();
}

// The leases this runtime hands out are its LeaseRecords.
void detail::RuntimeImpl::with_lease(const Lease& lease, const std::function<void()>& body) {
  detail::ThreadLeaseScope scope(this, static_cast<const detail::LeaseRecord*>(&lease));
  body();
}

std::string detail::RuntimeImpl::owner_token(const Lease& lease) const {
  return static_cast<const detail::LeaseRecord&>(lease).token.text().str();
}

std::string detail::RuntimeImpl::store_kind() const {
  const std::string& url = detail::store_url(options_);
  auto sep = url.find("://");
  return "the " + (sep == std::string::npos ? url : url.substr(0, sep + 3)) + " store";
}

std::future<LockState> detail::RuntimeImpl::inspect(std::string key) {
  auto promise = std::make_shared<std::promise<LockState>>();
  auto future = promise->get_future();
  auto& tools = detail::require<detail::OperatorTools>(*store_, store_kind());
  if (!loop_.post([&tools, promise, name = operator_name(key), key]() mutable {
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
  if (!store_->release_events()) return 0;
  const std::uint64_t id = next_observer_.fetch_add(1, std::memory_order_relaxed);
  if (!loop_.post([this, id, name = operator_name(key), look = std::move(look)]() mutable {
        table_.observe(id, name, std::move(look));
      }))
    return 0;
  return id;
}

void detail::RuntimeImpl::keep_observing(std::uint64_t id) {
  if (id != 0) (void)loop_.post([this, id] { table_.keep_observing(id); });
}

void detail::RuntimeImpl::unobserve_releases(std::uint64_t id) {
  if (id != 0) (void)loop_.post([this, id] { table_.unobserve(id); });
}

std::future<detail::LockInfo> detail::RuntimeImpl::inspect_info(std::string key) {
  auto promise = std::make_shared<std::promise<detail::LockInfo>>();
  auto future = promise->get_future();
  auto& tools = detail::require<detail::OperatorTools>(*store_, store_kind());
  if (!loop_.post([&tools, promise, name = operator_name(key)] {
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
  auto& tools = detail::require<detail::OperatorTools>(*store_, store_kind());
  if (!loop_.post([&tools, promise, name = operator_name(key)] {
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

void detail::RuntimeImpl::close_all() {
  if (metrics_server_) metrics_server_->close();
  clock_.close();
  store_->close();
}

void detail::RuntimeImpl::stop() {
  admission_.close();
  loop_.post([this] { table_.begin_stop(); });
  // In-flight acquisitions end by reply or command timeout; running work
  // was asked to stop and is awaited.
  admission_.wait_idle();
  pool_.shutdown();
  notifier_pool_->shutdown();  // the last handlers (RuntimeStopped) run first
  loop_.shutdown([this] { close_all(); });
  event_thread_.shutdown();  // after the loop: its last events are told
  // The loop has joined: what it owned belongs to this thread now.
  table_.clear();
}

void detail::RuntimeImpl::cancel(std::shared_ptr<detail::Acquisition> a) {
  loop_.post([this, a = std::move(a)] { table_.cancel(a); });
}

void detail::RuntimeImpl::end_work(std::shared_ptr<detail::LeaseRecord> l) { table_.work_over(l); }

void detail::RuntimeImpl::end_work(std::vector<std::shared_ptr<detail::LeaseRecord>> leases) {
  loop_.post([this, leases = std::move(leases)] {
    for (const auto& l : leases) table_.work_ended(l);
  });
}

void detail::RuntimeImpl::renew_together(std::vector<std::shared_ptr<detail::LeaseRecord>> leases) {
  loop_.post([this, leases = std::move(leases)] { table_.renew_together(leases); });
}

std::string detail::RuntimeImpl::metrics_address() const {
  return metrics_server_ ? metrics_server_->address() : std::string();
}

std::unique_ptr<Runtime> detail::RuntimeAccess::make(Options options, const StoreFactory& make_store) {
  options.validate();
  return std::unique_ptr<Runtime>(new Runtime(detail::RuntimeImpl::make(std::move(options), make_store)));
}

// ------------------------------------------------------------------ public

Runtime::Runtime(Options options) {
  options.validate();
  impl_ = Impl::make(std::move(options), &detail::make_store);
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

LockHandle Runtime::lock(LockRequest request) { return impl_->lock(spec_of(std::move(request))); }

std::future<LockHandle> Runtime::acquire(std::string key, std::chrono::milliseconds ttl) {
  return acquire(LockRequest{.key = std::move(key), .ttl = ttl});
}

AcquireTicket Runtime::async_acquire(LockRequest request, AcquireHandler handler) {
  if (!handler) throw InvalidArgument("Runtime::async_acquire: the handler is empty");
  // Shared, so that a request refused before it started still reaches it.
  auto h = std::make_shared<AcquireHandler>(std::move(handler));
  try {
    return impl_->acquire(spec_of(std::move(request)), [h](std::exception_ptr e, LockHandle lh) {
      (*h)(detail::code_of(e), e ? detail::HandleAccess::failed(e) : std::move(lh));
    });
  } catch (...) {
    // Refused before anything started: the handler learns it as it learns
    // any outcome, off this thread, and nothing is thrown.
    detail::post_completion(impl_->notifier(), [h, e = std::current_exception()] {
      (*h)(detail::code_of(e), detail::HandleAccess::failed(e));
    });
    return AcquireTicket();
  }
}

void Runtime::async_acquire(LockRequest request, std::shared_ptr<LockedWork> work) {
  if (!work) throw InvalidArgument("Runtime::async_acquire: the work is empty");
  try {
    impl_->dispatch(spec_of(std::move(request)), work);
  } catch (...) {
    // Refused before anything started (InvalidArgument, Unsupported,
    // RuntimeStopped): the work learns it, and nothing is thrown.
    work->finish(std::current_exception());
  }
}

MetricsPattern::MetricsPattern(std::string_view text) noexcept : id_(detail::pattern_id(text)) {}

bool AcquireTicket::cancel() noexcept {
  if (!call_ || !call_->claim(detail::HandleCall::kCancelled)) return false;
  try {
    call_->deliver(std::make_exception_ptr(Cancelled(call_->key)), LockHandle());
    if (call_->cancel_set) call_->cancel_set();  // a set: the key it is taking now
    // Out of the wait queue, on the loop. A pending acquisition keeps its
    // runtime from stopping, so the runtime is there.
    if (auto a = call_->acquisition.lock()) {
      if (auto rt = call_->runtime.lock()) rt->cancel(std::move(a));
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
    failure_ = std::move(other.failure_);
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
  detail::HandleAccess::release(*this, [h = std::move(handler)](std::exception_ptr e) { h(detail::code_of(e)); });
}

void detail::HandleAccess::release(LockHandle& h, std::function<void(std::exception_ptr)> handler) {
  if (!h.state_) throw InvalidArgument("LockHandle::release() on a handle that holds no lock");
  if (!handler) throw InvalidArgument("LockHandle::release: the handler is empty");
  auto state = std::move(h.state_);
  state->released(std::move(handler));
  if (h.set_) {
    detail::SetRecord::release_keys(std::static_pointer_cast<detail::SetRecord>(std::move(state)));
    return;
  }
  if (auto rt = state->runtime()) {
    rt->end_work(std::static_pointer_cast<detail::LeaseRecord>(std::move(state)));
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

void LockHandle::unlock() {
  if (!state_) throw InvalidArgument("LockHandle::unlock() on a handle that holds no lock");
  if (!set_) {
    auto l = std::static_pointer_cast<detail::LeaseRecord>(state_);
    if (auto rt = l->runtime(); rt && rt->release_here(l, *this)) return;
  }
  release().get();
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
    rt->end_work(std::static_pointer_cast<detail::LeaseRecord>(std::move(state)));
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

const Options& Runtime::options() const noexcept { return impl_->options(); }
ThreadPool& Runtime::pool() noexcept { return impl_->pool(); }
std::string Runtime::metrics_text() const { return impl_->render_metrics(); }
std::string Runtime::metrics_address() const {
  return impl_->metrics_address();
}
void Runtime::add_observer(std::shared_ptr<Observer> observer) { impl_->add_observer(std::move(observer)); }

std::size_t Runtime::held_leases() const noexcept { return impl_->held(); }

RuntimeStats Runtime::stats() const noexcept {
  const auto& c = impl_->stats();
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

}  // namespace lockwatch
