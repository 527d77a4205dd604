// lib/store/zookeeper/zk_client.hpp: the ZooKeeper store's glue to the
// asynchronous C client (libzookeeper_mt), below ZkSessions.
//
// Threading: the completions and the watcher run on the client's threads
// and touch nothing but the sink; everything they carry is handled on the
// loop. Costs: one allocation per request (its context) and one per answer
// posted.
#pragma once

#include <zookeeper/zookeeper.h>

#include <atomic>
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

// An answer, copied off the client's thread.
struct ZkResult {
  int rc = ZOK;
  Stat stat{};                          // the node's, when the call answers one and succeeded
  std::string value{};                  // a node's data, or the path created
  std::vector<std::string> children{};  // get_children
  std::vector<int> op_errors{};         // multi: each operation's outcome
  ZkSession* session = nullptr;         // set on the loop: the session that sent it, while it lives

  // rc, or ZSESSIONEXPIRED for a success whose session ended meanwhile.
  int failure() const { return rc != ZOK || session != nullptr ? rc : ZSESSIONEXPIRED; }
};

// A request's answer (run once, on the loop), and its call to the client
// with the context given (returning the client's rc).
using ZkReply = std::function<void(const ZkResult&)>;
using ZkIssue = std::function<int(zhandle_t*, void*)>;

// Shared by the sessions and the client's threads. `sessions` is cleared
// (on the loop) when the store closes: answers after that are dropped.
// Read on any thread.
struct ZkSink : std::enable_shared_from_this<ZkSink> {
  ZkSink(ZkSessions* s, Loop& l) : sessions(s), loop(l) {}
  std::atomic<ZkSessions*> sessions;
  Loop& loop;
  // The contexts the client holds, by the session that sent them: a
  // handle closed while disconnected does not always call back what it
  // had queued, so what is left once zookeeper_close() returns is freed
  // here (no thread of that handle runs by then).
  std::mutex ctx_mu;
  std::unordered_map<ZkCtx*, std::uint64_t> in_flight;

  // Unless the store closed by then.
  void post(std::function<void(ZkSessions&)> f);
  // A request's context, in flight until release_ctx() (or its session's
  // handle closed: forget_session()).
  ZkCtx* new_ctx(std::uint64_t id, std::uint64_t session);
  void release_ctx(ZkCtx* ctx);
  void forget_session(std::uint64_t serial);
};

// A request's context, given to the client and back to a completion; also
// a session's watcher context (id 0, never in flight), freed with its handle.
struct ZkCtx {
  std::shared_ptr<ZkSink> sink;
  std::uint64_t id = 0;
  std::uint64_t session = 0;  // ZkSession::serial
  std::vector<zoo_op_result_t> results;  // multi
  std::string created;                   // multi: where a create op writes its path
};

// zookeeper_close() blocks (it says goodbye to the ensemble and joins the
// client's threads): handles are closed on a thread of their own.
class ZkCloser {
 public:
  // The destructor closes what is still queued, then joins. Not copied
  // (its mutex and thread see to that).
  explicit ZkCloser(std::shared_ptr<ZkSink> sink);
  // A null `zh` has nothing to close: its context is freed here.
  void close_later(zhandle_t* zh, std::unique_ptr<ZkCtx> watch_ctx);

 private:
  void run(std::stop_token stop);

  std::shared_ptr<ZkSink> sink_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::vector<std::pair<zhandle_t*, std::unique_ptr<ZkCtx>>> to_close_;
  std::jthread thread_;  // last: started once the rest is there, stopped and joined first
};

namespace zk {

// Not ZooKeeper's: zookeeper_init() made no handle (no member's name
// resolved, or the client could not start its threads).
inline constexpr int kNoHandle = -1000;

// A request's argument as the client takes it: a std::string as its
// c_str(), anything else as it is.
template <class T>
T c_arg(T arg) {
  return arg;
}
inline const char* c_arg(const std::string& arg) { return arg.c_str(); }
// Whether `rc` says the ensemble could not be reached (rather than refused).
bool unreachable(int rc);
// An answer's failure where a node found gone counts as done (null: ZOK or ZNONODE).
inline const int* failure_unless_gone(const ZkResult& r) { return r.rc == ZOK || r.rc == ZNONODE ? nullptr : &r.rc; }

// The completions given to the client, one per shape of answer: answer()
// copies what a success carries into a ZkResult (fill()) and posts it to
// the loop (deliver(), which adds a multi's outcome per operation).
void deliver(const void* data, ZkResult r);
void fill(ZkResult& r, const Stat* stat);
void fill(ZkResult& r, const char* path, const Stat* stat = nullptr);
void fill(ZkResult& r, const char* value, int len, const Stat* stat);
void fill(ZkResult& r, const String_vector* strings);
template <class... Args>
void answer(int rc, Args... args, const void* data) {
  ZkResult r{rc};
  if constexpr (sizeof...(Args) > 0)
    if (rc == ZOK) fill(r, args...);
  deliver(data, std::move(r));
}
inline constexpr void_completion_t on_void = answer<>;  // a deletion's, a multi's
inline constexpr stat_completion_t on_stat_set = answer<const Stat*>;
inline constexpr data_completion_t on_data = answer<const char*, int, const Stat*>;
inline constexpr strings_completion_t on_strings = answer<const String_vector*>;
inline constexpr string_completion_t on_created_path = answer<const char*>;
inline constexpr string_stat_completion_t on_created = answer<const char*, const Stat*>;
void on_global_watch(zhandle_t*, int type, int state, const char* path, void* context);

}  // namespace zk

}  // namespace lockwatch::detail
