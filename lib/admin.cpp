// lib/admin.cpp: an operator's view of a lock and its forced removal
// (Runtime::inspect, Runtime::force_release).
//
// Neither takes a lease. Each runs one script on every node (the runtime's
// command connections, so requests are pipelined with the rest) and reads
// the answers the way the lock protocol does (nodes.cpp): with several nodes
// (Redlock) a lock is held when a majority of them hold it with the same
// owner token. The key layout is the protocol's (scripts.hpp): the lock
// `<prefix>{K}`, its fencing counter `...:fence` (never touched here but
// read), its release channel `...:rel`.
#include <charconv>

#include "runtime_impl.hpp"

namespace lockwatch {
namespace {

using std::chrono::milliseconds;

// KEYS: lock, fence. Returns {owner token or '', pttl, fencing counter or '0'}
// in one atomic step.
constexpr std::string_view kInspect = R"lua(
return {redis.call('get', KEYS[1]) or '', redis.call('pttl', KEYS[1]), redis.call('get', KEYS[2]) or '0'}
)lua";

// KEYS: lock. ARGV: release channel. Deletes the lock whoever owns it and
// wakes the waiters (who wait for exactly this message, or the holder's ttl).
// The fencing counter stays, so tokens keep rising. Returns {keys deleted,
// former owner token or ''}; a key of another type is deleted too (it is in
// lockwatch's namespace) and has no owner.
constexpr std::string_view kForceRelease = R"lua(
local v = redis.pcall('get', KEYS[1])
if type(v) ~= 'string' then v = '' end
local n = redis.call('del', KEYS[1])
if n == 1 then redis.call('publish', ARGV[1], '1') end
return {n, v}
)lua";

const detail::Script& inspect_script() {
  static const detail::Script s{kInspect, detail::sha1_hex(kInspect)};
  return s;
}
const detail::Script& force_release_script() {
  static const detail::Script s{kForceRelease, detail::sha1_hex(kForceRelease)};
  return s;
}

// One node's answer: parsed, or why not.
struct NodeAnswer {
  bool ok = false;
  std::exception_ptr error;
  std::string owner;        // '' when there is no lock
  long long pttl = 0;       // inspect
  std::uint64_t fence = 0;  // inspect
};

// Parses a reply inside its callback (a reply lives no longer); throws
// RedisError for a reply the script cannot have made.
using Parse = void (*)(const redisReply* r, const std::string& node, NodeAnswer& out);

std::string string_at(const redisReply* r, std::size_t i, const std::string& node) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements <= i || r->element[i]->type != REDIS_REPLY_STRING)
    throw RedisError(node, "unexpected reply to an admin script");
  return std::string(r->element[i]->str, r->element[i]->len);
}

void parse_inspect(const redisReply* r, const std::string& node, NodeAnswer& out) {
  out.owner = string_at(r, 0, node);
  out.pttl = detail::integer_at(r, 1);
  std::string fence = string_at(r, 2, node);
  auto [end, ec] = std::from_chars(fence.data(), fence.data() + fence.size(), out.fence);
  if (ec != std::errc() || end != fence.data() + fence.size())
    throw RedisError(node, fmt::format("the fencing counter holds '{}', not a number", fence));
  if (!out.owner.empty() && out.pttl < 0)
    throw RedisError(node, "the lock key exists without expiry: not a lockwatch lock");
}

void parse_force_release(const redisReply* r, const std::string& node, NodeAnswer& out) {
  out.owner = string_at(r, 1, node);
}

// Loop thread. Runs `script` on every node; done() gets every answer once
// the last node answered (or failed: bounded by the command timeout).
void ask_every_node(Runtime::Impl& rt, const detail::Script& script, std::vector<std::string> keys_then_args,
                    int num_keys, Parse parse, std::function<void(const std::vector<NodeAnswer>&)> done) {
  struct Round {
    std::vector<NodeAnswer> answers;
    std::size_t pending;
    std::function<void(const std::vector<NodeAnswer>&)> done;
  };
  auto round =
      std::make_shared<Round>(Round{std::vector<NodeAnswer>(rt.nodes.size()), rt.nodes.size(), std::move(done)});
  for (std::size_t i = 0; i < rt.nodes.size(); ++i) {
    detail::RedisConnection* conn = rt.nodes[i].conn.get();
    conn->eval(script, keys_then_args, num_keys, [conn, i, round, parse](const redisReply* r, std::exception_ptr err) {
      NodeAnswer& a = round->answers[i];
      if (err) {
        a.error = err;
      } else {
        try {
          parse(r, conn->name(), a);
          a.ok = true;
        } catch (...) {
          a.error = std::current_exception();
        }
      }
      if (--round->pending == 0) round->done(round->answers);
    });
  }
}

// The owner token most nodes hold, and on how many.
std::pair<std::string, std::size_t> most_held(const std::vector<NodeAnswer>& answers) {
  std::pair<std::string, std::size_t> best{"", 0};
  for (const auto& a : answers) {
    if (!a.ok || a.owner.empty()) continue;
    std::size_t n = 0;
    for (const auto& b : answers) n += (b.ok && b.owner == a.owner) ? 1 : 0;
    if (n > best.second) best = {a.owner, n};
  }
  return best;
}

// Why the answers cannot settle the question: one node's error as it came;
// otherwise a store error (not a connection's) if there was one, else one
// ConnectionError naming every node that failed, as acquisition reports it.
std::exception_ptr undecided(const std::vector<NodeAnswer>& answers, const std::vector<Runtime::Impl::Node>& nodes,
                             const char* what) {
  std::exception_ptr first;
  std::string names;
  std::size_t failed = 0;
  for (std::size_t i = 0; i < answers.size(); ++i) {
    if (answers[i].ok) continue;
    failed++;
    if (answers.size() == 1 || !detail::is_connection_error(answers[i].error)) return answers[i].error;
    names +=
        fmt::format("{}{}: {}", names.empty() ? "" : "; ", nodes[i].conn->name(), detail::what_of(answers[i].error));
  }
  return std::make_exception_ptr(
      ConnectionError(names, fmt::format("{}: {} of {} nodes did not answer", what, failed, answers.size())));
}

void check_key(const Options& o, const std::string& key) {
  if (key.empty()) throw InvalidArgument("lock key is empty");
  if (key.size() > o.max_key_bytes)
    throw InvalidArgument(
        fmt::format("lock key is {} bytes; the limit (Options::max_key_bytes) is {}", key.size(), o.max_key_bytes));
}

}  // namespace

std::future<LockState> Runtime::inspect(std::string key) {
  check_key(impl_->options, key);
  if (impl_->stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
  auto promise = std::make_shared<std::promise<LockState>>();
  auto future = promise->get_future();
  Impl* rt = impl_.get();
  std::string lock_key = detail::redis_key(rt->options, key);
  bool posted = rt->loop.post([rt, promise, key = std::move(key), lock_key = std::move(lock_key)]() mutable {
    ask_every_node(*rt, inspect_script(), {lock_key, lock_key + ":fence"}, 2, parse_inspect,
                   [rt, promise, key = std::move(key)](const std::vector<NodeAnswer>& answers) {
                     const std::size_t n = answers.size();
                     std::size_t answered = 0;
                     LockState s;
                     s.key = key;
                     for (const auto& a : answers) {
                       if (!a.ok) continue;
                       answered++;
                       s.fencing_counter = std::max(s.fencing_counter, a.fence);
                     }
                     auto [owner, holders] = most_held(answers);
                     if (holders >= rt->quorum) {
                       s.held = true;
                       s.ttl = milliseconds::max();
                       for (const auto& a : answers)
                         if (a.ok && a.owner == owner) s.ttl = std::min(s.ttl, milliseconds(a.pttl));
                     } else if (answered < rt->quorum || holders + (n - answered) >= rt->quorum) {
                       // The nodes that did not answer could make a majority
                       // for someone: saying "free" could be wrong.
                       promise->set_exception(undecided(answers, rt->nodes, "cannot tell whether the lock is held"));
                       return;
                     }
                     promise->set_value(std::move(s));
                   });
  });
  if (!posted) throw RuntimeStopped("lockwatch runtime is stopping");
  return future;
}

std::future<bool> Runtime::force_release(std::string key) {
  check_key(impl_->options, key);
  if (impl_->stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
  auto promise = std::make_shared<std::promise<bool>>();
  auto future = promise->get_future();
  Impl* rt = impl_.get();
  std::string lock_key = detail::redis_key(rt->options, key);
  bool posted = rt->loop.post([rt, promise, lock_key = std::move(lock_key)] {
    ask_every_node(*rt, force_release_script(), {lock_key, lock_key + ":rel"}, 1, parse_force_release,
                   [rt, promise](const std::vector<NodeAnswer>& answers) {
                     std::size_t confirmed = 0;
                     for (const auto& a : answers) confirmed += a.ok ? 1 : 0;
                     // Once a majority has no lock, no one holds it (a holder
                     // needs a majority), whatever the other nodes still keep.
                     if (confirmed < rt->quorum) {
                       promise->set_exception(undecided(answers, rt->nodes, "could not remove the lock"));
                       return;
                     }
                     promise->set_value(most_held(answers).second >= rt->quorum);
                   });
  });
  if (!posted) throw RuntimeStopped("lockwatch runtime is stopping");
  return future;
}

}  // namespace lockwatch
