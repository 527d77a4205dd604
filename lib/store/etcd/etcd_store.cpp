#include "store/etcd/etcd_store.hpp"

#include <algorithm>
#include <charconv>
#include <vector>

#include "core/countdown.hpp"
#include "core/loop.hpp"
#include "store/etcd/etcd_error.hpp"

namespace lockwatch::detail {

namespace {

using std::chrono::milliseconds;

constexpr int kPeriodKeyAttempts = 5;  // the period key changed under us, still lower: read again

using Compares = google::protobuf::RepeatedPtrField<etcdserverpb::Compare>;

// A compare of `key`'s `target` added to `compares`, its operand for the
// caller to set.
etcdserverpb::Compare* compare(Compares* compares, const std::string& key, etcdserverpb::Compare::CompareTarget target,
                               etcdserverpb::Compare::CompareResult result = etcdserverpb::Compare::EQUAL) {
  auto* c = compares->Add();
  c->set_key(key);
  c->set_target(target);
  c->set_result(result);
  return c;
}

// The transaction goes ahead only if `key`'s value is ours: "<token>\n...".
void compare_ours(Compares* compares, const std::string& key, std::string_view token) {
  using C = etcdserverpb::Compare;
  compare(compares, key, C::VALUE, C::GREATER)->set_value(std::string(token) + '\n');
  compare(compares, key, C::VALUE, C::LESS)->set_value(std::string(token) + '\v');
}

// Whether a lock's value is ours (see compare_ours).
bool is_ours(std::string_view value, std::string_view token) {
  return value.size() > token.size() && value.starts_with(token) && value[token.size()] == '\n';
}

// The key's value in the Range a transaction answered with, if it was there.
const mvccpb::KeyValue* ranged(const etcdserverpb::TxnResponse& response) {
  if (response.responses_size() < 1 || !response.responses(0).has_response_range()) return nullptr;
  const auto& range = response.responses(0).response_range();
  return range.kvs_size() > 0 ? &range.kvs(0) : nullptr;
}

// If absent: put. Else, if ours (the same request again): read it, then
// put it on the new lease (a put keeps the create_revision, so the fence
// stays, and the key leaves its old lease). Else: read it.
etcdserverpb::TxnRequest acquisition(const std::string& name, std::string_view token, std::string value,
                                     std::int64_t lease) {
  etcdserverpb::TxnRequest txn;
  compare(txn.mutable_compare(), name, etcdserverpb::Compare::CREATE)->set_create_revision(0);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(name);
  put->set_value(std::move(value));
  put->set_lease(lease);
  auto* present = txn.add_failure()->mutable_request_txn();
  compare_ours(present->mutable_compare(), name, token);
  present->add_success()->mutable_request_range()->set_key(name);
  *present->add_success()->mutable_request_put() = *put;
  present->add_failure()->mutable_request_range()->set_key(name);
  return txn;
}

}  // namespace

std::int64_t EtcdStore::lease_seconds(milliseconds ttl) noexcept {
  return std::max<std::int64_t>(1, (ttl.count() + 999) / 1000);
}

EtcdStore::EtcdStore(Loop& loop, EtcdTarget target, const StoreSettings& settings)
    : StoreBase(StoreTraits{
          .keys = KeyRules{.prefix = settings.key_prefix,
                           .max_name = kMaxNameBytes,
                           .too_long = "the lock name (key_prefix + key) is longer than the 32 KiB an etcd:// store "
                                       "takes (a transaction names it six times, and etcd refuses requests over "
                                       "1.5 MiB by default)"},
          .release_events = true,
          .expiry = {.unit = std::chrono::seconds(1), .slack = kExpirySlack, .bounded = false}}),
      loop_(loop),
      client_(std::make_unique<EtcdClient>(loop, target, settings)),
      clock_(std::make_unique<EtcdClock>(loop, std::move(target), settings)),
      owner_(settings.owner_name) {
  offer({.job_claims = this, .operator_tools = this, .lock_listing = this});
}

void EtcdStore::started() {
  clock_->warm();
  client_->set_state_hook([this](const std::string& endpoint, bool up, const std::string& why) {
    if (!closed_ && events_.connection) events_.connection(endpoint, up, why);
  });
}

// ---- acquire

void EtcdStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto shared_done = std::make_shared<AcquireDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i)
    acquire_one(std::string(locks[i].name), std::string(locks[i].token), locks[i].ttl,
                [shared_done, i](const Acquired& result) { (*shared_done)(i, result); });
}

void EtcdStore::acquire_one(std::string name, std::string token, milliseconds ttl, AcquireOne done) {
  client_->lease_grant(lease_seconds(ttl), [this, name = std::move(name), token = std::move(token), ttl,
                                            done = std::move(done)](const auto& granted,
                                                                    const StoreError* err) mutable {
    if (err) return done(Acquired::failed(*err));
    if (!granted.error().empty() || granted.id() == 0)
      return done(Acquired::failed(StoreError::refused(client_->name(), "LeaseGrant: " + granted.error())));
    const std::int64_t lease = granted.id();
    auto txn = acquisition(name, token, value_of(token), lease);
    client_->txn(std::move(txn), [this, name, token, ttl, lease, done = std::move(done)](
                                     const auto& response, const StoreError* err) mutable {
      // The inner transaction of the failure branch (unset: protobuf's empty one).
      const auto& inner = response.responses_size() > 0 ? response.responses(0).response_txn()
                                                        : etcdserverpb::TxnResponse::default_instance();
      const mvccpb::KeyValue* kv = ranged(inner);
      const bool again = kv != nullptr && inner.succeeded();  // ours already: now on the new lease
      if (response.succeeded() || again) {
        if (again && kv->lease() != lease) revoke(kv->lease());  // the old lease goes
        held_[name] = Held{token, lease};
        const std::int64_t fence = again ? kv->create_revision() : response.header().revision();
        return done(Acquired::taken(static_cast<std::uint64_t>(fence)));
      }
      // Whether the write was made (no answer) is unknown: revoking the
      // lease takes the key away with it if it was.
      revoke(lease);
      if (err) return done(Acquired::failed(*err));
      // Not absent, yet not there in the same transaction: an answer that cannot be.
      if (kv == nullptr)
        return done(
            Acquired::failed(StoreError::refused(client_->name(), "the acquisition's transaction answered no key")));
      if (kv->lease() == 0) return done(Acquired::busy(ttl));  // a key without a lease (not lockwatch's)
      client_->lease_time_to_live(kv->lease(), [ttl, done = std::move(done)](const auto& left, const StoreError* err) {
        // etcd answers whole seconds, rounded down: a second more is the
        // bound. Without an answer, the ttl asked for.
        done(Acquired::busy(err ? ttl : left.ttl() <= 0 ? milliseconds(1) : milliseconds((left.ttl() + 1) * 1000)));
      });
    });
  });
}

void EtcdStore::revoke(std::int64_t lease, int attempts_left) {
  if (closed_ || lease == 0) return;
  // A lease whose revoke got no answer keeps its key until it expires,
  // which a leader change postpones: try again, on the next member.
  client_->lease_revoke(lease, [this, lease, attempts_left](const auto&, const StoreError* err) {
    if (err != nullptr && err->unavailable() && attempts_left > 1 && !closed_) revoke(lease, attempts_left - 1);
  });
}

// ---- renew

std::size_t EtcdStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) {
  std::vector<std::int64_t> ids;
  std::vector<std::size_t> which;     // the lock of each id
  std::vector<std::size_t> not_held;  // locks this store holds no lease for
  for (std::size_t i = 0; i < locks.size(); ++i) {
    auto it = held_.find(locks[i].name);
    if (it == held_.end() || it->second.token != locks[i].token) {
      not_held.push_back(i);
      continue;
    }
    ids.push_back(it->second.lease);
    which.push_back(i);
  }
  if (!not_held.empty())
    loop_.post([done, not_held, keepalive] {  // the caller's batch lives until answered
      for (std::size_t i : not_held) done(i, Renewed::kGone, nullptr);
    });
  if (ids.empty()) return 0;
  std::vector<LockRef> refs(locks.begin(), locks.end());
  client_->keep_alive(std::move(ids), [this, refs = std::move(refs), keepalive = std::move(keepalive),
                                       which = std::move(which), done = std::move(done)](
                                          const std::vector<std::int64_t>& ttls, const StoreError* err) {
    StoreError partial;
    for (std::size_t k = 0; k < which.size(); ++k) {
      const std::size_t i = which[k];
      const std::int64_t left = k < ttls.size() ? ttls[k] : -1;
      if (left > 0) {
        done(i, Renewed::kYes, nullptr);
      } else if (left == -1) {
        if (!err && partial.message.empty())
          partial = StoreError::unavailable(client_->name(), "no keep-alive answer for the lease");
        done(i, Renewed::kTransient, err ? err : &partial);
      } else {
        // The lease expired or was revoked: the key went with it.
        auto it = held_.find(refs[i].name);
        if (it != held_.end() && it->second.token == refs[i].token) held_.erase(it);
        done(i, Renewed::kGone, nullptr);
      }
    }
  });
  return 1;
}

// ---- release

// One lock's release, until answered or given up.
struct EtcdStore::Releasing : OwnedLock {
  using OwnedLock::OwnedLock;
  std::size_t index = 0;
  std::shared_ptr<ReleaseDone> done;
  std::int64_t lease = 0;
  bool maybe_applied = false;  // an attempt went without an answer
};

void EtcdStore::release(std::span<const LockRef> locks, bool, ReleaseDone done) {
  // A deletion wakes the key's watchers whether or not `notify` asks for
  // it: a waiter woken for nothing asks once and sleeps again.
  auto shared_done = std::make_shared<ReleaseDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    auto r = std::make_shared<Releasing>(locks[i]);
    r->index = i;
    r->done = shared_done;
    if (auto it = held_.find(r->name); it != held_.end() && it->second.token == r->token) r->lease = it->second.lease;
    release_attempt(std::move(r));
  }
}

void EtcdStore::release_attempt(std::shared_ptr<Releasing> r) {
  etcdserverpb::TxnRequest txn;
  compare_ours(txn.mutable_compare(), r->name, r->token);
  txn.add_success()->mutable_request_delete_range()->set_key(r->name);
  txn.add_failure()->mutable_request_range()->set_key(r->name);
  client_->txn(std::move(txn), [this, r](const auto& response, const StoreError* err) {
    // Not ours to renew any more, whatever the answer (renewals racing the
    // release until then are answered as before).
    if (auto it = held_.find(r->name); it != held_.end() && it->second.token == r->token) held_.erase(it);
    // No answer in time from a member that may be hung: once more, on the
    // next one (the client moved on).
    if (err && err->unavailable() && err->code == etcd_code(grpc::StatusCode::DEADLINE_EXCEEDED) &&
        !r->maybe_applied && !closed_) {
      r->maybe_applied = true;
      return release_attempt(r);
    }
    // Our lease goes either way: revoking it takes the key away if it is
    // still there.
    revoke(r->lease);
    if (err) return (*r->done)(r->index, Released::kUnconfirmed, err);
    Released status = response.succeeded() || r->maybe_applied ? Released::kYes
                      : ranged(response)                        ? Released::kTakenByOther
                                                                : Released::kGone;
    (*r->done)(r->index, status, nullptr);
  });
}

// ---- release notices

EtcdStore::Watched* EtcdStore::watched(const std::string& name, const EtcdClient::Watch* watch) {
  auto w = watched_.find(name);
  return closed_ || w == watched_.end() || w->second.watch.get() != watch ? nullptr : &w->second;
}

void EtcdStore::subscribe(std::string_view name) {
  if (closed_) return;
  auto [it, fresh] = watched_.try_emplace(std::string(name));
  if (!fresh) {
    if (it->second.created)  // confirmed already: on the next turn, never inside the call
      loop_.post([this, n = it->first, watch = it->second.watch] {
        if (watched(n, watch.get()) && events_.subscribed) events_.subscribed(n);
      });
    return;
  }
  using Event = EtcdClient::WatchEvent;
  it->second.watch = client_->watch(it->first, [this, n = it->first](const EtcdClient::Watch* watch, Event event,
                                                                       const StoreError* why) {
    Watched* w = watched(n, watch);
    if (w == nullptr) return;
    if (event == Event::kCreated) w->created = true;
    if (event == Event::kCreated && events_.subscribed) events_.subscribed(n);
    if (event == Event::kDeleted && events_.released) events_.released(n);
    if (event != Event::kEnded) return;
    watched_.erase(n);
    if (events_.log) events_.log(true, "etcd watch on a lock's key ended (" + why->describe() + "); watching again");
    if (events_.subscriptions_lost) events_.subscriptions_lost();
  });
}

void EtcdStore::unsubscribe(std::string_view name) {
  auto it = watched_.find(name);
  if (it == watched_.end()) return;
  client_->cancel(it->second.watch);
  watched_.erase(it);
}

// ---- operators

std::string EtcdStore::value_of(std::string_view token) const {
  const auto now = clock_->estimate().value_or(std::chrono::system_clock::now());
  const auto ms = std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count();
  return std::string(token) + "\n" + std::to_string(ms) + " " + owner_;
}

LockInfo EtcdStore::info_of(const mvccpb::KeyValue& kv) const {
  LockInfo info;
  info.held = true;
  info.fencing_token = static_cast<std::uint64_t>(kv.create_revision());
  const std::string& v = kv.value();
  const auto nl = v.find('\n');
  HolderInfo h;
  h.token = v.substr(0, nl);
  if (nl != std::string::npos && parse_owner_record(std::string_view(v).substr(nl + 1), h)) {
    const auto now = clock_->estimate().value_or(std::chrono::system_clock::now());
    h.held_for = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(now - h.since));
  }
  info.owner = h.token;
  info.holders.push_back(std::move(h));
  return info;
}

void EtcdStore::inspect(std::string_view name, InspectDone done) {
  client_->get(std::string(name), [this, done = std::move(done)](const auto& response, const StoreError* err) {
    LockInfo info;
    if (err || response.kvs_size() == 0) {
      // Not held: the cluster's revision now is above every token handed
      // out, and the next holder's is above it.
      if (!err) info.fencing_token = static_cast<std::uint64_t>(response.header().revision());
      return done(info, err);
    }
    const auto& kv = response.kvs(0);
    info = info_of(kv);
    if (kv.lease() == 0) return done(info, nullptr);
    client_->lease_time_to_live(kv.lease(), [info, done](const auto& r, const StoreError* err) mutable {
      if (!err && r.ttl() > 0) info.ttl = milliseconds(r.ttl() * 1000);
      done(info, err);
    });
  });
}

struct EtcdStore::Listing {
  std::string from;   // the next page's first key
  std::string end{};  // the range's end (exclusive; "\0": every key from `from`)
  std::size_t limit = 0;
  std::vector<LockInfo> found{};
  ListDone done;
};

void EtcdStore::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  auto listing = std::make_shared<Listing>(Listing{.from = encode(prefix), .limit = limit, .done = std::move(done)});
  // The range of every key that starts with `from`: its last byte below
  // 0xff raised by one, the bytes after it dropped.
  const std::size_t last = listing->from.find_last_not_of('\xff');
  listing->end = last == std::string::npos ? std::string(1, '\0') : listing->from.substr(0, last + 1);
  if (last != std::string::npos) ++listing->end.back();
  list_page(std::move(listing));
}

void EtcdStore::list_page(std::shared_ptr<Listing> listing) {
  constexpr std::int64_t kPage = 256;
  client_->range(listing->from, listing->end, kPage, [this, listing](const auto& response, const StoreError* err) {
    if (err) return listing->done({}, err);
    // Each lock with its lease: held while the lease is found (ttl -1: gone meanwhile).
    std::vector<std::pair<LockInfo, std::int64_t>> found;
    for (const auto& kv : response.kvs()) {
      if (kv.lease() == 0) continue;  // not a lock: a job's period key
      LockInfo info = info_of(kv);
      info.key = kv.key().substr(traits().keys.prefix.size());
      found.emplace_back(std::move(info), kv.lease());
    }
    const bool more = response.more() && response.kvs_size() > 0;
    if (more) listing->from = response.kvs(response.kvs_size() - 1).key() + std::string(1, '\0');
    // One answer more, this call's own: a page of no locks goes on at once.
    const std::size_t n = found.size();
    auto page = Countdown<StoreError, decltype(found)>::make(n + 1, std::move(found), [this, listing, more](auto& c) {
      if (c.failure) return listing->done({}, &*c.failure);
      for (std::size_t i = 0; i < c.size() && listing->found.size() < listing->limit; ++i)
        if (c[i].first.held) listing->found.push_back(std::move(c[i].first));
      if (!more || listing->found.size() >= listing->limit) return listing->done(std::move(listing->found), nullptr);
      list_page(listing);
    });
    for (auto& [info, lease] : *page) {
      client_->lease_time_to_live(lease, [page, &info](const auto& r, const StoreError* e) {
        info.held = !e && r.ttl() >= 0;
        info.ttl = milliseconds(r.ttl() * 1000);
        page->answered(e);
      });
    }
    page->answered();
  });
}

void EtcdStore::force_release(std::string_view name, ForceDone done) {
  force_release_attempt(std::string(name), 1, std::move(done));
}

void EtcdStore::force_release_attempt(std::string name, int attempt, ForceDone done) {
  client_->get(name, [this, name, attempt, done = std::move(done)](const auto& response,
                                                                    const StoreError* err) mutable {
    if (err || response.kvs_size() == 0) return done(false, err);
    const auto kv = response.kvs(0);
    etcdserverpb::TxnRequest txn;
    compare(txn.mutable_compare(), name, etcdserverpb::Compare::MOD)->set_mod_revision(kv.mod_revision());
    txn.add_success()->mutable_request_delete_range()->set_key(name);
    client_->txn(std::move(txn), [this, name, attempt, lease = kv.lease(), done = std::move(done)](
                                     const auto& response, const StoreError* err) mutable {
      if (err) return done(false, err);
      if (!response.succeeded()) {
        // Taken or released meanwhile: look again.
        if (attempt < 3 && !closed_) return force_release_attempt(std::move(name), attempt + 1, std::move(done));
        return done(false, nullptr);
      }
      // The holder's lease too: its next renewal finds it gone.
      revoke(lease);
      done(true, nullptr);
    });
  });
}

// ---- scheduled jobs

void EtcdStore::server_time(TimeDone done) { clock_->now(std::move(done)); }

void EtcdStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                             std::chrono::system_clock::time_point start, ClaimDone done) {
  auto c = StoreClaim::make<StoreClaim>(name, token, period, std::move(done));
  // The clock decides only whether the period is due; that it runs once
  // rests on the transaction alone.
  clock_->now(StoreClaim::when_due(std::move(c), start, std::bind_front(&EtcdStore::claim_step, this)));
}

void EtcdStore::claim_step(std::shared_ptr<StoreClaim> c) {
  auto finish = [this, c](ClaimResult::Status status, const StoreError* err = nullptr) {
    if (auto now = clock_->estimate()) c->out.store_time = *now;
    c->finish(status, err);
  };
  // The last period run and the revision it was written at.
  const std::string key = period_key(c->name);
  client_->get(key, [this, c, finish, key](const auto& response, const StoreError* err) {
    if (err) return finish(ClaimResult::Status::kFailed, err);
    std::int64_t mod = 0;
    if (response.kvs_size() > 0) {
      const auto& kv = response.kvs(0);
      std::int64_t last = 0;
      const std::string& v = kv.value();
      if (std::from_chars(v.data(), v.data() + v.size(), last).ec != std::errc() || v.empty()) {
        auto e = StoreError::refused(client_->name(),
                                     "the job's period key " + key + " holds '" + v + "', not a period");
        return finish(ClaimResult::Status::kFailed, &e);
      }
      if (last >= c->period) {
        c->out.last = last;
        return finish(ClaimResult::Status::kAlreadyRun);
      }
      mod = kv.mod_revision();
    }
    // One step: the job's lock holds our token, and the period key is as
    // read (absent: mod_revision 0); then the period is recorded.
    etcdserverpb::TxnRequest txn;
    compare_ours(txn.mutable_compare(), c->name, c->token);
    compare(txn.mutable_compare(), key, etcdserverpb::Compare::MOD)->set_mod_revision(mod);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(std::to_string(c->period));
    txn.add_failure()->mutable_request_range()->set_key(c->name);
    txn.add_failure()->mutable_request_range()->set_key(key);
    client_->txn(std::move(txn), [this, c, finish](const auto& response, const StoreError* err) {
      // Whether it was recorded (no answer) is unknown: a period recorded
      // and not run is lost, never run twice.
      if (err) return finish(ClaimResult::Status::kFailed, err);
      if (response.succeeded()) {
        c->out.last = c->period;
        return finish(ClaimResult::Status::kClaimed);
      }
      const mvccpb::KeyValue* lock = ranged(response);
      if (lock == nullptr || !is_ours(lock->value(), c->token)) return finish(ClaimResult::Status::kNotLeader);
      // Another write to the period key came first: read again.
      if (++c->attempt < kPeriodKeyAttempts && !closed_) return claim_step(c);
      auto e = StoreError::unavailable(client_->name(), "the job's period key kept changing under the claim");
      finish(ClaimResult::Status::kFailed, &e);
    });
  });
}

// ---- closing

void EtcdStore::close() {
  closed_ = true;
  clock_->close();
  watched_.clear();
  client_->close();  // cancels the watches too
}

}  // namespace lockwatch::detail
