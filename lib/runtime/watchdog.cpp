#include "runtime/watchdog.hpp"

#include <array>
#include <cassert>
#include <cstring>
#include <limits>
#include <utility>

#include "core/loop.hpp"
#include "core/timing.hpp"
#include "runtime/handoff.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

void LeaseRecord::run(Timeout) noexcept {
  // Set at grant, before the loop runs the wheel again (LockTable::start_lease).
  assert(links && links->watchdog);
  links->watchdog->on_timer(this);
}

Watchdog::Watchdog(LockStore& store, WheelClock& clock, ThreadPool& notifier, const Options& options,
                   StatsCounters& stats, Events& events, Decisions& decisions)
    : store_(store),
      clock_(clock),
      notifier_(notifier),
      options_(options),
      stats_(stats),
      events_(events),
      decisions_(decisions) {}

std::shared_ptr<LeaseRecord> Watchdog::new_lease(const Acquisition& a, std::uint64_t fence,
                                                Clock::time_point deadline, Clock::time_point last_sent) {
  assert(a.step == Step::kHeld && "a lease is made only for an acquisition whose wait ended in a grant");
  auto l = std::make_shared<LeaseRecord>(a.spec.key, fence, a.spec.ttl, deadline);
  using Way = Completion::Way;
  const Completion& how = a.completion;
  l->call = how.work();  // none for a handle: its lease is its own state
  l->set_pattern(a.spec.pattern);
  l->renewals_left =
      a.spec.retries > std::numeric_limits<std::int32_t>::max() ? -1 : static_cast<std::int32_t>(a.spec.retries);
  // The wheel fires on the first tick at or after a deadline. A renewal must
  // not lose that tick out of the little time it has: it is due a tick less
  // one nanosecond early, so it goes on the last tick at or before its time.
  // A deadline is set a tick (less one nanosecond) early for the same
  // reason (deadline_of), so remaining() reads what the holder has.
  l->renew_after = renew_after(options_.watchdog, a.spec.ttl, a.spec.renew_weight) - (clock_.tick() - Clock::duration(1));
  l->last_sent = last_sent;
  l->no_handoff = !a.spec.handoff;
  if (how.way() == Way::kPool) l->queue_for_worker();
  if (const auto* w = how.inline_wait()) l->rare().finished = w->finished;
  if (!a.spec.context.empty()) l->rare().context = a.spec.context;
  l->granted_at = Clock::now();
  stats_.acquired.fetch_add(1, std::memory_order_relaxed);
  return l;
}

void Watchdog::warn_on_hold(LeaseRecord& l, const std::string& key) {
  if (options_.observability.hold_warning.count() <= 0) return;
  auto& w = l.rare().hold_warning = std::make_unique<HoldWarning>(events_, key, l.granted_at);
  w->timeout = clock_.at(*w, l.granted_at + options_.observability.hold_warning);
}

Watchdog::Clock::time_point Watchdog::deadline_of(Clock::time_point sent, std::chrono::milliseconds ttl) const {
  return lease_deadline(options_.watchdog, sent, ttl) - (clock_.tick() - Clock::duration(1));
}

std::shared_ptr<LeaseRecord> Watchdog::grant(const Acquisition& a, std::uint64_t fence, Clock::time_point sent) {
  auto l = new_lease(a, fence, deadline_of(sent, a.spec.ttl), sent);
  warn_on_hold(*l, a.spec.key);
  l->token = PackedToken(a.token);
  l->kind = a.spec.kind;
  l->slot = static_cast<std::uint32_t>(leases_.size());
  leases_.push_back(l);
  stats_.held.fetch_add(1, std::memory_order_relaxed);
  schedule_next(*l, sent);
  return l;
}

std::shared_ptr<LeaseRecord> Watchdog::grant_to_caller(const Acquisition& a, std::uint64_t fence,
                                                       Clock::time_point sent) {
  auto l = new_lease(a, fence, deadline_of(sent, a.spec.ttl), sent);
  l->token = PackedToken(a.token);
  l->kind = a.spec.kind;
  l->keep_for_caller();
  stats_.held.fetch_add(1, std::memory_order_relaxed);
  return l;
}

void Watchdog::adopt(const std::shared_ptr<LeaseRecord>& l) {
  warn_on_hold(*l, l->key());
  l->slot = static_cast<std::uint32_t>(leases_.size());
  leases_.push_back(l);
  schedule_next(*l, l->last_sent);
}

bool Watchdog::can_hand_off(const LeaseRecord& l, Clock::time_point now) const {
  if (l.lost() || l.release_in_flight || l.slot == LeaseRecord::kNoSlot || l.renewal_failing()) return false;
  auto left = l.deadline() - now;
  switch (l.phase) {
    case LeaseRecord::Phase::kRenewDue:
    case LeaseRecord::Phase::kAwaitingReply:
      return left > clock_.tick();
    case LeaseRecord::Phase::kExhausted:
      // The next holder renews from here on: leave it time to.
      return left > std::chrono::duration_cast<Clock::duration>(l.ttl()) / 2;
    default:
      return false;
  }
}

std::shared_ptr<LeaseRecord> Watchdog::hand_off(const std::shared_ptr<LeaseRecord>& from, const Acquisition& a,
                                                std::uint64_t fence) {
  auto l = new_lease(a, fence, from->deadline(), from->last_sent);
  warn_on_hold(*l, a.spec.key);
  l->token = from->token;
  l->kind = from->kind;  // exclusive: only those are handed on
  l->renewal_in_doubt = from->renewal_in_doubt;  // its renewals were the key's
  l->rare().streak = streak_of(*from);
  l->streak()->holder = l;
  // `l` takes `from`'s place: `from` ends without a release.
  from->step = Step::kEnded;
  clock_.cancel(*from);
  l->slot = from->slot;
  leases_[l->slot] = l;
  from->slot = LeaseRecord::kNoSlot;
  events_.released(from->key(), l->granted_at - from->granted_at, from->pattern(), from->fencing_token(),
                   from->context(), false);
  if (from->phase == LeaseRecord::Phase::kAwaitingReply) {
    // Its reply comes to `l` (through the streak).
    schedule(*l, LeaseRecord::Phase::kAwaitingReply, l->deadline());
  } else {
    schedule_next(*l, l->last_sent);
  }
  return l;
}

std::shared_ptr<HandOffStreak> Watchdog::streak_of(LeaseRecord& l) {
  auto& s = l.rare().streak;
  if (!s) {
    s = std::make_shared<HandOffStreak>();
    s->started = l.granted_at;
  }
  // A lease that is given a streak now is its holder (renewal replies sent
  // for it are the streak's current holder's).
  if (s->holder.expired()) s->holder = leases_[l.slot];
  return s;
}

bool Watchdog::may_renew(const LeaseRecord& l) const noexcept {
  // Renewals while the work waits for a worker are free.
  return l.renewals_left != 0 || !l.started();
}

Watchdog::Clock::duration Watchdog::most_early(std::chrono::milliseconds ttl) noexcept {
  return std::chrono::duration_cast<Clock::duration>(ttl) / 20;
}

Watchdog::Clock::time_point Watchdog::adopt_by(const LeaseRecord& l, Clock::time_point sent) noexcept {
  return sent + l.renew_after - most_early(l.ttl());
}

Watchdog::Clock::time_point Watchdog::coalesced(Clock::time_point at, std::chrono::milliseconds ttl) const noexcept {
  // Up to a twentieth of the ttl early, down to a point of a grid shared by
  // every lease whose ttl gives it that grid: the tick times a power of two
  // (so the grids of other ttls nest in it). Renewals due apart then come
  // due in one tick and go out in one batch, one wake-up for many leases;
  // renewing early only widens the time left to confirm a renewal.
  if (ttl != grid_ttl_) {
    const Clock::duration tick = clock_.tick();
    const Clock::duration most = most_early(ttl);
    Clock::duration grid{};
    if (tick > Clock::duration::zero() && most >= 2 * tick) {
      grid = tick;
      while (grid * 2 <= most) grid *= 2;
    }
    grid_ttl_ = ttl;
    grid_ = grid;
  }
  if (grid_ == Clock::duration::zero()) return at;
  const Clock::duration since = at.time_since_epoch();
  return Clock::time_point(since - since % grid_);
}

void Watchdog::schedule_next(LeaseRecord& l, Clock::time_point extended_at) {
  if (may_renew(l)) {
    schedule(l, LeaseRecord::Phase::kRenewDue, coalesced(extended_at + l.renew_after, l.ttl()));
  } else {
    schedule(l, LeaseRecord::Phase::kExhausted, l.deadline());
  }
}

void Watchdog::schedule(LeaseRecord& l, LeaseRecord::Phase phase, Clock::time_point at) {
  l.phase = phase;
  clock_.at(l, at);
}

void Watchdog::on_timer(LeaseRecord* raw) {
  // A lease's timer runs only while the lease is held (finish() cancels
  // it): the registry has its owning pointer.
  if (raw->slot == LeaseRecord::kNoSlot) return;
  std::shared_ptr<LeaseRecord> l = leases_[raw->slot];  // kept alive to the end
  auto now = Clock::now();
  if (l->work_over() || l->release_written()) {
    if (!l->release_written() && !l->release_in_flight && !l->awaiting_tokens) {
      // Release could not be confirmed; the key has expired by now.
      if (l->phase == LeaseRecord::Phase::kAwaitingExpiry) finish(l);
      return;
    }
    // The release is in flight, maybe behind a long queue: keep the key
    // alive until it is done. Nothing is judged any more: the work is over.
    if ((l->phase == LeaseRecord::Phase::kRenewDue || l->phase == LeaseRecord::Phase::kRetryDue) &&
        now < l->deadline())
      send_renew(l, now);
    return;
  }
  if (now >= l->deadline() && l->phase == LeaseRecord::Phase::kAwaitingReply && drained_at_ != clock_.advances()) {
    // The loop may have stalled: it runs timers before it reads sockets, so
    // a confirmation that arrived in time may be unread. Read first (once
    // per tick), then judge.
    drained_at_ = clock_.advances();
    store_.poll_replies();
    if (l->lost() || l->work_over() || l->phase != LeaseRecord::Phase::kAwaitingReply) return;
    now = Clock::now();
  }
  if (now >= l->deadline()) {
    lose(l, l->phase == LeaseRecord::Phase::kExhausted ? LostReason::kRenewalsExhausted : LostReason::kStoreUnreachable,
         l->lost_detail());
    return;
  }
  switch (l->phase) {
    case LeaseRecord::Phase::kRenewDue:
      if (!l->started() && now - l->granted_at >= options_.runtime.queue_timeout && l->give_up_start()) {
        // Granted, renewed, and still no worker to run it: the pool is full
        // of work that may be waiting for this very call. Give the lock back
        // and answer the call, rather than hold the key with nothing running.
        lose(l, LostReason::kNotStarted,
             "no pool worker was free within Options::runtime.queue_timeout (" +
                 std::to_string(options_.runtime.queue_timeout.count()) +
                 " ms); is a locked call blocking its worker on another locked call?");
        if (end_work(l)) release_ended(l);  // lost: nobody here takes it over
        break;
      }
      if (!may_renew(*l)) {  // the work started meanwhile, with its renewals spent
        schedule(*l, LeaseRecord::Phase::kExhausted, l->deadline());
        break;
      }
      l->renewal_counts = l->started();
      send_renew(l, now);
      break;
    case LeaseRecord::Phase::kRetryDue:
      send_renew(l, now);  // the same renewal again: it counts as it did
      break;
    default:
      schedule(*l, l->phase, l->deadline());
      break;
  }
}

void Watchdog::renew_at_start(const std::shared_ptr<LeaseRecord>& l, std::shared_ptr<std::promise<void>> answered) {
  // The work starts late (it waited for a worker): renew now, for free, so
  // that it runs with a whole ttl, not what the queue left of one.
  if (l->slot == LeaseRecord::kNoSlot || l->lost() || l->work_over() || l->phase != LeaseRecord::Phase::kRenewDue) {
    answered->set_value();
    return;
  }
  l->rare().start_renewal = std::move(answered);
  clock_.cancel(*l);
  l->renewal_counts = false;
  send_renew(l);
}

void Watchdog::renew_together(const std::vector<std::shared_ptr<LeaseRecord>>& leases) {
  for (const auto& l : leases) {
    if (l->slot == LeaseRecord::kNoSlot || l->lost() || l->work_over() || l->phase != LeaseRecord::Phase::kRenewDue)
      continue;  // in flight or ending: it keeps its own time
    clock_.cancel(*l);
    l->renewal_counts = false;  // free, as a late start's renewal is
    send_renew(l);
  }
}

void Watchdog::send_renew(const std::shared_ptr<LeaseRecord>& l, Clock::time_point now) {
  l->last_sent = now;
  // Before any release went out: until the store answers it, it may run
  // after a release that was never written. Sent after, it runs after
  // that release, and finds the key gone, or is harmless with it.
  if (!l->release_in_flight && !l->release_written()) l->renewal_in_doubt = true;
  schedule(*l, LeaseRecord::Phase::kAwaitingReply, l->deadline());
  due_.push_back(l);
}

void Watchdog::flush() {
  // Every renewal that came due in this tick shares one batch (in chunks,
  // so one script never holds the store for long).
  constexpr std::size_t kChunk = 512;
  if (due_.empty()) return;
  // Nobody waits for a renewal's reply: the I/O thread need not poll for it.
  const Loop::Background background;
  for (std::size_t from = 0; from < due_.size(); from += kChunk) {
    // Read for each chunk (a tick may renew a million leases): the store
    // runs each renewal after it.
    const auto sent = Clock::now();
    auto first = due_.begin() + static_cast<std::ptrdiff_t>(from);
    auto last = due_.begin() + static_cast<std::ptrdiff_t>(std::min(due_.size(), from + kChunk));
    // The batch keeps its leases, and the text their LockRefs view, alive
    // until the store answered every one.
    auto batch = std::make_shared<RenewBatch>();
    batch->leases.assign(std::make_move_iterator(first), std::make_move_iterator(last));
    refer(*batch, sent);
    stats_.renewals_sent.fetch_add(batch->leases.size(), std::memory_order_relaxed);
    const auto* leases = &batch->leases;
    auto commands = store_.renew(refs_, batch, [this, leases, sent](std::size_t k, Renewed status, const StoreError* why) {
      on_renew_result((*leases)[k], sent, status, why);
    });
    stats_.renew_commands.fetch_add(commands, std::memory_order_relaxed);
  }
  due_.clear();  // keeps its capacity for the next tick
}

void Watchdog::refer(RenewBatch& batch, Clock::time_point sent) {
  // The records keep neither the store's names nor the text of the tokens
  // and ttls (a million held leases would pay for it): it is written here,
  // once per renewal, into one block that the LockRefs view.
  //
  // Each lease's last_sent becomes its chunk's time: its timer read the
  // clock earlier in the tick, before the timers after it ran, and a key
  // is counted gone a ttl after the last request that could extend it.
  const KeyRules& keys = store_.traits().keys;
  const std::size_t per_lease =
      keys.prefix.size() + (keys.braces ? 2 : 0) + PackedToken::kTextSize + TtlText::kMaxSize;
  std::size_t bytes = 0;
  for (const auto& l : batch.leases) bytes += per_lease + l->key().size();
  batch.text = std::make_unique_for_overwrite<char[]>(bytes);
  char* at = batch.text.get();
  refs_.clear();
  refs_.reserve(batch.leases.size());
  // The leases of a chunk mostly share a ttl: its text is made once.
  std::chrono::milliseconds ttl_of{-1};
  std::array<char, TtlText::kMaxSize> ttl_text{};
  std::size_t ttl_size = 0;
  for (const auto& l : batch.leases) {
    l->last_sent = sent;
    char* const name = at;
    for (std::string_view part : keys.name_parts(l->key())) {
      if (!part.empty()) std::memcpy(at, part.data(), part.size());
      at += part.size();
    }
    char* const token = at;
    char* const ttl = l->token.write(token);
    if (l->ttl() != ttl_of) {
      ttl_of = l->ttl();
      ttl_size = static_cast<std::size_t>(TtlText::write(ttl_of, ttl_text.data()) - ttl_text.data());
    }
    std::memcpy(ttl, ttl_text.data(), ttl_size);
    at = ttl + ttl_size;
    refs_.push_back(LockRef{std::string_view(name, static_cast<std::size_t>(token - name)),
                            std::string_view(token, PackedToken::kTextSize),
                            std::string_view(ttl, static_cast<std::size_t>(at - ttl)), l->ttl(), l->kind});
  }
}

void Watchdog::on_renew_result(const std::shared_ptr<LeaseRecord>& sent_for, Clock::time_point sent,
                               Renewed status, const StoreError* why) {
  // Sent for a lease since handed on locally: the answer is the current
  // holder's (the store's key is the same).
  std::shared_ptr<LeaseRecord> current;
  if (sent_for->streak() && sent_for->slot == LeaseRecord::kNoSlot) {
    current = sent_for->streak()->holder.lock();
    if (!current) return;
  }
  const auto& l = current ? current : sent_for;
  // A worker waiting on the renewal made at the start goes on once it is
  // answered, whatever became of it (a lost lease shows in the lease).
  auto answered = status != Renewed::kTransient ? l->take_start_renewal() : nullptr;
  on_renew_result_now(l, sent, status, why);
  if (answered) answered->set_value();
}

void Watchdog::on_renew_result_now(const std::shared_ptr<LeaseRecord>& l, Clock::time_point sent, Renewed status,
                                   const StoreError* why) {
  if ((l->work_over() && !l->release_in_flight && !l->awaiting_tokens) || l->lost()) return;
  switch (status) {
    case Renewed::kYes:
      on_renewed(l, sent);
      break;
    case Renewed::kGone:
    case Renewed::kTakenByOther:
      l->renewal_in_doubt = false;  // the server is past what was written before
      // With the work over and the release in flight, the release's own
      // answer says what became of the key.
      if (!l->work_over() && !l->release_written())
        lose(l, status == Renewed::kTakenByOther ? LostReason::kTakenByOther : gone_reason(*l));
      break;
    case Renewed::kTransient:
      renewal_failed(l, why != nullptr ? why->describe() : std::string("the renewal was not confirmed"));
      break;
  }
}

LostReason Watchdog::gone_reason(const LeaseRecord& l) const noexcept {
  // No store can say who deleted a key. The answer came back before the
  // local deadline (the last confirmed extension's send time plus the ttl,
  // less the drift allowance), so the store handled the request before the
  // key could have expired there: someone removed it. Past the deadline it
  // may simply have run out.
  return Clock::now() < l.deadline() ? LostReason::kRemoved : LostReason::kExpired;
}

void Watchdog::renewal_failed(const std::shared_ptr<LeaseRecord>& l, std::string why) {
  // Transient until the local deadline: one lost reply must not cost the
  // lease, so try again a tick later.
  events_.renewal_failed(l->key(), why);
  l->set_lost_detail(std::move(why));
  clock_.cancel(*l);
  auto next = std::min(Clock::now() + options_.watchdog.tick, l->deadline());
  schedule(*l, LeaseRecord::Phase::kRetryDue, next);
}

void Watchdog::on_renewed(const std::shared_ptr<LeaseRecord>& l, Clock::time_point sent) {
  clock_.cancel(*l);
  // Answered: a server that hung has run what it read before it answers
  // what came after.
  l->renewal_in_doubt = false;
  auto left = l->deadline() - Clock::now();
  // The new deadline first: a work that sees the renewal counted
  // (Lease::renewals) reads the deadline it brought (Lease::remaining).
  l->set_deadline(deadline_of(sent, l->ttl()));
  if (l->renewal_counts) {
    if (l->renewals_left > 0) --l->renewals_left;
    l->bump_renewals();
  }
  events_.renewed(l->key(), left);
  auto slack = std::chrono::duration_cast<std::chrono::microseconds>(left).count();
  if (slack < stats_.min_renewal_slack_us.load(std::memory_order_relaxed))
    stats_.min_renewal_slack_us.store(slack, std::memory_order_relaxed);
  l->set_lost_detail({});
  schedule_next(*l, sent);
}

void Watchdog::lose(const std::shared_ptr<LeaseRecord>& l, LostReason reason, std::string detail) {
  if (auto answered = l->take_start_renewal()) answered->set_value();
  if (!l->mark_lost(reason)) return;
  stats_.leases_lost.fetch_add(1, std::memory_order_relaxed);
  if (l->slot != LeaseRecord::kNoSlot) {  // held no more, whatever its release does
    l->uncounted = true;
    stats_.held.fetch_sub(1, std::memory_order_relaxed);
  }
  clock_.cancel(*l);
  events_.lost(l->key(), reason, detail, Clock::now() - l->granted_at, l->fencing_token(), l->context());
  l->set_lost_detail(std::move(detail));
  request_stop(l);
  l->end_watchers(reason);  // Lease::on_lost's handlers, on the notifier
  // Work that is over learns it now: its release (in flight, or awaiting
  // the key's expiry) goes on without it.
  if (l->work_over()) l->complete_call();
}

void Watchdog::request_stop(const std::shared_ptr<LeaseRecord>& l) {
  // Stop callbacks are user code: run them off the loop.
  try {
    notifier_.post([l] { l->request_stop(); });
  } catch (...) {
    l->request_stop();
  }
}

bool Watchdog::end_work(const std::shared_ptr<LeaseRecord>& l, Clock::time_point ended) {
  if (l->work_over()) return false;
  l->step = Step::kReleasing;
  // Work that ended past the local deadline did not end under its lease,
  // whatever the store says of the key afterwards: a starved or paused
  // process runs the watchdog late, and the lease's timer no longer judges
  // once the work is over. Unless a renewal's answer is still to come
  // (unread behind a stalled loop, it may extend the deadline past the
  // end), that is decided now; otherwise at the release's answer.
  if (!l->lost()) {
    const auto now = ended;
    if (now >= l->deadline()) {
      if (l->phase == LeaseRecord::Phase::kAwaitingReply)
        l->rare().work_ended_late = now;
      else
        lose_past_deadline(l);
    }
  }
  return true;
}

void Watchdog::release_ended(const std::shared_ptr<LeaseRecord>& l) {
  // Lost already: the caller learns it at once, not after the release.
  if (l->lost()) l->complete_call();
  release(l);
}

void Watchdog::lose_past_deadline(const std::shared_ptr<LeaseRecord>& l) {
  lose(l, l->phase == LeaseRecord::Phase::kExhausted ? LostReason::kRenewalsExhausted : LostReason::kStoreUnreachable,
       "the work ended after the lease's local deadline (was the process starved or paused?)");
}

void Watchdog::judge_late_end(const std::shared_ptr<LeaseRecord>& l) {
  const auto* r = l->rare_if();
  if (r == nullptr || l->lost() || r->work_ended_late == Clock::time_point{}) return;
  // The renewal that was unanswered at the work's end is answered by now
  // (it was sent before the release): did it move the deadline past the end?
  if (r->work_ended_late >= l->deadline()) lose_past_deadline(l);
}

void Watchdog::release(const std::shared_ptr<LeaseRecord>& l) {
  l->awaiting_tokens = false;
  l->release_in_flight = true;
  const LeaseLock lock(store_, *l);
  LockRef ref = lock.ref();
  // The registry keeps the lease until its release is answered (nothing
  // else finishes it meanwhile), so its address is all the answer needs:
  // trivially copied and small, std::function keeps it inline (no heap
  // block per release).
  assert(l->slot != LeaseRecord::kNoSlot);
  store_.release(std::span<const LockRef>(&ref, 1), true,
                 [this, raw = l.get()](std::size_t, Released status, const StoreError* why) {
                   assert(raw->slot != LeaseRecord::kNoSlot && raw->release_in_flight);
                   const std::shared_ptr<LeaseRecord> held = leases_[raw->slot];  // finish() drops the registry's
                   released(held, status, why);
                 });
}

void Watchdog::release_written(const std::shared_ptr<LeaseRecord>& l, Released status, const StoreError* why,
                               Clock::time_point confirmed) {
  // The loop knows of the work's end now (end_work() ran): from here on the
  // lease is as one whose release the loop sent.
  l->unmark_release_written();
  if (l->lost()) l->complete_call();  // as release_ended()
  released(l, status, why, confirmed);
}

void Watchdog::released(const std::shared_ptr<LeaseRecord>& l, Released status, const StoreError* why,
                        Clock::time_point confirmed) {
  l->release_in_flight = false;
  clock_.cancel(*l);
  judge_late_end(l);
  if (status == Released::kUnconfirmed) {
    const std::string detail = "release not confirmed: " + (why != nullptr ? why->describe() : std::string());
    if (!l->lost() && !store_.expiry_bounded())
      lose(l, LostReason::kStoreUnreachable,
           detail + "; the store may keep the lock past its ttl, so it is not counted released");
    else if (!l->lost() && l->renewal_in_doubt)
      lose(l, LostReason::kStoreUnreachable,
           detail + "; a renewal written before it has no answer and may still extend the key, so it is not "
                    "counted released");
    else if (!l->lost())
      l->set_lost_detail(detail);
    // The key expires at most the store's expiry bound (the ttl, or more
    // where the store rounds it up) after our last request that could have
    // extended it. Complete then, never earlier. A lease lost already was
    // never counted on past its ttl: it completes at that.
    const auto keep = l->lost() ? l->ttl() : store_.expiry_bound(l->ttl());
    schedule(*l, LeaseRecord::Phase::kAwaitingExpiry,
             std::max(Clock::now(), gone_by(options_.watchdog, l->last_sent, l->ttl(), keep)));
    return;
  }
  if (status == Released::kYesUnheard) {
    // Nobody elsewhere heard of it: our waiters, if any, need not sit out
    // for others (there are none to wait for).
    l->yield_on_release = false;
  } else if (status != Released::kYes) {
    lose(l, status == Released::kTakenByOther ? LostReason::kTakenByOther : gone_reason(*l), "found at release");
  }
  finish(l, confirmed);
}

void Watchdog::finish(const std::shared_ptr<LeaseRecord>& l, Clock::time_point ended) {
  l->step = Step::kEnded;
  clock_.cancel(*l);
  if (l->rare_if() && l->rare().hold_warning) l->rare().hold_warning->timeout.cancel();
  if (l->slot == LeaseRecord::kNoSlot) return;
  // Out of the registry: the last lease takes this one's slot.
  auto& last = leases_.back();
  last->slot = l->slot;
  std::swap(leases_[l->slot], last);
  l->slot = LeaseRecord::kNoSlot;
  leases_.pop_back();  // may drop the last reference: `l` is the caller's
  // Leases given back by the hundred thousand give their slots' memory back.
  if (leases_.capacity() >= 65536 && leases_.size() < leases_.capacity() / 4) leases_.shrink_to_fit();
  if (!l->uncounted) stats_.held.fetch_sub(1, std::memory_order_relaxed);
  // A lost lease's hold span ended with kLost already.
  if (ended == Clock::time_point{}) ended = Clock::now();
  events_.released(l->key(), ended - l->granted_at, l->pattern(), l->fencing_token(), l->context(), l->lost());
  decisions_.finished(l);
}

std::vector<std::shared_ptr<LeaseRecord>> Watchdog::stop_all() {
  std::vector<std::shared_ptr<LeaseRecord>> handles;
  for (auto& l : leases_) {
    // A handle released already (its release unconfirmed, waiting out the
    // ttl in kAwaitingExpiry) keeps its timer: losing it would cancel the one
    // thing that finishes it.
    if (l->is_handle() && !l->work_over()) handles.push_back(l);
    request_stop(l);
  }
  return handles;
}

}  // namespace lockwatch::detail
