#include "store/zookeeper/zk_store.hpp"

#include <fmt/format.h>
#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <charconv>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "core/hex.hpp"
#include "core/loop.hpp"
#include "core/net.hpp"
#include "core/option_checks.hpp"
#include "core/timing.hpp"
#include "lockwatch/errors.hpp"
#include "store/zookeeper/zk_error.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

// ---- the client's threads and the loop

struct ZkStore::Result {
  int rc = ZOK;
  bool has_stat = false;
  Stat stat{};
  std::string value;                  // a node's data, or the path created
  std::vector<std::string> children;  // get_children
  std::vector<int> op_errors;         // multi: each operation's outcome
};

// Shared by the store and the client's threads. `store` is cleared (on the
// loop) when the store closes: answers after that are dropped.
struct ZkStore::Sink : std::enable_shared_from_this<ZkStore::Sink> {
  std::mutex mu;
  ZkStore* store = nullptr;
  Loop* loop = nullptr;
  // The contexts the client holds, by the session that sent them: a
  // handle closed while disconnected does not always call back what it
  // had queued, so what is left once zookeeper_close() returns is freed
  // here (no thread of that handle runs by then).
  std::mutex ctx_mu;
  std::unordered_map<void*, std::uint64_t> in_flight;

  void forget_session(std::uint64_t serial);

  void post(std::function<void(ZkStore&)> f) {
    {
      std::lock_guard lk(mu);
      if (store == nullptr) return;
    }
    loop->post([self = shared_from_this(), f = std::move(f)] {
      ZkStore* s;
      {
        std::lock_guard lk(self->mu);
        s = self->store;
      }
      if (s != nullptr) f(*s);
    });
  }
};

// One session: a zhandle_t and what the store knows of it.
struct ZkStore::Session {
  enum class State : std::uint8_t { kConnecting, kConnected, kDisconnected, kExpired };
  std::uint64_t serial = 0;
  long long requested_ms = 0;
  zhandle_t* zh = nullptr;
  void* watch_ctx = nullptr;  // the global watcher's context, freed with zh
  State state = State::kConnecting;
  int negotiated_ms = 0;
  bool ever_connected = false;
  std::uint32_t connects = 0;  // times it connected (again)
  // Its members' names are being looked up (off the loop): no handle yet,
  // and what is sent meanwhile is parked.
  bool awaiting_names = false;
  Clock::time_point started;
  // Requests made while it is not connected, sent once it is: the client
  // fails what it queued at every connection attempt that fails.
  std::vector<std::pair<std::uint64_t, std::function<int(zhandle_t*, void*)>>> parked;
};

namespace {

// A request's context, given to the client and back to a completion.
struct Ctx {
  std::shared_ptr<ZkStore::Sink> sink;
  std::uint64_t id = 0;
  std::uint64_t session = 0;  // Session::serial
  std::vector<zoo_op_result_t> results;  // multi
  std::string created;                   // multi: where a create op writes its path
};

struct WatchCtx {
  std::shared_ptr<ZkStore::Sink> sink;
  std::uint64_t serial = 0;
};

void deliver(const void* data, ZkStore::Result r);

void on_void(int rc, const void* data) {
  ZkStore::Result r;
  r.rc = rc;
  deliver(data, std::move(r));
}

void on_data(int rc, const char* value, int len, const Stat* stat, const void* data) {
  ZkStore::Result r;
  r.rc = rc;
  if (rc == ZOK) {
    if (value != nullptr && len > 0) r.value.assign(value, static_cast<std::size_t>(len));
    if (stat != nullptr) {
      r.has_stat = true;
      r.stat = *stat;
    }
  }
  deliver(data, std::move(r));
}

void on_strings(int rc, const String_vector* strings, const void* data) {
  ZkStore::Result r;
  r.rc = rc;
  if (rc == ZOK && strings != nullptr)
    for (int i = 0; i < strings->count; ++i) r.children.emplace_back(strings->data[i]);
  deliver(data, std::move(r));
}

void on_created(int rc, const char* path, const Stat* stat, const void* data) {
  ZkStore::Result r;
  r.rc = rc;
  if (rc == ZOK) {
    if (path != nullptr) r.value = path;
    if (stat != nullptr) {
      r.has_stat = true;
      r.stat = *stat;
    }
  }
  deliver(data, std::move(r));
}

void on_created_path(int rc, const char* path, const void* data) { on_created(rc, path, nullptr, data); }

void on_stat_set(int rc, const Stat* stat, const void* data) {
  ZkStore::Result r;
  r.rc = rc;
  if (rc == ZOK && stat != nullptr) {
    r.has_stat = true;
    r.stat = *stat;
  }
  deliver(data, std::move(r));
}

void on_multi(int rc, const void* data) {
  ZkStore::Result r;
  r.rc = rc;
  const auto* ctx = static_cast<const Ctx*>(data);
  for (const auto& res : ctx->results) r.op_errors.push_back(res.err);
  deliver(data, std::move(r));
}

void on_global_watch(zhandle_t*, int type, int state, const char* path, void* context) {
  auto* w = static_cast<WatchCtx*>(context);
  if (w == nullptr) return;
  const std::uint64_t serial = w->serial;
  if (type == ZOO_SESSION_EVENT) {
    w->sink->post([serial, state](ZkStore& s) { s.on_session_state(serial, state); });
    return;
  }
  if (path == nullptr) return;
  w->sink->post([type, p = std::string(path)](ZkStore& s) { s.on_watch(type, p); });
}

void drop_log(const char*) {}

bool keep_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ':' ||
         c == '-' || c == '=';
}

bool unescape(std::string_view text, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size()) return false;
    int hi = hex_digit(text[i + 1]), lo = hex_digit(text[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

constexpr std::string_view kNodePrefix = "lock-";
constexpr std::size_t kSeqDigits = 10;

// A child's sequence number (-1: not one of ours) and escaped token.
std::int64_t seq_of(std::string_view child, std::string_view* token = nullptr) {
  if (child.size() < kNodePrefix.size() + kSeqDigits + 1 || child.substr(0, kNodePrefix.size()) != kNodePrefix)
    return -1;
  std::string_view digits = child.substr(child.size() - kSeqDigits);
  if (child[child.size() - kSeqDigits - 1] != '-') return -1;
  std::int64_t seq = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), seq);
  if (ec != std::errc() || p != digits.data() + digits.size()) return -1;
  if (token != nullptr)
    *token = child.substr(kNodePrefix.size(), child.size() - kNodePrefix.size() - kSeqDigits - 1);
  return seq;
}

// A child's escaped token and attempt ("<token>.<attempt>[.<mode>]"; an
// escaped token has no '.').
std::pair<std::string_view, std::string_view> owner_of(std::string_view child) {
  std::string_view t;
  if (seq_of(child, &t) < 0) return {};
  auto dot = t.find('.');
  if (dot == std::string_view::npos) return {t, {}};
  std::string_view rest = t.substr(dot + 1);
  return {t.substr(0, dot), rest.substr(0, rest.find('.'))};
}

// How a child holds: its name's mode after the attempt, "r" a reader, "p<n>"
// a permit of n, "f" a fair lock's holder or waiter; none a writer (an exclusive lock, and every node a client
// without kinds made, so that such a client and this one never hold a
// reader beside a writer).
LockKind kind_of(std::string_view child) {
  std::string_view t;
  if (seq_of(child, &t) < 0) return LockKind::exclusive();
  auto first = t.find('.');
  auto second = first == std::string_view::npos ? first : t.find('.', first + 1);
  if (second == std::string_view::npos) return LockKind::exclusive();
  std::string_view mode = t.substr(second + 1);
  if (mode == "r") return LockKind::shared();
  if (mode == "f") return LockKind::fair();
  if (mode.size() > 1 && mode[0] == 'p') {
    std::uint32_t n = 0;
    auto [p, ec] = std::from_chars(mode.data() + 1, mode.data() + mode.size(), n);
    if (ec == std::errc() && p == mode.data() + mode.size() && n > 0) return LockKind::permits(n);
  }
  return LockKind::exclusive();  // unknown: the strictest reading
}

// The mode a node's name carries for `kind` (see kind_of).
std::string mode_suffix(LockKind kind) {
  switch (kind.mode()) {
    case LockKind::Mode::kShared: return ".r";
    case LockKind::Mode::kPermits: return ".p" + std::to_string(kind.permit_count());
    case LockKind::Mode::kFair: return ".f";
    case LockKind::Mode::kExclusive: break;
  }
  return "";
}

// A key's family as a message names it.
std::string family_of(LockKind kind) {
  switch (kind.mode()) {
    case LockKind::Mode::kShared: return "a shared lock";
    case LockKind::Mode::kPermits: return "a semaphore of " + kind.describe();
    case LockKind::Mode::kFair: return "a fair lock";
    case LockKind::Mode::kExclusive: break;
  }
  return "an exclusive lock";
}

// The lock's nodes in sequence order.
std::vector<std::string> in_order(std::vector<std::string> children) {
  std::erase_if(children, [](const std::string& c) { return seq_of(c) < 0; });
  std::sort(children.begin(), children.end(),
            [](const std::string& a, const std::string& b) { return seq_of(a) < seq_of(b); });
  return children;
}

// "<token>\n<ttl ms>\n<owner name>" (an owner name has no control
// characters; versions before wrote no third line).
std::string node_data(std::string_view token, milliseconds ttl, std::string_view owner) {
  return std::string(token) + "\n" + std::to_string(ttl.count()) + "\n" + std::string(owner);
}

// A node's data: the owner token and the ttl (ms; 0 when unreadable).
std::pair<std::string, long long> parse_data(const std::string& data, std::string* owner = nullptr) {
  auto nl = data.find('\n');
  if (nl == std::string::npos) return {data, 0};
  auto second = data.find('\n', nl + 1);
  const auto ttl_end = second == std::string::npos ? data.size() : second;
  long long ms = 0;
  std::from_chars(data.data() + nl + 1, data.data() + ttl_end, ms);
  if (owner != nullptr) *owner = second == std::string::npos ? std::string() : data.substr(second + 1);
  return {data.substr(0, nl), ms};
}

// Of a lock's nodes in order, those that hold it: the lowest (exclusive,
// fair), the readers below the first writer's node (shared), the n lowest
// (permits(n)).
std::vector<std::string> holding(const std::vector<std::string>& nodes) {
  if (nodes.empty()) return {};
  const LockKind first = kind_of(nodes.front());
  std::size_t n = 1;
  if (first.mode() == LockKind::Mode::kShared) {
    while (n < nodes.size() && kind_of(nodes[n]).mode() == LockKind::Mode::kShared) ++n;
  } else if (first.mode() == LockKind::Mode::kPermits) {
    n = std::min<std::size_t>(nodes.size(), first.permit_count());
  }
  return {nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(n)};
}

// Not ZooKeeper's: zookeeper_init() made no handle (no member's name
// resolved, or the client could not start its threads).
constexpr int kNoHandle = -1000;

bool unreachable(int rc) {
  return rc == kNoHandle || rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONEXPIRED || rc == ZSESSIONMOVED ||
         rc == ZCLOSING || rc == ZINVALIDSTATE || rc == ZSYSTEMERROR || rc == ZMARSHALLINGERROR ||
         rc == ZNOTHING || rc == ZNEWCONFIGNOQUORUM;
}

void deliver(const void* data, ZkStore::Result r) {
  auto* ctx = static_cast<Ctx*>(const_cast<void*>(data));
  const std::uint64_t id = ctx->id;
  auto sink = std::move(ctx->sink);
  {
    std::lock_guard lk(sink->ctx_mu);
    sink->in_flight.erase(ctx);
  }
  delete ctx;
  sink->post([id, r = std::move(r)](ZkStore& s) { s.complete(id, r); });
}

}  // namespace

void ZkStore::Sink::forget_session(std::uint64_t serial) {
  std::vector<Ctx*> left;
  {
    std::lock_guard lk(ctx_mu);
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      if (it->second == serial) {
        left.push_back(static_cast<Ctx*>(it->first));
        it = in_flight.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto* c : left) delete c;
}

// ---- set-up

std::string ZkStore::escape(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(bytes.size());
  for (unsigned char c : bytes) {
    if (keep_byte(c)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

void ZkStore::check_options(const ZkTarget&, const Options& options) {
  if (options.min_replicas > 0)
    throw InvalidArgument("Options::min_replicas applies to Redis replicas; a zookeeper:// store's writes are "
                          "committed by a majority of the ensemble");
  if (options.key_prefix.size() >= kMaxNameBytes)
    throw InvalidArgument("Options::key_prefix leaves no room for a key in a ZooKeeper lock name (255 bytes)");
}

ZkStore::ZkStore(Loop& loop, ZkTarget target, const Options& options)
    : StoreBase(StoreTraits{.keys = KeyRules{options.key_prefix, KeyRules::plain,
                             [](std::string_view prefix, std::string_view key) noexcept -> const char* {
                               if (prefix.size() + key.size() > kMaxNameBytes)
                                 return "the lock name (key_prefix + key) is longer than the 255 bytes a ZooKeeper "
                                        "lock name takes";
                               return nullptr;
                             }},
                            .release_events = true,
                            .no_shared = nullptr,
                            .no_permits = nullptr}),
      loop_(loop),
      options_(options),
      owner_(owner_name(options)),
      target_(std::move(target)),
      endpoint_(target_.name()),
      sink_(std::make_shared<Sink>()) {
  offer({.job_claims = this, .operator_tools = this, .lock_listing = this, .fair_queue = this});
  sink_->store = this;
  sink_->loop = &loop;
  closer_ = std::thread([this] {
    std::unique_lock lk(closer_mu_);
    for (;;) {
      closer_cv_.wait(lk, [this] { return closer_stop_ || !to_close_.empty(); });
      if (to_close_.empty() && closer_stop_) return;
      auto batch = std::move(to_close_);
      to_close_.clear();
      lk.unlock();
      for (auto& [zh, ctx] : batch) {
        zookeeper_close(zh);
        auto* w = static_cast<WatchCtx*>(ctx);
        if (w != nullptr) sink_->forget_session(w->serial);
        delete w;
      }
      lk.lock();
    }
  });
}

ZkStore::~ZkStore() {
  {
    std::lock_guard lk(closer_mu_);
    for (auto& [ms, s] : sessions_)
      if (s->zh != nullptr) to_close_.emplace_back(s->zh, s->watch_ctx);
    sessions_.clear();
    closer_stop_ = true;
  }
  closer_cv_.notify_all();
  closer_.join();
}

void ZkStore::started() {
  uv_timer_init(loop_.uv(), &sweep_);
  sweep_.data = this;
  auto every = std::clamp(std::min(options_.command_timeout, options_.connect_timeout) / 20, milliseconds(5),
                          milliseconds(50));
  uv_timer_start(&sweep_, on_sweep, every.count(), every.count());
  uv_timer_init(loop_.uv(), &cleanup_);
  cleanup_.data = this;
  started_ = true;
}

void ZkStore::close_later(zhandle_t* zh, void* watch_ctx) {
  if (zh == nullptr) {
    delete static_cast<WatchCtx*>(watch_ctx);
    return;
  }
  {
    std::lock_guard lk(closer_mu_);
    to_close_.emplace_back(zh, watch_ctx);
  }
  closer_cv_.notify_all();
}

ZkStore::Session* ZkStore::session_for(milliseconds ttl) {
  const long long ms = std::max<long long>(ttl.count(), 1);
  auto it = sessions_.find(ms);
  if (it != sessions_.end() && (it->second->zh != nullptr || it->second->awaiting_names)) return it->second.get();
  if (it != sessions_.end()) {  // its set-up failed: try again
    delete static_cast<WatchCtx*>(it->second->watch_ctx);
    sessions_.erase(it);
  }
  auto s = std::make_unique<Session>();
  s->serial = next_serial_++;
  s->requested_ms = ms;
  s->started = Clock::now();
  Session* raw = s.get();
  sessions_[ms] = std::move(s);
  // Member names are looked up on libuv's thread pool (the client library
  // would look them up in zookeeper_init(), on the loop), then the handle
  // is made on their addresses.
  std::vector<std::size_t> names;
  for (std::size_t i = 0; i < target_.hosts.size(); ++i)
    if (!numeric_host(target_.hosts[i].first)) names.push_back(i);
  if (names.empty()) {
    open_handle(*raw, target_.connect_string());
    return raw;
  }
  raw->awaiting_names = true;
  struct Lookup {
    std::vector<std::string> addresses;  // per member; empty: not resolved
    std::size_t left = 0;
  };
  auto lookup = std::make_shared<Lookup>();
  lookup->addresses.resize(target_.hosts.size());
  for (std::size_t i = 0; i < target_.hosts.size(); ++i)
    if (numeric_host(target_.hosts[i].first)) lookup->addresses[i] = target_.hosts[i].first;
  lookup->left = names.size();
  const std::uint64_t serial = raw->serial;
  for (std::size_t i : names) {
    auto done = [sink = sink_, lookup, i, serial, ms](int status, std::string address) {
      if (status == 0) lookup->addresses[i] = std::move(address);
      if (--lookup->left != 0) return;
      ZkStore* st;
      {
        std::lock_guard lk(sink->mu);
        st = sink->store;  // null once the store closed
      }
      if (st != nullptr) st->names_resolved(ms, serial, lookup->addresses);
    };
    if (resolve_host(loop_.uv(), target_.hosts[i].first, done) < 0) done(UV_EAI_NONAME, std::string());
  }
  return raw;
}

void ZkStore::names_resolved(long long ms, std::uint64_t serial, const std::vector<std::string>& addresses) {
  auto it = sessions_.find(ms);
  if (closed_ || it == sessions_.end() || it->second->serial != serial) return;
  Session& s = *it->second;
  s.awaiting_names = false;
  std::string hosts;
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    if (addresses[i].empty()) continue;
    if (!hosts.empty()) hosts += ',';
    const bool v6 = addresses[i].find(':') != std::string::npos;
    hosts += (v6 ? "[" + addresses[i] + "]" : addresses[i]) + ":" + std::to_string(target_.hosts[i].second);
  }
  if (!hosts.empty()) {
    open_handle(s, hosts + target_.chroot);
    if (s.zh != nullptr) return;  // parked requests go once it connects
  }
  // No member's name resolved: what waited fails now (kNoHandle), and
  // the next request starts over.
  auto parked = std::move(s.parked);
  s.parked.clear();
  for (auto& [id, issue] : parked) issue_now(s, id, issue);
}

void ZkStore::open_handle(Session& s, const std::string& hosts) {
  auto* w = new WatchCtx{sink_, s.serial};
  s.watch_ctx = w;
  // The timeout is an int of ms; the ensemble bounds it anyway.
  const int timeout = static_cast<int>(std::min<long long>(s.requested_ms, 1LL << 30));
  s.zh = zookeeper_init2(hosts.c_str(), on_global_watch, timeout, nullptr, w, 0, drop_log);
  if (s.zh != nullptr && target_.digest()) {
    const std::string cred = target_.user + ":" + target_.password;
    // Digest authentication is not checked when it is added: it gives the
    // session an identity, which the nodes' ACLs then admit or refuse.
    zoo_add_auth(s.zh, "digest", cred.data(), static_cast<int>(cred.size()), nullptr, nullptr);
  }
}

ZkStore::Session* ZkStore::any_session() {
  for (auto& [ms, s] : sessions_)
    if (s->zh != nullptr && s->state == Session::State::kConnected) return s.get();
  for (auto& [ms, s] : sessions_)
    if (s->zh != nullptr || s->awaiting_names) return s.get();
  return session_for(std::max(options_.connect_timeout, milliseconds(2000)));
}

ZkStore::Session* ZkStore::live(std::uint64_t serial) {
  for (auto& [ms, s] : sessions_)
    if (s->serial == serial && s->zh != nullptr && s->state != Session::State::kExpired) return s.get();
  return nullptr;
}

void ZkStore::retire(Session* s) {
  s->state = Session::State::kExpired;
  auto parked = std::move(s->parked);
  s->parked.clear();
  for (auto& [id, issue] : parked) {
    sink_->post([id](ZkStore& st) {
      Result r;
      r.rc = ZSESSIONEXPIRED;
      st.complete(id, r);
    });
  }
  close_later(s->zh, s->watch_ctx);
  s->zh = nullptr;
  s->watch_ctx = nullptr;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.session == s->serial)
      it = held_.erase(it);
    else
      ++it;
  }
  std::erase_if(marks_, [&](const auto& m) { return m.second.session == s->serial; });
  sessions_.erase(s->requested_ms);
}

void ZkStore::on_session_state(std::uint64_t serial, int state) {
  Session* s = nullptr;
  for (auto& [ms, each] : sessions_)
    if (each->serial == serial) s = each.get();
  if (s == nullptr || closed_) return;
  if (state == ZOO_CONNECTED_STATE) {
    const bool was_up = s->state == Session::State::kConnected;
    s->state = Session::State::kConnected;
    s->ever_connected = true;
    ++s->connects;
    s->negotiated_ms = zoo_recv_timeout(s->zh);
    auto parked = std::move(s->parked);
    s->parked.clear();
    const auto now = Clock::now();
    for (auto& [id, issue] : parked) {
      auto p = pending_.find(id);
      if (p == pending_.end()) continue;  // timed out meanwhile
      p->second.deadline = std::max(p->second.deadline, now + options_.command_timeout);
      issue_now(*s, id, issue);
    }
    if (!was_up && events_.connection) events_.connection(endpoint_, true, "");
    if (!cleanups_.empty()) run_cleanups();
  } else if (state == ZOO_CONNECTING_STATE || state == ZOO_ASSOCIATING_STATE) {
    if (s->state == Session::State::kConnected) {
      s->state = Session::State::kDisconnected;
      if (events_.connection) events_.connection(endpoint_, false, "connection to the ensemble lost");
    }
  } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
    const bool had_locks = std::any_of(held_.begin(), held_.end(), [&](const auto& h) { return h.second.session == serial; });
    if (state == ZOO_EXPIRED_SESSION_STATE) expired_.insert(serial);  // the ensemble says its nodes are gone
    retire(s);
    if (events_.connection)
      events_.connection(endpoint_, false,
                         state == ZOO_EXPIRED_SESSION_STATE ? "the session expired" : "authentication failed");
    if (events_.log && had_locks)
      events_.log(true, fmt::format("{}: a session expired; its locks are lost", endpoint_));
    if (events_.subscriptions_lost) events_.subscriptions_lost();
  }
}

void ZkStore::on_watch(int type, const std::string& path) {
  if (closed_ || (type != ZOO_DELETED_EVENT && type != ZOO_CHANGED_EVENT)) return;
  // /lockwatch/<name escaped>/lock-...
  const std::string root = std::string(kRoot) + "/";
  if (path.compare(0, root.size(), root) != 0) return;
  auto slash = path.find('/', root.size());
  if (slash == std::string::npos) return;
  std::string name;
  if (!unescape(std::string_view(path).substr(root.size(), slash - root.size()), name)) return;
  if (subscribed_.count(name) != 0 && events_.released) events_.released(name);
}

// ---- requests

void ZkStore::send_read(Session& s, Reply reply, Issue issue) {
  const std::uint64_t id = next_id_;
  send(s, std::move(reply), issue);
  if (auto p = pending_.find(id); p != pending_.end()) {
    p->second.again = std::move(issue);
    p->second.session = s.serial;
  }
}

bool ZkStore::resend(std::uint64_t id, Pending& p) {
  Session* s = closed_ || Clock::now() >= p.deadline ? nullptr : live(p.session);
  if (s == nullptr) return false;
  if (s->state == Session::State::kConnected && s->connects != p.connects)
    issue_now(*s, id, p.again);  // it connected again before this answer came
  else
    s->parked.emplace_back(id, p.again);  // sent when it connects (on_session_state)
  return true;
}

void ZkStore::send(Session& s, Reply reply, Issue issue) {
  const std::uint64_t id = next_id_++;
  // A request parked on a session that is not connected fails at this
  // deadline (sooner on one that never connected: the connect timeout
  // bounds that); one sent when the session connects has the command
  // timeout from then (see on_session_state).
  auto deadline = Clock::now() + options_.command_timeout;
  if (!s.ever_connected) deadline = std::min(deadline, s.started + options_.connect_timeout);
  pending_.emplace(id, Pending{deadline, std::move(reply), {}, 0, 0});
  if (!closed_ && (s.zh != nullptr || s.awaiting_names) && s.state != Session::State::kConnected) {
    s.parked.emplace_back(id, std::move(issue));  // sent on connecting, or timed out
    return;
  }
  issue_now(s, id, issue);
}

void ZkStore::issue_now(Session& s, std::uint64_t id, const Issue& issue) {
  int rc = closed_ ? ZCLOSING : kNoHandle;
  if (!closed_ && s.zh != nullptr) {
    if (auto p = pending_.find(id); p != pending_.end()) p->second.connects = s.connects;
    auto* ctx = new Ctx{sink_, id, s.serial, {}, {}};
    {
      std::lock_guard lk(sink_->ctx_mu);
      sink_->in_flight.emplace(ctx, s.serial);
    }
    rc = issue(s.zh, ctx);
    if (rc != ZOK) {
      {
        std::lock_guard lk(sink_->ctx_mu);
        sink_->in_flight.erase(ctx);
      }
      delete ctx;
    }
  }
  if (rc != ZOK) {
    // Never inside the call: the answer goes round the loop.
    sink_->post([id, rc](ZkStore& st) {
      Result r;
      r.rc = rc;
      st.complete(id, r);
    });
  }
}

void ZkStore::complete(std::uint64_t id, const Result& r) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;  // timed out already
  if (r.rc == ZCONNECTIONLOSS && it->second.again && resend(id, it->second)) return;
  Reply reply = std::move(it->second.reply);
  pending_.erase(it);
  reply(r);
}

void ZkStore::on_sweep(uv_timer_t* t) {
  auto* self = static_cast<ZkStore*>(t->data);
  auto now = Clock::now();
  self->expire_held(now);
  if (!self->deferred_.empty()) {
    std::vector<std::function<void()>> due;
    std::erase_if(self->deferred_, [&](auto& d) {
      if (d.first > now) return false;
      due.push_back(std::move(d.second));
      return true;
    });
    for (auto& f : due) f();
  }
  if (self->pending_.empty()) return;
  std::vector<std::uint64_t> late;
  for (const auto& [id, p] : self->pending_)
    if (p.deadline <= now) late.push_back(id);
  std::sort(late.begin(), late.end());
  Result timeout;
  timeout.rc = ZOPERATIONTIMEOUT;
  for (auto id : late) self->complete(id, timeout);
}

void ZkStore::expire_held(Clock::time_point now) {
  // A scan of the held locks at most every 20 ms: their expiry is a ttl
  // away, and a lease's own deadline came earlier.
  if ((held_.empty() && marks_.empty()) || now < next_expiry_scan_) return;
  next_expiry_scan_ = now + milliseconds(20);
  std::vector<Cleanup> gone;
  // A writer's mark no attempt renewed within its span goes too.
  for (auto it = marks_.begin(); it != marks_.end();) {
    if (it->second.until > now) {
      ++it;
      continue;
    }
    auto zero = it->first.find('\0');
    gone.push_back(Cleanup{it->first.substr(0, zero), it->first.substr(zero + 1), it->second.attempt,
                           it->second.session});
    it = marks_.erase(it);
  }
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    auto zero = it->first.find('\0');
    gone.push_back(Cleanup{it->first.substr(0, zero), it->first.substr(zero + 1), it->second.attempt,
                           it->second.session});
    it = held_.erase(it);
  }
  for (auto& c : gone)
    delete_nodes(c, [this, c](Released st, const StoreError*) {
      if (st == Released::kUnconfirmed) remember_cleanup(c);
    });
}

StoreError ZkStore::refusal(std::string why) const {
  return StoreError::invalid(endpoint_, std::move(why));
}

StoreError ZkStore::error(int rc, const std::string& doing) const {
  const char* text = rc == ZOPERATIONTIMEOUT ? "no answer within the timeout"
                     : rc == kNoHandle       ? "no session could be started (no member's name resolves?)"
                                             : zerror(rc);
  std::string message = doing.empty() ? std::string(text) : fmt::format("{}: {}", doing, text);
  StoreError e;
  if (unreachable(rc)) {
    e = StoreError::unavailable(endpoint_, message, zookeeper_code(rc));
  } else if (rc == ZNOAUTH || rc == ZAUTHFAILED) {
    e = StoreError::auth(endpoint_, message, zookeeper_code(rc));
  } else {
    e = StoreError::refused(endpoint_, message, zookeeper_code(rc));
  }
  return e;
}

std::string ZkStore::dir_of(std::string_view name) const { return std::string(kRoot) + "/" + escape(name); }

// ---- acquire

struct ZkStore::AcquireOp {
  std::string name;
  std::string token;
  milliseconds ttl{0};
  std::size_t index = 0;
  std::shared_ptr<AcquireDone> done;
  std::string dir;
  std::string path;  // our node, once made (or found)
  std::int64_t czxid = 0;
  std::uint64_t session = 0;
  std::uint64_t attempt = 0;  // in the node's name: this attempt's nodes only
  Clock::time_point sent;     // when the request that made (or found) the node went out
  LockKind kind{};
  bool repeat = false;     // a repeat of a granted acquisition: its fence again
  bool from_mark = false;  // a writer's attempt that found its own mark
  std::uint64_t fence = 0;
};

namespace {
// How long a waiting writer's node stops new readers without an attempt of
// its own (its ttl if shorter): a writer that gave up holds them back this
// long at most, as Redis's writer's mark does.
constexpr milliseconds kMarkSpan{2000};
// A fair waiter's node is its place in the queue: it lasts its ttl after
// its last attempt (the runtime tries again within a third of it).
milliseconds mark_span(milliseconds ttl, LockKind kind) {
  if (kind.mode() == LockKind::Mode::kFair) return std::max(ttl, milliseconds(1));
  return std::clamp(ttl, milliseconds(1), kMarkSpan);
}
constexpr const char* kFenceNode = "fence";
}  // namespace

void ZkStore::forget(const AcquireOp& op) {
  const std::string key = op.name + '\0' + op.token;
  held_.erase(key);
  if (auto m = marks_.find(key); m != marks_.end() && m->second.attempt == op.attempt) marks_.erase(m);
}

void ZkStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto shared_done = std::make_shared<AcquireDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    auto op = std::make_shared<AcquireOp>();
    op->name = std::string(locks[i].name);
    op->token = std::string(locks[i].token);
    op->ttl = locks[i].ttl;
    op->index = i;
    op->done = shared_done;
    op->dir = dir_of(op->name);
    op->kind = locks[i].kind;
    op->attempt = next_attempt_++;
    acquire_one(std::move(op));
  }
}

void ZkStore::finish(const std::shared_ptr<AcquireOp>& op, const Acquired& out) { (*op->done)(op->index, out); }

void ZkStore::fail(const std::shared_ptr<AcquireOp>& op, const StoreError& e) {
  Acquired out;
  out.error = e;
  finish(op, out);
}

void ZkStore::acquire_one(std::shared_ptr<AcquireOp> op) {
  if (closed_) {
    auto e = error(ZCLOSING, "");
    sink_->post([op, e](ZkStore& st) { st.fail(op, e); });
    return;
  }
  auto h = held_.find(op->name + '\0' + op->token);
  if (h != held_.end()) {
    // A repeat of an acquisition that took the lock: its node, if it is
    // still there, and only within its session's timeout.
    Session* s = live(h->second.session);
    if (s != nullptr) {
      if (op->ttl.count() > s->negotiated_ms) {
        auto e = refusal(
            fmt::format("a repeated acquisition asks a ttl of {} ms, longer than the {} ms session that holds the "
                        "lock: ZooKeeper cannot lengthen a session",
                        op->ttl.count(), s->negotiated_ms));
        sink_->post([op, e](ZkStore& st) { st.fail(op, e); });
        return;
      }
      op->path = h->second.path;
      op->czxid = h->second.czxid;
      op->session = s->serial;
      op->attempt = h->second.attempt;
      op->fence = h->second.fence;
      op->repeat = true;
      op->sent = Clock::now();
      list_nodes(std::move(op));
      return;
    }
    held_.erase(h);
  }
  if (auto m = marks_.find(op->name + '\0' + op->token); m != marks_.end()) {
    // A waiting writer tries again: its node, still in the queue, and
    // another span for its mark.
    Session* s = live(m->second.session);
    if (s != nullptr && op->kind.single_holder()) {
      op->path = m->second.path;
      op->czxid = m->second.czxid;
      op->session = s->serial;
      op->attempt = m->second.attempt;
      op->from_mark = true;
      op->sent = Clock::now();
      m->second.until = op->sent + mark_span(op->ttl, op->kind);
      list_nodes(std::move(op));
      return;
    }
    Cleanup c{op->name, op->token, m->second.attempt, m->second.session};
    marks_.erase(m);
    delete_nodes(c, [this, c](Released st, const StoreError*) {
      if (st == Released::kUnconfirmed) remember_cleanup(c);
    });
  }
  create_node(std::move(op), false);
}

void ZkStore::create_node(std::shared_ptr<AcquireOp> op, bool parents_made) {
  Session* s = session_for(op->ttl);
  const std::uint64_t serial = s->serial;
  op->session = serial;
  op->sent = Clock::now();
  const std::string prefix = op->dir + "/" + std::string(kNodePrefix) + escape(op->token) + "." +
                             std::to_string(op->attempt) + mode_suffix(op->kind) + "-";
  const std::string data = node_data(op->token, op->ttl, owner_);
  ACL_vector* acl = target_.digest() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
  send(
      *s,
      [this, op, serial, parents_made](const Result& r) {
        if (r.rc == ZNONODE && !parents_made) {
          make_parents(op, 0);
          return;
        }
        if (r.rc != ZOK) {
          // No answer: the node may be made yet (the client sends what it
          // queued once it connects), and the store removes it then.
          if (unreachable(r.rc)) abandon_attempt(op);
          fail(op, error(r.rc, "creating the lock's node"));
          return;
        }
        op->path = r.value;
        op->czxid = r.stat.czxid;
        Session* s = live(serial);
        if (s == nullptr) {
          fail(op, error(ZSESSIONEXPIRED, "the session ended"));
          return;
        }
        if (s->negotiated_ms == 0 && s->zh != nullptr) s->negotiated_ms = zoo_recv_timeout(s->zh);
        if (op->ttl.count() > s->negotiated_ms) {
          // The ensemble's maxSessionTimeout is below the ttl: a lease
          // would outlive what guards it. The node goes first (confirmed,
          // or left to the cleanups), then the lock is refused: nothing of
          // the refused call is in the queue when its caller hears.
          auto e = refusal(
              fmt::format("the ttl {} ms is longer than the session timeout the ZooKeeper ensemble grants "
                          "({} ms: its maxSessionTimeout); a lock's ttl is its session's timeout",
                          op->ttl.count(), s->negotiated_ms));
          delete_paths(*s, {op->path}, [this, op, e](int rc) {
            if (rc != ZOK) abandon_attempt(op);
            fail(op, e);
          });
          return;
        }
        list_nodes(op);
      },
      [=](zhandle_t* zh, void* ctx) {
        return zoo_acreate2(zh, prefix.c_str(), data.data(), static_cast<int>(data.size()), acl,
                            ZOO_EPHEMERAL_SEQUENTIAL, on_created, ctx);
      });
}

void ZkStore::abandon_attempt(const std::shared_ptr<AcquireOp>& op) {
  remember_cleanup(Cleanup{op->name, op->token, op->attempt, op->session});
}

void ZkStore::make_parents(std::shared_ptr<AcquireOp> op, int step) {
  Session* s = session_for(op->ttl);
  ACL_vector* acl = target_.digest() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
  const std::string path = step == 0 ? std::string(kRoot) : op->dir;
  send(
      *s,
      [this, op, step](const Result& r) {
        if (r.rc != ZOK && r.rc != ZNODEEXISTS) {
          fail(op, error(r.rc, r.rc == ZNONODE && !target_.chroot.empty()
                                   ? fmt::format("the chroot {} does not exist on the ensemble", target_.chroot)
                                   : std::string("creating the lock's directory")));
          return;
        }
        if (step == 0)
          make_parents(op, 1);
        else
          create_node(op, true);
      },
      [=](zhandle_t* zh, void* ctx) {
        return zoo_acreate(zh, path.c_str(), "", 0, acl, ZOO_PERSISTENT, on_created_path, ctx);
      });
}

void ZkStore::list_nodes(std::shared_ptr<AcquireOp> op) {
  Session* s = live(op->session);
  if (s == nullptr) {
    forget(*op);
    auto e = error(ZSESSIONEXPIRED, "the session that made the lock's node ended");
    sink_->post([op, e](ZkStore& st) { st.fail(op, e); });
    return;
  }
  const std::string dir = op->dir;
  send_read(
      *s,
      [this, op](const Result& r) {
        Session* s = live(op->session);
        if (r.rc != ZOK || s == nullptr) {
          abandon_attempt(op);
          forget(*op);
          fail(op, error(r.rc != ZOK ? r.rc : ZSESSIONEXPIRED, "listing the lock's nodes"));
          return;
        }
        auto nodes = in_order(r.children);
        const std::string own_child = op->path.substr(op->path.rfind('/') + 1);
        auto own = std::find(nodes.begin(), nodes.end(), own_child);
        if (own == nodes.end() && op->from_mark) {
          // The store removed the writer's mark meanwhile (its span
          // passed): a new node, at the back of the queue.
          forget(*op);
          op->from_mark = false;
          op->attempt = next_attempt_++;
          create_node(op, true);
          return;
        }
        if (own == nodes.end()) {
          // Gone: its session expired meanwhile (or an operator removed it).
          forget(*op);
          fail(op, error(ZSESSIONEXPIRED, "the lock's node is gone"));
          return;
        }
        decide(op, nodes, static_cast<std::size_t>(own - nodes.begin()));
      },
      [=](zhandle_t* zh, void* ctx) { return zoo_aget_children(zh, dir.c_str(), 0, on_strings, ctx); });
}

// Who holds, from one listing in sequence order (nodes only come in
// behind ours, so what is below ours decides, and it only shrinks):
//   family     a node below ours of the other family (permits against
//              exclusive or shared), or permits of another n: refused
//              (InvalidArgument), our node removed. The first node decides,
//              so a later caller that disagrees never holds.
//   exclusive  ours is the lowest (a writer, and a plain mutex).
//   fair       ours is the lowest; else our node stays, our place.
//   shared     no writer's node below ours.
//   permits(n) ours is one of the n lowest.
void ZkStore::decide(const std::shared_ptr<AcquireOp>& op, const std::vector<std::string>& nodes, std::size_t at) {
  const bool permits = op->kind.mode() == LockKind::Mode::kPermits;
  const bool fair = op->kind.mode() == LockKind::Mode::kFair;
  for (std::size_t i = 0; i < at; ++i) {
    LockKind k = kind_of(nodes[i]);
    const bool other_permits = k.mode() == LockKind::Mode::kPermits;
    const bool other_fair = k.mode() == LockKind::Mode::kFair;
    if (permits != other_permits || fair != other_fair ||
        (permits && k.permit_count() != op->kind.permit_count())) {
      refuse_kind(op, k);
      return;
    }
  }
  const std::string dir = op->dir + "/";
  switch (op->kind.mode()) {
    case LockKind::Mode::kFair: {
      if (at == 0) break;
      // Our node is our place in the queue, kept (a mark) while we try
      // again within its span, watching the node just below: its deletion
      // (a release, a waiter that gave up, a session that expired) is the
      // notice. Nodes only come in behind ours, so the order is arrival.
      wait_behind(op, {dir + nodes[at - 1]}, true, mark_span(op->ttl, op->kind) / 3);
      return;
    }
    case LockKind::Mode::kExclusive: {
      if (at == 0) break;
      // Only readers below: our node stays, a mark that stops new readers
      // (writers are not starved), watching the node just below. Behind
      // another writer: our node goes and the holder is watched.
      const bool readers_only = std::none_of(nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(at),
                                             [](const std::string& n) { return kind_of(n).exclusive_kind(); });
      if (readers_only) {
        wait_behind(op, {dir + nodes[at - 1]}, true, mark_span(op->ttl, op->kind) / 2);
      } else {
        forget(*op);
        wait_behind(op, {dir + nodes.front()}, false, milliseconds::max());
      }
      return;
    }
    case LockKind::Mode::kShared: {
      // The nearest writer's node below ours is watched. Not the lowest, it
      // is a waiting writer's, which the store removes 2 s after its last
      // attempt: the next try comes by then even if no notice does.
      for (std::size_t i = at; i-- > 0;) {
        if (kind_of(nodes[i]).exclusive_kind()) {
          forget(*op);
          wait_behind(op, {dir + nodes[i]}, false, i == 0 ? milliseconds::max() : kMarkSpan);
          return;
        }
      }
      break;
    }
    case LockKind::Mode::kPermits: {
      const std::size_t n = op->kind.permit_count();
      if (at < n) break;
      // Any holder's release frees a permit: each of the n is watched.
      std::vector<std::string> holders;
      for (std::size_t i = 0; i < n; ++i) holders.push_back(dir + nodes[i]);
      forget(*op);
      wait_behind(op, std::move(holders), false, milliseconds::max());
      return;
    }
  }
  grant(op);
}

void ZkStore::withdraw(const LockRef& lock, WithdrawDone done) {
  const std::string key = std::string(lock.name) + '\0' + std::string(lock.token);
  auto m = marks_.find(key);
  if (m == marks_.end()) {
    // Not queued (never, or its place ran out): nothing to take out.
    sink_->post([done = std::move(done)](ZkStore&) { done(nullptr); });
    return;
  }
  Cleanup c{std::string(lock.name), std::string(lock.token), m->second.attempt, m->second.session};
  marks_.erase(m);
  delete_nodes(c, [this, c, done = std::move(done)](Released st, const StoreError* err) {
    if (st == Released::kUnconfirmed) remember_cleanup(c);
    done(st == Released::kUnconfirmed ? err : nullptr);
  });
}

void ZkStore::refuse_kind(const std::shared_ptr<AcquireOp>& op, LockKind held_as) {
  forget(*op);
  auto e = refusal(fmt::format("the lock '{}' is held as {}; this call asked for it {}", op->name,
                               family_of(held_as), op->kind.describe()));
  Session* s = live(op->session);
  if (s == nullptr) {
    fail(op, e);
    return;
  }
  // Our node goes first (confirmed, or left to the cleanups): nothing of a
  // refused call stays in the queue.
  delete_paths(*s, {op->path}, [this, op, e](int rc) {
    if (rc != ZOK) abandon_attempt(op);
    fail(op, e);
  });
}

// A grant's fencing token:
//   exclusive  (and fair) our node's czxid (holders follow creation order); the
//              directory's `fence` node is set to it before the answer, so
//              readers that come after it see it.
//   shared     the `fence` node's data, read after the listing that let us
//              in: the token of the last writer granted before us (0 if
//              none ever was). No writer is granted while our node is there
//              (its node would be above ours), so none is missed.
//   permits    the zxid of the write that sets `fence` for this grant:
//              every grant writes, so every grant's token is above all
//              earlier ones (node order alone is not grant order here).
// A repeat of a granted acquisition answers the token it was given.
void ZkStore::grant(const std::shared_ptr<AcquireOp>& op) {
  const std::string key = op->name + '\0' + op->token;
  if (op->from_mark) {
    auto m = marks_.find(key);
    if (m == marks_.end() || m->second.attempt != op->attempt) {
      // The mark's span passed as the listing came back: the store is
      // removing the node. A new one, at the back of the queue.
      op->from_mark = false;
      op->attempt = next_attempt_++;
      create_node(op, true);
      return;
    }
    marks_.erase(m);
    op->from_mark = false;
  }
  auto done = [this, op, key](std::uint64_t fence) {
    held_[key] = Held{op->path, op->session, op->czxid, op->attempt, op->ttl,
                      gone_by(options_, op->sent, op->ttl), fence};
    Acquired out;
    out.status = Acquired::Status::kTaken;
    out.fence = fence;
    finish(op, out);
  };
  if (op->repeat) {
    done(op->fence);
    return;
  }
  Session* s = live(op->session);
  if (s == nullptr) {
    fail(op, error(ZSESSIONEXPIRED, "the session that made the lock's node ended"));
    return;
  }
  auto failed = [this, op](int rc, const char* doing) {
    abandon_attempt(op);
    fail(op, error(rc, doing));
  };
  if (op->kind.mode() == LockKind::Mode::kShared) {
    const std::string fence_path = op->dir + "/" + kFenceNode;
    send_read(
        *s,
        [op, done, failed](const Result& r) {
          if (r.rc != ZOK && r.rc != ZNONODE) {
            failed(r.rc, "reading the last writer's fencing token");
            return;
          }
          std::uint64_t fence = 0;
          if (r.rc == ZOK) std::from_chars(r.value.data(), r.value.data() + r.value.size(), fence);
          done(fence);
        },
        [=](zhandle_t* zh, void* ctx) { return zoo_aget(zh, fence_path.c_str(), 0, on_data, ctx); });
    return;
  }
  const bool permit = op->kind.mode() == LockKind::Mode::kPermits;
  write_fence(*s, op->dir, std::to_string(op->czxid), [op, done, failed, permit](int rc, std::int64_t zxid) {
    if (rc != ZOK) {
      failed(rc, "setting the lock's fencing token");
      return;
    }
    done(static_cast<std::uint64_t>(permit ? zxid : op->czxid));
  });
}

void ZkStore::write_fence(Session& s, const std::string& dir, std::string data,
                          std::function<void(int, std::int64_t)> done, bool made) {
  const std::string path = dir + "/" + kFenceNode;
  const std::uint64_t serial = s.serial;
  ACL_vector* acl = target_.digest() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
  auto reply = [this, dir, data, done, made, serial](const Result& r) {
    if (r.rc == ZOK) {
      done(ZOK, r.has_stat ? r.stat.mzxid : 0);
      return;
    }
    Session* s = live(serial);
    if ((r.rc == ZNONODE || r.rc == ZNODEEXISTS) && !made && s != nullptr) {
      // Made by another meanwhile (or removed by an operator): once more.
      write_fence(*s, dir, data, done, true);
      return;
    }
    done(r.rc, 0);
  };
  if (!made) {
    send(s, reply, [=](zhandle_t* zh, void* ctx) {
      return zoo_aset(zh, path.c_str(), data.data(), static_cast<int>(data.size()), -1, on_stat_set, ctx);
    });
    return;
  }
  // The second try makes the node, or sets it if another made it.
  send(
      s,
      [this, path, data, done, serial](const Result& r) {
        if (r.rc != ZNODEEXISTS) {
          done(r.rc, r.rc == ZOK && r.has_stat ? r.stat.mzxid : 0);
          return;
        }
        Session* s = live(serial);
        if (s == nullptr) {
          done(ZSESSIONEXPIRED, 0);
          return;
        }
        send(
            *s, [done](const Result& r) { done(r.rc, r.rc == ZOK && r.has_stat ? r.stat.mzxid : 0); },
            [=](zhandle_t* zh, void* ctx) {
              return zoo_aset(zh, path.c_str(), data.data(), static_cast<int>(data.size()), -1, on_stat_set, ctx);
            });
      },
      [=](zhandle_t* zh, void* ctx) {
        return zoo_acreate2(zh, path.c_str(), data.data(), static_cast<int>(data.size()), acl, ZOO_PERSISTENT,
                            on_created, ctx);
      });
}

void ZkStore::wait_behind(const std::shared_ptr<AcquireOp>& op, std::vector<std::string> watch, bool keep_node,
                          milliseconds cap) {
  Session* s = live(op->session);
  if (s == nullptr) {
    forget(*op);
    fail(op, error(ZSESSIONEXPIRED, "the session that made the lock's node ended"));
    return;
  }
  // Then the nodes waited on are read with a watch: a deletion is the
  // release notice, and their ttl the busy time.
  auto read_watched = [this, op, watch = std::move(watch), cap]() {
    Session* s = live(op->session);
    if (s == nullptr) {
      fail(op, error(ZSESSIONEXPIRED, "the session that made the lock's node ended"));
      return;
    }
    struct Wait {
      std::size_t left;
      milliseconds busy_for;
      int rc = ZOK;
    };
    auto w = std::make_shared<Wait>(Wait{watch.size(), cap, ZOK});
    for (const auto& path : watch) {
      send_read(
          *s,
          [this, op, w](const Result& r) {
            if (r.rc == ZOK) {
              auto [token, ttl_ms] = parse_data(r.value);
              w->busy_for = std::min(w->busy_for, milliseconds(ttl_ms > 0 ? ttl_ms : op->ttl.count()));
            } else if (r.rc == ZNONODE) {
              w->busy_for = milliseconds(1);  // released meanwhile: try again now
            } else if (w->rc == ZOK) {
              w->rc = r.rc;
            }
            if (--w->left != 0) return;
            if (w->rc != ZOK) {
              fail(op, error(w->rc, "watching the holder's node"));
              return;
            }
            Acquired out;
            out.status = Acquired::Status::kBusy;
            out.busy_for = std::max(w->busy_for, milliseconds(1));
            finish(op, out);
          },
          [=](zhandle_t* zh, void* ctx) { return zoo_aget(zh, path.c_str(), 1, on_data, ctx); });
    }
  };
  if (keep_node) {
    // A waiting writer's mark: the store removes it unless the same
    // acquisition tries again within its span.
    marks_[op->name + '\0' + op->token] =
        Mark{op->path, op->session, op->czxid, op->attempt, Clock::now() + mark_span(op->ttl, op->kind)};
    read_watched();
    return;
  }
  // Our node goes (confirmed first, so that none is left to come to the
  // front unowned).
  delete_paths(*s, {op->path}, [this, op, read_watched](int rc) {
    if (rc != ZOK) {
      abandon_attempt(op);
      fail(op, error(rc, "removing a waiter's node"));
      return;
    }
    read_watched();
  });
}

void ZkStore::delete_paths(Session& s, std::vector<std::string> paths, std::function<void(int rc)> done) {
  if (paths.empty()) {
    sink_->post([done = std::move(done)](ZkStore&) { done(ZOK); });
    return;
  }
  struct State {
    std::size_t left;
    int rc = ZOK;
    std::function<void(int)> done;
  };
  auto st = std::make_shared<State>(State{paths.size(), ZOK, std::move(done)});
  for (const auto& p : paths) {
    send(
        s,
        [st](const Result& r) {
          if (r.rc != ZOK && r.rc != ZNONODE && st->rc == ZOK) st->rc = r.rc;
          if (r.rc == ZNONODE && st->rc == ZOK) st->rc = ZOK;
          if (--st->left == 0) st->done(st->rc);
        },
        [=](zhandle_t* zh, void* ctx) { return zoo_adelete(zh, p.c_str(), -1, on_void, ctx); });
  }
}

// ---- renew

namespace {
// Check operations per multi: well within jute.maxbuffer for the longest
// paths.
constexpr std::size_t kChunk = 256;
}  // namespace

std::size_t ZkStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) {
  auto shared_done = std::make_shared<RenewDone>(std::move(done));
  // By session: one multi of checks per chunk.
  std::map<std::uint64_t, std::vector<RenewCheck>> by_session;
  std::vector<std::pair<std::size_t, Renewed>> now;
  StoreError down = error(ZCONNECTIONLOSS, "the session is disconnected");
  std::vector<std::size_t> transient;
  for (std::size_t i = 0; i < locks.size(); ++i) {
    std::string key = std::string(locks[i].name) + '\0' + std::string(locks[i].token);
    auto h = held_.find(key);
    Session* s = h == held_.end() ? nullptr : live(h->second.session);
    if (s == nullptr) {
      now.emplace_back(i, Renewed::kGone);  // its session expired (or it was never ours)
    } else if (s->state != Session::State::kConnected) {
      transient.push_back(i);
    } else {
      by_session[s->serial].push_back(RenewCheck{i, h->second.path, std::move(key), h->second.attempt, locks[i].ttl});
    }
  }
  if (!now.empty() || !transient.empty())
    sink_->post([shared_done, now, transient, down, keepalive](ZkStore&) {
      for (auto [i, st] : now) (*shared_done)(i, st, nullptr);
      for (auto i : transient) (*shared_done)(i, Renewed::kTransient, &down);
    });
  std::size_t commands = 0;
  for (auto& [serial, members] : by_session) {
    for (std::size_t from = 0; from < members.size(); from += kChunk) {
      auto chunk = std::make_shared<std::vector<RenewCheck>>(
          members.begin() + from, members.begin() + std::min(members.size(), from + kChunk));
      const auto sent = Clock::now();
      ++commands;
      Session* s = live(serial);
      send(
          *s,
          [this, chunk, shared_done, keepalive, sent](const Result& r) { renew_answered(*chunk, *shared_done, sent, r); },
          [=](zhandle_t* zh, void* ctx) {
            auto* c = static_cast<Ctx*>(ctx);
            c->results.resize(chunk->size());
            std::vector<zoo_op_t> ops(chunk->size());
            for (std::size_t k = 0; k < chunk->size(); ++k) zoo_check_op_init(&ops[k], (*chunk)[k].path.c_str(), -1);
            return zoo_amulti(zh, static_cast<int>(ops.size()), ops.data(), c->results.data(), on_multi, ctx);
          });
    }
  }
  return commands;
}

void ZkStore::renew_answered(const std::vector<RenewCheck>& chunk, const RenewDone& done, Clock::time_point sent,
                             const Result& r) {
  // Confirmed: the lock's expiry moves on, unless the store removed it
  // meanwhile (its expiry passed): then it is gone.
  auto confirm = [&](const RenewCheck& c) {
    auto h = held_.find(c.key);
    if (h == held_.end() || h->second.attempt != c.attempt) {
      done(c.index, Renewed::kGone, nullptr);
      return;
    }
    h->second.expires = std::max(h->second.expires, gone_by(options_, sent, c.ttl));
    done(c.index, Renewed::kYes, nullptr);
  };
  if (r.rc == ZOK) {
    for (const auto& c : chunk) confirm(c);
    return;
  }
  if (r.op_errors.size() == chunk.size() && !unreachable(r.rc)) {
    // A check failed: each operation says which. Those before it were
    // answered (ours, and the session alive); a node gone is a lock gone;
    // the rest were not tried.
    StoreError again = error(ZCONNECTIONLOSS, "a renewal in a batch with a lost lock");
    for (std::size_t k = 0; k < chunk.size(); ++k) {
      int e = r.op_errors[k];
      auto i = chunk[k].index;
      if (e == ZOK)
        confirm(chunk[k]);
      else if (e == ZNONODE || e == ZBADVERSION)
        done(i, Renewed::kGone, nullptr);
      else
        done(i, Renewed::kTransient, &again);
    }
    return;
  }
  if (r.rc == ZSESSIONEXPIRED) {
    for (const auto& c : chunk) done(c.index, Renewed::kGone, nullptr);
    return;
  }
  StoreError e = error(r.rc, "renewing");
  for (const auto& c : chunk) done(c.index, Renewed::kTransient, &e);
}

// ---- release

void ZkStore::release(std::span<const LockRef> locks, bool, ReleaseDone done) {
  // Every release wakes the holder's watchers: ZooKeeper has no quiet delete.
  auto shared_done = std::make_shared<ReleaseDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    Cleanup c{std::string(locks[i].name), std::string(locks[i].token), 0, 0};
    auto h = held_.find(c.name + '\0' + c.token);
    if (h != held_.end()) {
      // On the session that made it: the session's order puts this after
      // anything it sent before. Every node of the token goes, the held
      // one and any an earlier attempt of the same acquisition made late
      // (a request the ensemble ran after its answer was given up on).
      c.session = h->second.session;
      held_.erase(h);
    }
    marks_.erase(c.name + '\0' + c.token);  // a waiting writer's node goes with the rest of the token's
    // Otherwise not known here (an acquisition whose answer was lost):
    // every node of the token, on any session.
    delete_nodes(c, [this, i, c, shared_done](Released st, const StoreError* e) {
      if (st != Released::kUnconfirmed) {
        (*shared_done)(i, st, e);
        return;
      }
      remember_cleanup(c);
      // Held here when the release began: its node found gone afterwards
      // went with the session ended below, or with one the ensemble
      // expired, which cannot come before the lease's deadline (a ttl
      // after the last renewal it answered). The release is done; that
      // deadline, the runtime's own, says whether the lease was kept.
      const bool ends_with_its_session = c.session != 0;
      give_up_release(
          c, *e, [i, shared_done](const StoreError& err) { (*shared_done)(i, Released::kUnconfirmed, &err); },
          [i, shared_done, ends_with_its_session](Released confirmed) {
            if (ends_with_its_session && confirmed == Released::kGone) confirmed = Released::kYes;
            (*shared_done)(i, confirmed, nullptr);
          });
    });
  }
}

// A node this store could not remove lives as long as its session does,
// which may be much longer than the lock's ttl: the runtime would take the
// lock for gone by then. So the sessions that may hold it end now (their
// other locks are lost with them: their renewals answer "gone"), and the
// release is answered once the ensemble has surely expired them (their
// timeout plus the drift allowance, on our clock), not before.
void ZkStore::give_up_release(const Cleanup& c, StoreError why, std::function<void(const StoreError&)> answer,
                              std::function<void(Released)> confirmed) {
  std::vector<Session*> ending;
  auto add = [&](std::uint64_t serial) {
    if (Session* s = live(serial); s != nullptr && std::find(ending.begin(), ending.end(), s) == ending.end())
      ending.push_back(s);
  };
  if (c.session != 0) add(c.session);
  for (const auto& other : cleanups_)
    if (other.token == c.token && other.name == c.name && other.session != 0) add(other.session);
  milliseconds wait{0};
  for (Session* s : ending) {
    wait = std::max(wait, milliseconds(std::max<long long>(s->negotiated_ms, s->requested_ms)));
    const std::uint64_t serial = s->serial;
    const bool had_locks =
        std::any_of(held_.begin(), held_.end(), [&](const auto& h) { return h.second.session == serial; });
    retire(s);
    if (events_.log)
      events_.log(true, fmt::format("{}: a lock's release could not be confirmed; its session ends so that the "
                                    "ensemble removes its node{}",
                                    endpoint_, had_locks ? " (the session's other locks are lost with it)" : ""));
    if (events_.subscriptions_lost) events_.subscriptions_lost();
  }
  if (wait.count() == 0) {
    sink_->post([answer = std::move(answer), why](ZkStore&) { answer(why); });
    return;
  }
  // Meanwhile the node is looked for from a new session, again and again:
  // found gone or removed, the release is confirmed after all (a quorum
  // that comes back gives every session a fresh timeout, so waiting alone
  // could end before the ensemble removes it).
  auto state = std::make_shared<GiveUp>();
  state->c = c;
  state->c.session = 0;
  state->c.attempt = 0;
  state->why = std::move(why);
  state->answer = std::move(answer);
  state->answer_confirmed = std::move(confirmed);
  state->until = gone_by(options_, Clock::now(), wait);
  retry_give_up(state);
}

void ZkStore::retry_give_up(std::shared_ptr<GiveUp> g) {
  if (g->answered) return;
  delete_nodes(g->c, [this, g](Released st, const StoreError*) {
    if (g->answered) return;
    if (st != Released::kUnconfirmed) {
      g->answered = true;
      g->answer_confirmed(st);
      return;
    }
    if (Clock::now() >= g->until || closed_) {
      g->answered = true;
      g->answer(g->why);
      return;
    }
    deferred_.emplace_back(std::min(g->until, Clock::now() + options_.reconnect_min), [this, g] {
      if (closed_) {
        if (!g->answered) {
          g->answered = true;
          g->answer(g->why);
        }
        return;
      }
      retry_give_up(g);
    });
  });
}

void ZkStore::delete_nodes(const Cleanup& c, std::function<void(Released, const StoreError*)> done) {
  Session* s = c.session != 0 ? live(c.session) : any_session();
  if (s == nullptr && expired_.count(c.session) != 0) {
    // The ensemble expired its session: it removed its nodes with it.
    sink_->post([done = std::move(done)](ZkStore&) { done(Released::kGone, nullptr); });
    return;
  }
  // A session this store ended itself may live on in the ensemble until
  // it expires there: its nodes are looked for from another.
  if (s == nullptr) s = any_session();
  const std::string dir = dir_of(c.name);
  const std::uint64_t serial = s->serial;
  send_read(
      *s,
      [this, dir, c, serial, done = std::move(done)](const Result& r) {
        if (r.rc == ZNONODE) {
          done(Released::kGone, nullptr);
          return;
        }
        Session* s = live(serial);
        if (r.rc == ZSESSIONEXPIRED && c.session != 0) {
          done(Released::kGone, nullptr);
          return;
        }
        if (r.rc != ZOK || s == nullptr) {
          auto e = error(r.rc != ZOK ? r.rc : ZSESSIONEXPIRED, "listing the lock's nodes");
          done(Released::kUnconfirmed, &e);
          return;
        }
        const std::string token = escape(c.token);
        const std::string attempt = std::to_string(c.attempt);
        std::vector<std::string> mine;
        for (const auto& n : r.children) {
          auto [t, a] = owner_of(n);
          if (t == token && (c.attempt == 0 || a == attempt)) mine.push_back(dir + "/" + n);
        }
        if (mine.empty()) {
          done(Released::kGone, nullptr);
          return;
        }
        delete_paths(*s, mine, [this, done](int rc) {
          if (rc == ZOK) {
            done(Released::kYes, nullptr);
          } else {
            auto e = error(rc, "deleting the lock's node");
            done(Released::kUnconfirmed, &e);
          }
        });
      },
      [=](zhandle_t* zh, void* ctx) { return zoo_aget_children(zh, dir.c_str(), 0, on_strings, ctx); });
}

// Nodes whose removal found no answer: such a node would hold the lock for
// as long as its session lives (a waiter's node would come to the front),
// so the store keeps at it, after each reconnect and on a back-off, until
// an answer settles it (or the session ends, taking its nodes along).
void ZkStore::remember_cleanup(Cleanup c) {
  if (closed_) return;
  cleanups_.push_back(std::move(c));
  if (!cleaning_ && started_) {
    uv_timer_start(&cleanup_, on_cleanup, static_cast<std::uint64_t>(cleanup_backoff_.next().count()), 0);
  }
}

void ZkStore::on_cleanup(uv_timer_t* t) { static_cast<ZkStore*>(t->data)->run_cleanups(); }

void ZkStore::run_cleanups() {
  if (cleaning_ || closed_ || cleanups_.empty()) return;
  cleaning_ = true;
  auto batch = std::make_shared<std::vector<Cleanup>>(std::move(cleanups_));
  cleanups_.clear();
  auto left = std::make_shared<std::size_t>(batch->size());
  auto retry = std::make_shared<std::vector<Cleanup>>();
  for (const auto& c : *batch) {
    delete_nodes(c, [this, left, retry, c](Released st, const StoreError*) {
      if (st == Released::kUnconfirmed) retry->push_back(c);
      if (--*left != 0) return;
      cleaning_ = false;
      if (retry->empty() && cleanups_.empty()) {
        cleanup_backoff_.reset();
        return;
      }
      auto again = std::move(*retry);
      for (auto& each : again) remember_cleanup(std::move(each));
      if (again.empty() && !cleanups_.empty()) run_cleanups();
    });
  }
}

// ---- scheduled jobs

namespace {
constexpr int kClaimAttempts = 5;  // a version changed under us: read again
constexpr const char* kPeriodNode = "period";

std::chrono::system_clock::time_point from_ms(std::int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}
}  // namespace

void ZkStore::server_time(TimeDone done) {
  Session* s = any_session();
  const std::uint64_t serial = s->serial;
  auto shared = std::make_shared<TimeDone>(std::move(done));
  // A write's mtime is the leader's clock when it ran the write.
  send(
      *s,
      [this, shared, serial](const Result& r) {
        if (r.rc == ZNONODE) {
          // No lock taken on this ensemble yet: /lockwatch first.
          Session* s = live(serial);
          if (s == nullptr) {
            auto e = error(ZSESSIONEXPIRED, "reading the ensemble's clock");
            (*shared)({}, &e);
            return;
          }
          ACL_vector* acl = target_.digest() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
          send(
              *s,
              [this, shared](const Result& r) {
                if (r.rc != ZOK && r.rc != ZNODEEXISTS) {
                  auto e = error(r.rc, "creating /lockwatch");
                  (*shared)({}, &e);
                  return;
                }
                server_time([shared](std::chrono::system_clock::time_point t, const StoreError* e) { (*shared)(t, e); });
              },
              [=](zhandle_t* zh, void* ctx) {
                return zoo_acreate(zh, kRoot, "", 0, acl, ZOO_PERSISTENT, on_created_path, ctx);
              });
          return;
        }
        if (r.rc != ZOK || !r.has_stat) {
          auto e = error(r.rc != ZOK ? r.rc : ZMARSHALLINGERROR, "reading the ensemble's clock");
          (*shared)({}, &e);
          return;
        }
        (*shared)(from_ms(r.stat.mtime), nullptr);
      },
      [=](zhandle_t* zh, void* ctx) { return zoo_aset(zh, kRoot, "", 0, -1, on_stat_set, ctx); });
}

struct ZkStore::Claim {
  std::string name;
  std::string token;
  std::int64_t period = 0;
  std::chrono::system_clock::time_point start;
  ClaimDone done;
  int attempt = 0;
  ClaimResult out;
};

void ZkStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                           std::chrono::system_clock::time_point start, ClaimDone done) {
  auto c = std::make_shared<Claim>();
  c->name = std::string(name);
  c->token = std::string(token);
  c->period = period;
  c->start = start;
  c->done = std::move(done);
  // The clock first: a claim runs only once the ensemble's clock reached
  // the period's start (the write after it is later still).
  server_time([this, c](std::chrono::system_clock::time_point now, const StoreError* e) {
    if (e != nullptr) {
      c->out.status = ClaimResult::Status::kFailed;
      c->out.error = *e;
      c->done(c->out);
      return;
    }
    c->out.store_time = now;
    if (now < c->start) {
      c->out.status = ClaimResult::Status::kNotDue;
      c->done(c->out);
      return;
    }
    claim_step(c);
  });
}

void ZkStore::claim_step(std::shared_ptr<Claim> c) {
  auto finish_with = [c](ClaimResult::Status st) {
    c->out.status = st;
    c->done(c->out);
  };
  auto h = held_.find(c->name + '\0' + c->token);
  Session* s = h == held_.end() ? nullptr : live(h->second.session);
  if (s == nullptr) {
    finish_with(ClaimResult::Status::kNotLeader);
    return;
  }
  const std::string lock_path = h->second.path;
  const std::string period_path = dir_of(c->name) + "/" + kPeriodNode;
  const std::uint64_t serial = s->serial;
  send_read(
      *s,
      [this, c, lock_path, period_path, serial, finish_with](const Result& r) {
        if (r.rc != ZOK && r.rc != ZNONODE) {
          c->out.status = ClaimResult::Status::kFailed;
          c->out.error = error(r.rc, "reading the job's last period");
          c->done(c->out);
          return;
        }
        const bool exists = r.rc == ZOK;
        std::int64_t last = -1;
        if (exists) std::from_chars(r.value.data(), r.value.data() + r.value.size(), last);
        if (exists && last >= c->period) {
          c->out.last = last;
          finish_with(ClaimResult::Status::kAlreadyRun);
          return;
        }
        Session* s = live(serial);
        if (s == nullptr) {
          finish_with(ClaimResult::Status::kNotLeader);
          return;
        }
        const int version = exists ? r.stat.version : -1;
        const std::string value = std::to_string(c->period);
        ACL_vector* acl = target_.digest() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
        // One step: our lock's node is there, and the period node is as read.
        send(
            *s,
            [this, c, finish_with](const Result& r) {
              if (r.rc == ZOK) {
                c->out.last = c->period;
                finish_with(ClaimResult::Status::kClaimed);
                return;
              }
              if (r.op_errors.size() == 2 && r.op_errors[0] == ZNONODE) {
                finish_with(ClaimResult::Status::kNotLeader);
                return;
              }
              if (r.op_errors.size() == 2 && (r.op_errors[1] == ZBADVERSION || r.op_errors[1] == ZNODEEXISTS) &&
                  ++c->attempt < kClaimAttempts) {
                claim_step(c);  // another claim came first: read again
                return;
              }
              c->out.status = ClaimResult::Status::kFailed;
              c->out.error = error(r.rc, "claiming the period");
              c->done(c->out);
            },
            [=](zhandle_t* zh, void* ctx) {
              auto* x = static_cast<Ctx*>(ctx);
              x->results.resize(2);
              x->created.resize(period_path.size() + 64);
              zoo_op_t ops[2];
              zoo_check_op_init(&ops[0], lock_path.c_str(), -1);
              if (exists)
                zoo_set_op_init(&ops[1], period_path.c_str(), value.data(), static_cast<int>(value.size()), version,
                                nullptr);
              else
                zoo_create_op_init(&ops[1], period_path.c_str(), value.data(), static_cast<int>(value.size()), acl,
                                   ZOO_PERSISTENT, x->created.data(), static_cast<int>(x->created.size()));
              return zoo_amulti(zh, 2, ops, x->results.data(), on_multi, ctx);
            });
      },
      [=](zhandle_t* zh, void* ctx) { return zoo_aget(zh, period_path.c_str(), 0, on_data, ctx); });
}

// ---- operators

void ZkStore::inspect(std::string_view name, InspectDone done) {
  Session* s = any_session();
  const std::string dir = dir_of(name);
  const std::uint64_t serial = s->serial;
  send_read(
      *s,
      [this, dir, serial, done = std::move(done)](const Result& r) {
        LockInfo info;
        if (r.rc == ZNONODE) {
          done(info, nullptr);
          return;
        }
        if (r.rc != ZOK) {
          auto e = error(r.rc, "listing the lock's nodes");
          done(info, &e);
          return;
        }
        read_holders(serial, dir, holding(in_order(r.children)), done);
      },
      [=](zhandle_t* zh, void* ctx) { return zoo_aget_children(zh, dir.c_str(), 0, on_strings, ctx); });
}

void ZkStore::read_holders(std::uint64_t serial, const std::string& dir, std::vector<std::string> nodes,
                           InspectDone done) {
  Session* s = live(serial);
  if (nodes.empty() || s == nullptr) {
    done(LockInfo{}, nullptr);
    return;
  }
  struct Reads {
    std::vector<std::optional<HolderInfo>> holders;
    std::vector<long long> ttls;
    std::size_t left = 0;
    LockInfo info;
    int rc = ZOK;
    InspectDone done;
  };
  auto reads = std::make_shared<Reads>();
  reads->holders.resize(nodes.size());
  reads->ttls.resize(nodes.size());
  reads->left = nodes.size();
  reads->info.kind = kind_of(nodes.front());
  reads->done = std::move(done);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::string path = dir + "/" + nodes[i];
    send_read(
        *s,
        [this, reads, i](const Result& r) {
          if (r.rc == ZOK) {
            HolderInfo h;
            auto [token, ttl_ms] = parse_data(r.value, &h.owner_name);
            h.token = std::move(token);
            // ctime: the ensemble's clock when the node was made (the grant, or the
            // place a fair holder waited in); its age on this host's clock.
            h.since = std::chrono::system_clock::time_point(milliseconds(r.stat.ctime));
            h.held_for = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(
                                                       std::chrono::system_clock::now() - h.since));
            reads->holders[i] = std::move(h);
            reads->ttls[i] = ttl_ms;
            if (i == 0) reads->info.fencing_token = static_cast<std::uint64_t>(r.stat.czxid);
          } else if (r.rc != ZNONODE && reads->rc == ZOK) {
            reads->rc = r.rc;
          }
          if (--reads->left != 0) return;
          if (reads->rc != ZOK) {
            auto e = error(reads->rc, "reading the holders' nodes");
            reads->done(LockInfo{}, &e);
            return;
          }
          LockInfo& info = reads->info;
          for (std::size_t k = 0; k < reads->holders.size(); ++k) {
            if (!reads->holders[k]) continue;
            info.held = true;
            info.ttl = std::max(info.ttl, milliseconds(reads->ttls[k]));
            info.holders.push_back(std::move(*reads->holders[k]));
          }
          if (!info.held) info = LockInfo{};
          if (info.held && info.kind.single_holder()) info.owner = info.holders.front().token;
          reads->done(info, nullptr);
        },
        [=](zhandle_t* zh, void* ctx) { return zoo_aget(zh, path.c_str(), 0, on_data, ctx); });
  }
}

struct ZkStore::Listing {
  std::vector<std::string> names;  // under the prefix, in order
  std::size_t next = 0;            // the first not inspected yet
  std::size_t limit = 0;
  std::vector<LockInfo> found;
  ListDone done;
};

void ZkStore::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  Session* s = any_session();
  const std::string escaped = escape(encode(prefix));
  auto listing = std::make_shared<Listing>();
  listing->limit = limit;
  listing->done = std::move(done);
  send_read(
      *s,
      [this, listing, escaped](const Result& r) {
        if (r.rc == ZNONODE) return listing->done({}, nullptr);
        if (r.rc != ZOK) {
          auto e = error(r.rc, "listing the locks' directories");
          return listing->done({}, &e);
        }
        // Escaping is per byte: a name under the prefix escapes to a child under the escaped prefix.
        for (const auto& child : r.children) {
          std::string name;
          if (child.compare(0, escaped.size(), escaped) == 0 && unescape(child, name))
            listing->names.push_back(std::move(name));
        }
        std::sort(listing->names.begin(), listing->names.end());
        list_window(listing);
      },
      [=](zhandle_t* zh, void* ctx) { return zoo_aget_children(zh, kRoot, 0, on_strings, ctx); });
}

// A directory stays once made: the names are inspected a window at a time
// (each window's requests at once), until `limit` held ones are found.
void ZkStore::list_window(std::shared_ptr<Listing> listing) {
  constexpr std::size_t kWindow = 64;
  const std::size_t from = listing->next;
  const std::size_t to = std::min(listing->names.size(), from + kWindow);
  if (from == to || listing->found.size() >= listing->limit) {
    if (listing->found.size() > listing->limit) listing->found.resize(listing->limit);
    return listing->done(std::move(listing->found), nullptr);
  }
  listing->next = to;
  struct Window {
    std::vector<LockInfo> infos;
    std::size_t left = 0;
    std::optional<StoreError> error;
  };
  auto w = std::make_shared<Window>();
  w->infos.resize(to - from);
  w->left = to - from;
  for (std::size_t i = from; i < to; ++i)
    inspect(listing->names[i], [this, listing, w, i, from](const LockInfo& info, const StoreError* e) {
      if (e && !w->error) w->error = *e;
      w->infos[i - from] = info;
      if (--w->left != 0) return;
      if (w->error) return listing->done({}, &*w->error);
      const std::size_t prefix = traits().keys.prefix.size();
      for (std::size_t k = 0; k < w->infos.size(); ++k) {
        if (!w->infos[k].held) continue;
        w->infos[k].key = listing->names[from + k].substr(prefix);
        listing->found.push_back(std::move(w->infos[k]));
      }
      list_window(listing);
    });
}

void ZkStore::force_release(std::string_view name, ForceDone done) {
  Session* s = any_session();
  const std::string dir = dir_of(name);
  const std::uint64_t serial = s->serial;
  send_read(
      *s,
      [this, dir, serial, done = std::move(done)](const Result& r) {
        if (r.rc == ZNONODE) {
          done(false, nullptr);
          return;
        }
        auto nodes = in_order(r.children);
        Session* s = live(serial);
        if (r.rc != ZOK || s == nullptr) {
          auto e = error(r.rc != ZOK ? r.rc : ZSESSIONEXPIRED, "listing the lock's nodes");
          done(false, &e);
          return;
        }
        if (nodes.empty()) {
          done(false, nullptr);
          return;
        }
        delete_paths(*s, {dir + "/" + nodes.front()}, [this, done](int rc) {
          if (rc == ZOK) {
            done(true, nullptr);
          } else {
            auto e = error(rc, "deleting the holder's node");
            done(false, &e);
          }
        });
      },
      [=](zhandle_t* zh, void* ctx) { return zoo_aget_children(zh, dir.c_str(), 0, on_strings, ctx); });
}

// ---- release notices

void ZkStore::subscribe(std::string_view name) {
  if (closed_) return;
  subscribed_.emplace(name);
  // Every busy answer comes after the holder's node is watched: confirmed
  // at once (on the next turn, never inside the call).
  sink_->post([n = std::string(name)](ZkStore& st) {
    if (st.subscribed_.count(n) != 0 && st.events_.subscribed) st.events_.subscribed(n);
  });
}

void ZkStore::unsubscribe(std::string_view name) {
  if (auto it = subscribed_.find(name); it != subscribed_.end()) subscribed_.erase(it);
}

// ---- close

void ZkStore::close() {
  if (closed_) return;
  closed_ = true;
  // Every request still waiting is answered (unavailable), once.
  Result closing;
  closing.rc = ZCLOSING;
  while (!pending_.empty()) {
    auto id = pending_.begin()->first;
    complete(id, closing);
  }
  // Releases waiting out their sessions' expiry are answered now.
  auto deferred = std::move(deferred_);
  deferred_.clear();
  for (auto& [when, f] : deferred) f();
  {
    std::lock_guard lk(sink_->mu);
    sink_->store = nullptr;
  }
  for (auto& [ms, s] : sessions_) {
    close_later(s->zh, s->watch_ctx);
    s->zh = nullptr;
    s->watch_ctx = nullptr;
  }
  sessions_.clear();
  held_.clear();
  marks_.clear();
  if (started_) {
    uv_timer_stop(&sweep_);
    uv_close(reinterpret_cast<uv_handle_t*>(&sweep_), nullptr);
    uv_timer_stop(&cleanup_);
    uv_close(reinterpret_cast<uv_handle_t*>(&cleanup_), nullptr);
    started_ = false;
  }
}

}  // namespace lockwatch::detail
