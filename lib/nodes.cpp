// The Redis nodes behind a runtime and the quorum over them.
//
// With one node every step is that node's answer. With N nodes (Redlock)
// every step needs a majority, Q = N/2 + 1:
// - acquire: the same token is set on all nodes at once; taken when Q nodes
//   took it within the validity time (ttl - elapsed - drift). The fencing
//   token is the largest of the Q counters, and before the lease is handed
//   out those Q nodes are raised to it: a later holder needs Q nodes too,
//   shares at least one with this majority, and increments past it there.
//   Anything short of a majority releases on every node.
// - renew: each node renews the batch; a lease is renewed when Q nodes
//   confirmed, lost when more than N - Q said "not yours".
// - release: goes to every node; freed when Q nodes confirmed.
#include <fmt/format.h>

#include "runtime_impl.hpp"

namespace lockwatch {

using detail::AcquireOutcome;
using detail::LeaseRecord;
using std::chrono::milliseconds;

void Runtime::Impl::start_nodes() {
  nodes.reserve(endpoints.size());
  for (const auto& ep : endpoints) {
    Node n;
    n.conn = std::make_unique<detail::RedisConnection>(loop, ep, options, false);
    n.renew = std::make_unique<detail::RedisConnection>(loop, ep, options, false);
    detail::RedisConnection::Hooks hooks;
    hooks.on_message = [this](std::string_view kind, std::string_view channel, std::string_view) {
      on_pubsub(kind, channel);
    };
    hooks.on_down = [this] {
      for (auto& [ch, w] : waiters) w->subscribed = false;
    };
    n.sub = std::make_unique<detail::RedisConnection>(loop, ep, options, true, std::move(hooks));
    nodes.push_back(std::move(n));
  }
  if (!topology.sentinels.empty()) {
    // One node, wherever the sentinels say the master is; asked again
    // whenever the connection to it drops.
    sentinel = std::make_unique<detail::SentinelWatcher>(loop, topology, options, [this](const Endpoint& master) {
      nodes[0].conn->set_endpoint(master);
      nodes[0].renew->set_endpoint(master);
      nodes[0].sub->set_endpoint(master);
    });
    nodes[0].conn->set_down_hook([this] {
      if (sentinel) sentinel->refresh();
    });
  }
  for (auto& n : nodes) {
    n.conn->start();
    n.renew->start();
    n.sub->start();
  }
  if (sentinel) sentinel->start();
}

void Runtime::Impl::subscribe_all(const std::string& channel) {
  for (auto& n : nodes) n.sub->subscribe(channel);
}

void Runtime::Impl::unsubscribe_all(const std::string& channel) {
  for (auto& n : nodes) n.sub->unsubscribe(channel);
}

namespace {

// The votes of one multi-node acquisition.
struct AcquireTally {
  std::size_t replies = 0, busy = 0, failed = 0;
  std::vector<std::size_t> took;  // nodes that set our token
  std::uint64_t max_fence = 0;
  long long min_pttl = -1;
  std::vector<std::string> errors;
  std::exception_ptr first_error;
  bool only_connection_errors = true;
  bool decided = false;  // taken by a majority (raising) or given up
  bool finished = false;
  // Raising the fencing counters, once a majority took the lock.
  std::uint64_t fence = 0;
  std::size_t raise_asked = 0, raise_replies = 0, raise_ok = 0;
};

}  // namespace

void Runtime::Impl::quorum_acquire(const std::shared_ptr<detail::Acquisition>& a,
                                   std::function<void(const AcquireOutcome&)> done) {
  auto sent = Clock::now();
  std::string ttl = std::to_string(a->spec.ttl.count());
  if (nodes.size() == 1) {
    nodes[0].conn->eval(
        detail::acquire_script(), {a->lock_key, a->fence_key, a->token, ttl}, 2,
        [this, a, sent, done = std::move(done)](const redisReply* r, std::exception_ptr err) mutable {
          AcquireOutcome out;
          out.sent = sent;
          if (err) {
            out.error = err;
          } else if (detail::integer_at(r, 0) == 1) {
            out.kind = AcquireOutcome::Kind::kTaken;
            out.fence = static_cast<std::uint64_t>(detail::integer_at(r, 1));
          } else {
            out.kind = AcquireOutcome::Kind::kBusy;
            out.pttl = milliseconds(detail::integer_at(r, 1));
          }
          if (out.kind != AcquireOutcome::Kind::kTaken || options.min_replicas <= 0) {
            done(out);
            return;
          }
          // The lock write must reach min_replicas replicas before the lease
          // is handed out, so a failover right after cannot drop it.
          nodes[0].conn->command(
              {"WAIT", std::to_string(options.min_replicas), std::to_string(options.replica_ack_timeout.count())},
              [this, a, out, done = std::move(done)](const redisReply* w, std::exception_ptr werr) mutable {
                long long acks = (!werr && w->type == REDIS_REPLY_INTEGER) ? w->integer : 0;
                if (acks >= options.min_replicas) {
                  done(out);
                  return;
                }
                out.kind = AcquireOutcome::Kind::kFailed;
                out.error = werr ? werr
                                 : std::make_exception_ptr(ConnectionError(
                                       nodes[0].conn->name(),
                                       fmt::format("the lock write reached {} of the {} replicas required", acks,
                                                   options.min_replicas)));
                // Give the lock back before the caller hears of the failure.
                quorum_release(a->lock_key, a->token, {},
                               [out, done = std::move(done)](bool, bool, bool, std::string) mutable { done(out); });
              });
        });
    return;
  }

  struct Shared {
    AcquireTally tally;
    std::function<void(const AcquireOutcome&)> done;
  };
  auto st = std::make_shared<Shared>();
  st->done = std::move(done);
  const std::size_t n = nodes.size();
  auto deliver = [st, sent](AcquireOutcome out) {
    out.sent = sent;
    st->done(out);
  };
  auto finish = [st, deliver](AcquireOutcome out) {
    if (st->tally.finished) return;
    st->tally.finished = true;
    deliver(std::move(out));
  };
  // A failed attempt gives back what it took, on every node (a late success
  // is undone by the release queued behind it), before the caller hears.
  auto give_back = [this, a, st, deliver](AcquireOutcome out) {
    st->tally.finished = true;  // no other path may answer meanwhile
    quorum_release(a->lock_key, a->token, {}, [deliver, out](bool, bool, bool, std::string) { deliver(out); });
  };
  // Taken once a majority's counters are raised to the token; hopeless once
  // every node answered and too few raises succeeded.
  auto check_raised = [this, st, n, finish, give_back] {
    auto& t = st->tally;
    if (t.finished) return;
    if (t.raise_ok >= quorum) {
      AcquireOutcome out;
      out.kind = AcquireOutcome::Kind::kTaken;
      out.fence = t.fence;
      finish(out);
    } else if (t.replies == n && t.raise_replies == t.raise_asked) {
      AcquireOutcome out;
      out.error = std::make_exception_ptr(
          ConnectionError(endpoints[t.took.empty() ? 0 : t.took.front()].name(),
                          "could not raise a majority's fencing counters"));
      give_back(out);
    }
  };
  auto raise_on = [this, a, st, check_raised](std::size_t node) {
    auto& t = st->tally;
    t.raise_asked++;
    nodes[node].conn->eval(detail::raise_fence_script(), {a->fence_key, std::to_string(t.fence)}, 1,
                           [st, check_raised](const redisReply*, std::exception_ptr e) {
                             st->tally.raise_replies++;
                             if (!e) st->tally.raise_ok++;
                             check_raised();
                           });
  };

  for (std::size_t i = 0; i < n; ++i) {
    nodes[i].conn->eval(
        detail::acquire_script(), {a->lock_key, a->fence_key, a->token, ttl}, 2,
        [this, a, i, n, sent, st, give_back, raise_on, check_raised](const redisReply* r,
                                                                             std::exception_ptr err) {
          auto& t = st->tally;
          t.replies++;
          bool took_here = false;
          if (err) {
            t.failed++;
            t.errors.push_back(fmt::format("{}: {}", endpoints[i].name(), detail::what_of(err)));
            if (!t.first_error) t.first_error = err;
            if (!detail::is_connection_error(err)) t.only_connection_errors = false;
          } else if (detail::integer_at(r, 0) == 1) {
            took_here = true;
            t.took.push_back(i);
            t.max_fence = std::max(t.max_fence, static_cast<std::uint64_t>(detail::integer_at(r, 1)));
          } else {
            t.busy++;
            long long p = detail::integer_at(r, 1);
            t.min_pttl = t.min_pttl < 0 ? p : std::min(t.min_pttl, p);
          }
          if (t.decided) {
            // Raising: a late taker is raised too (one more chance at a
            // majority); a late failure may make it hopeless.
            if (!t.finished && t.raise_asked > 0 && took_here) raise_on(i);
            check_raised();
            return;
          }

          AcquireOutcome out;
          if (t.took.size() >= quorum) {
            t.decided = true;
            auto validity = a->spec.ttl - detail::drift_for(options, a->spec.ttl);
            if (Clock::now() - sent >= validity) {
              out.error = std::make_exception_ptr(
                  ConnectionError(endpoints[i].name(), "a majority took the lock only after its validity time"));
              give_back(out);
              return;
            }
            t.fence = t.max_fence;
            for (std::size_t node : std::vector<std::size_t>(t.took)) raise_on(node);
            return;
          }
          if (t.busy + t.failed > n - quorum) {
            // A majority is out of reach: give back what we took, on every
            // node (a late success is undone by the release queued behind it).
            t.decided = true;
            if (t.busy > 0 && t.took.size() + t.busy >= quorum) {
              out.kind = AcquireOutcome::Kind::kBusy;
              out.pttl = milliseconds(std::max<long long>(1, t.min_pttl));
            } else if (!t.only_connection_errors && t.first_error) {
              out.error = t.first_error;
            } else {
              std::string names;
              for (const auto& e : t.errors) names += (names.empty() ? "" : "; ") + e;
              out.error = std::make_exception_ptr(ConnectionError(
                  names.empty() ? endpoints[i].name() : names,
                  fmt::format("no majority: {} of {} nodes failed, {} busy", t.failed, n, t.busy)));
            }
            give_back(out);
          }
        });
  }
}

void Runtime::Impl::quorum_renew(std::vector<std::shared_ptr<LeaseRecord>> batch, Clock::time_point sent) {
  const std::size_t n = batch.size();
  // The arguments point into the leases, which the batch keeps alive until
  // every node answered: no copies of keys and tokens per renewal.
  auto shared_batch = std::make_shared<const std::vector<std::shared_ptr<LeaseRecord>>>(std::move(batch));
  std::vector<std::string_view> args;
  args.reserve(3 * n);
  std::vector<std::uint64_t> rounds;
  rounds.reserve(n);
  for (const auto& l : *shared_batch) args.emplace_back(l->lock_key);
  for (const auto& l : *shared_batch) {
    args.emplace_back(l->token);
    args.emplace_back(l->ttl_ms);
    // A new round: votes of an older one no longer count.
    l->renew_round++;
    l->renew_ok = l->renew_no = l->renew_replies = 0;
    l->renew_taken = l->renew_decided = false;
    l->renew_error.clear();
    rounds.push_back(l->renew_round);
  }
  stats.renewals_sent.fetch_add(n, std::memory_order_relaxed);
  stats.renew_commands.fetch_add(nodes.size(), std::memory_order_relaxed);
  auto shared_rounds = std::make_shared<const std::vector<std::uint64_t>>(std::move(rounds));
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].renew->eval_views(
        detail::renew_script(), args, static_cast<int>(n), shared_batch,
        [this, i, sent, shared_batch, shared_rounds](const redisReply* r, std::exception_ptr err) {
          const auto& b = *shared_batch;
          std::string why;
          if (err) {
            why = detail::what_of(err);
          } else if (r->type != REDIS_REPLY_STRING || r->len != b.size()) {
            why = fmt::format("{}: unexpected reply to the renewal script", endpoints[i].name());
          }
          for (std::size_t k = 0; k < b.size(); ++k) {
            long long v = -2;
            if (why.empty()) {
              switch (r->str[k]) {
                case '1': v = 1; break;
                case '0': v = 0; break;
                case 'x': v = -1; break;
                default: break;
              }
            }
            if (v == -2 && why.empty()) {
              on_renew_vote(b[k], (*shared_rounds)[k], sent, v, endpoints[i].name() + ": Redis refused the renewal");
            } else {
              on_renew_vote(b[k], (*shared_rounds)[k], sent, v, why);
            }
          }
        });
  }
}

void Runtime::Impl::on_renew_vote(const std::shared_ptr<LeaseRecord>& l, std::uint64_t round, Clock::time_point sent,
                                  long long v, const std::string& why) {
  if ((l->work_finished && !l->releasing) || l->lost() || l->renew_round != round || l->renew_decided) return;
  const std::size_t n = nodes.size();
  l->renew_replies++;
  if (v == 1) {
    l->renew_ok++;
  } else if (v == 0 || v == -1) {
    l->renew_no++;
    if (v == -1) l->renew_taken = true;
  } else if (l->renew_error.empty()) {
    l->renew_error = why;
  }
  if (l->renew_ok >= quorum) {
    l->renew_decided = true;
    on_renewed(l, sent);
  } else if (l->renew_no > n - quorum) {
    l->renew_decided = true;
    // With the work over and the release in flight, the release's own
    // answer says what became of the key.
    if (!l->work_finished) lose(l.get(), l->renew_taken ? LostReason::kTakenByOther : LostReason::kExpired);
  } else if (l->renew_replies == n) {
    l->renew_decided = true;
    renewal_failed(l, l->renew_error);
  }
}

void Runtime::Impl::quorum_release(const std::string& lock_key, const std::string& token, const std::string& channel,
                                   std::function<void(bool freed, bool held, bool taken, std::string why)> done) {
  struct Tally {
    std::size_t replies = 0, confirmed = 0, held = 0;
    bool taken = false;
    std::string why;
  };
  auto tally = std::make_shared<Tally>();
  auto finish = std::make_shared<std::function<void(bool, bool, bool, std::string)>>(std::move(done));
  const std::size_t n = nodes.size();
  for (std::size_t i = 0; i < n; ++i) {
    nodes[i].conn->eval(detail::release_script(), {lock_key, token, channel}, 1,
                        [this, i, n, tally, finish](const redisReply* r, std::exception_ptr err) {
                          tally->replies++;
                          if (err) {
                            if (tally->why.empty()) tally->why = detail::what_of(err);
                          } else {
                            tally->confirmed++;
                            long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
                            if (v == 1) tally->held++;
                            if (v < 0) tally->taken = true;
                          }
                          // Every node answers (or fails, bounded by the command
                          // timeout) before the caller hears: a reachable node
                          // never keeps the key after the future is ready.
                          if (tally->replies < n) return;
                          if (!tally->why.empty() && tally->confirmed < n)
                            tally->why = fmt::format("{}: {}", endpoints[i].name(), tally->why);
                          (*finish)(tally->confirmed >= quorum, tally->held >= quorum, tally->taken, tally->why);
                        });
  }
}

}  // namespace lockwatch
