// lib/store/zookeeper/zk_client.hpp: the ZooKeeper store's glue to the
// asynchronous C client (libzookeeper_mt), below ZkSessions: the answer
// copied off the client's thread (ZkResult), the context each request
// and each session's watcher hand the client, the completions that post
// answers to the loop (ZkSink), and the thread that closes handles
// (ZkCloser).
//
// Threading: the completions and the watcher run on the client's threads
// and touch nothing but the sink; everything they carry is handled on the
// loop. Costs: one allocation per request (its context) and one per answer
// posted.
#pragma once

#include <zookeeper/zookeeper.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lockwatch::detail {

class Loop;
class ZkSessions;
struct ZkSession;
struct ZkCtx;

// A ZooKeeper answer, copied off the client's thread.
struct ZkResult {
  int rc = ZOK;
  bool has_stat = false;
  Stat stat{};
  std::string value{};                  // a node's data, or the path created
  std::vector<std::string> children{};  // get_children
  std::vector<int> op_errors{};         // multi: each operation's outcome
  ZkSession* session = nullptr;         // set on the loop: the session that sent it, while it lives
};

// What runs a request's answer (once, on the loop), and what makes its call
// to the client with the context given (returning the client's rc).
using ZkReply = std::function<void(const ZkResult&)>;
using ZkIssue = std::function<int(zhandle_t*, void*)>;

// Shared by the sessions and the client's threads. `sessions` is cleared
// (on the loop) when the store closes: answers after that are dropped.
struct ZkSink : std::enable_shared_from_this<ZkSink> {
  std::mutex mu;
  ZkSessions* sessions = nullptr;
  Loop* loop = nullptr;
  // The contexts the client holds, by the session that sent them: a
  // handle closed while disconnected does not always call back what it
  // had queued, so what is left once zookeeper_close() returns is freed
  // here (no thread of that handle runs by then).
  std::mutex ctx_mu;
  std::unordered_map<ZkCtx*, std::uint64_t> in_flight;

  // Runs `f` on the loop, unless the store closed by then.
  void post(std::function<void(ZkSessions&)> f);
  // A request's context, in flight until release_ctx() (or its session's
  // handle closed: forget_session()).
  ZkCtx* new_ctx(std::uint64_t id, std::uint64_t session);
  void release_ctx(ZkCtx* ctx);
  // The sessions, or null once the store closed (any thread).
  ZkSessions* target();
  void forget_session(std::uint64_t serial);
};

// A request's context, given to the client and back to a completion.
struct ZkCtx {
  std::shared_ptr<ZkSink> sink;
  std::uint64_t id = 0;
  std::uint64_t session = 0;  // ZkSession::serial
  std::vector<zoo_op_result_t> results;  // multi
  std::string created;                   // multi: where a create op writes its path
};

// A session's watcher context.
struct ZkWatchCtx {
  std::shared_ptr<ZkSink> sink;
  std::uint64_t serial = 0;
};

// zookeeper_close() blocks (it says goodbye to the ensemble and joins the
// client's threads): handles are closed on a thread of their own.
class ZkCloser {
 public:
  // Its destructor closes what is still queued, then joins.
  explicit ZkCloser(std::shared_ptr<ZkSink> sink);
  ZkCloser(const ZkCloser&) = delete;
  ZkCloser& operator=(const ZkCloser&) = delete;
  // Closes `zh` (if any) and frees its watcher's context (a ZkWatchCtx).
  void close_later(zhandle_t* zh, void* watch_ctx);

 private:
  void run(std::stop_token stop);

  std::shared_ptr<ZkSink> sink_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::vector<std::pair<zhandle_t*, void*>> to_close_;
  std::jthread thread_;  // last: started once the rest is there, stopped and joined first
};

namespace zk {

// Not ZooKeeper's: zookeeper_init() made no handle (no member's name
// resolved, or the client could not start its threads).
inline constexpr int kNoHandle = -1000;

// Whether `rc` says the ensemble could not be reached (rather than refused).
bool unreachable(int rc);
// An answer's failure where a node found gone counts as done (null: ZOK or ZNONODE).
inline const int* failure_unless_gone(const ZkResult& r) { return r.rc == ZOK || r.rc == ZNONODE ? nullptr : &r.rc; }

// The completions given to the client: each posts a ZkResult to the loop.
void on_void(int rc, const void* data);
void on_data(int rc, const char* value, int len, const Stat* stat, const void* data);
void on_strings(int rc, const String_vector* strings, const void* data);
void on_created(int rc, const char* path, const Stat* stat, const void* data);
void on_created_path(int rc, const char* path, const void* data);
void on_stat_set(int rc, const Stat* stat, const void* data);
void on_multi(int rc, const void* data);
// Every session's watcher: state changes and watches, posted to the loop.
void on_global_watch(zhandle_t*, int type, int state, const char* path, void* context);
// The client's log, silenced.
void drop_log(const char*);

}  // namespace zk

}  // namespace lockwatch::detail
