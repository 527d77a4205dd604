// lib/store/etcd/etcd_client.hpp: etcd's v3 API over gRPC for the etcd
// store, driven so that nothing blocks the loop: one channel per member,
// on gRPC's callback API; gRPC's threads hand each completion to the loop
// (Loop::post), so every callback runs on the loop thread, exactly once,
// never inside the call that started it. Unary calls have a deadline of
// the command timeout; keep_alive() is one stream per batch of leases,
// bounded by it as a whole; watch() one stream per key, without a
// deadline, until cancelled. Members, TLS, authentication and errors:
// docs/etcd.md ("How a lock is kept", "TLS", "The URL", "Errors").
//
// Threading: construction on any thread; every other member on the loop
// thread, but the destructor, which must run off the loop thread after
// close() (it waits until gRPC ran every call's last callback).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "rpc.grpc.pb.h"
#include "store/etcd/etcd_target.hpp"
#include "store/store_error.hpp"
#include "store/store_settings.hpp"

namespace lockwatch::detail {

class Loop;

class EtcdClient {
 public:
  template <class Response>
  using Done = std::function<void(const Response&, const StoreError*)>;
  // A lease's answer to a keep-alive: its remaining ttl in seconds (<= 0:
  // gone), or -1 when the batch had no answer for it.
  using KeepAliveDone = std::function<void(const std::vector<std::int64_t>& ttls, const StoreError*)>;

  class Watch;
  // What a watch reports, on the loop thread, naming itself: etcd made it,
  // the key was deleted, or (with the error) its stream broke or the
  // server cancelled it (never after cancel()).
  enum class WatchEvent : std::uint8_t { kCreated, kDeleted, kEnded };
  using WatchHook = std::function<void(const Watch* watch, WatchEvent event, const StoreError* ended)>;

  // Not copied (its mutex sees to that).
  EtcdClient(Loop& loop, EtcdTarget target, const StoreSettings& settings);
  ~EtcdClient();

  const std::string& name() const noexcept { return name_; }
  // Told, on the loop thread, when a member stops answering (a call to it
  // got no answer) and when it answers again.
  using StateHook = std::function<void(const std::string& endpoint, bool up, const std::string& why)>;
  void set_state_hook(StateHook hook) { state_hook_ = std::move(hook); }

  // A Range of the keys from `key` to `end` (at most `limit`; 0: every one).
  void range(std::string key, std::string end, std::int64_t limit, Done<etcdserverpb::RangeResponse> done);
  // A Range of the one key `key`.
  void get(std::string key, Done<etcdserverpb::RangeResponse> done) { range(std::move(key), {}, 0, std::move(done)); }
  void txn(etcdserverpb::TxnRequest request, Done<etcdserverpb::TxnResponse> done);
  // A lease of `ttl` seconds; lease `id` revoked, or its ttl asked.
  void lease_grant(std::int64_t ttl, Done<etcdserverpb::LeaseGrantResponse> done);
  void lease_revoke(std::int64_t id, Done<etcdserverpb::LeaseRevokeResponse> done);
  void lease_time_to_live(std::int64_t id, Done<etcdserverpb::LeaseTimeToLiveResponse> done);
  // Keeps each lease alive once, on one stream; `done` gets a ttl per id,
  // in order.
  void keep_alive(std::vector<std::int64_t> ids, KeepAliveDone done);
  // Watches `key` for its deletion until the handle is cancelled.
  std::shared_ptr<Watch> watch(std::string key, WatchHook hook);
  void cancel(const std::shared_ptr<Watch>& watch);

  // Fails what is pending (each callback runs once, now) and cancels every
  // call and stream; later calls fail on the next loop turn.
  void close();

 private:
  struct Call;
  template <class Request, class Response>
  struct Unary;
  struct KeepAlive;
  struct Member;
  friend class Watch;

  // Runs `start` now (authenticated) or once the token is there.
  void with_token(std::function<void(const StoreError*)> start);
  void authenticate();
  StoreError error_of(const grpc::Status& status, std::size_t member, bool authenticating = false) const;
  std::string endpoint(std::size_t member) const;
  // A call to `member` had no answer: later calls go to the next member.
  void member_failed(std::size_t member);
  // Reported to the state hook when whether `member` answers changes.
  void member_answered(std::size_t member, const grpc::Status& status);
  // `rpc` starts the call on a member (its stub's callback method).
  template <class Request, class Response, class Rpc>
  void unary(Request request, Done<Response> done, Rpc rpc, int attempt = 1,
             std::chrono::steady_clock::time_point deadline = {}, bool reauthenticated = false);
  // A call to the current member, tracked until its last callback; its
  // context has the deadline `timeout` from now (0: none) and the token.
  void track(std::shared_ptr<Call> call, std::chrono::milliseconds timeout);

  Loop& loop_;
  const EtcdTarget target_;
  const std::string name_;
  const std::chrono::milliseconds connect_timeout_;
  const std::chrono::milliseconds command_timeout_;
  std::vector<std::unique_ptr<Member>> members_;
  std::size_t current_ = 0;  // loop thread
  StateHook state_hook_;
  // Calls started whose last callback gRPC has not run yet: the
  // destructor waits for them.
  std::mutex in_flight_mu_;
  std::condition_variable in_flight_cv_;
  int in_flight_ = 0;  // guarded by in_flight_mu_
  // Loop thread: calls not yet answered, failed by close().
  std::set<std::shared_ptr<Call>> live_;
  // Authentication (loop thread).
  std::string token_;
  bool authenticating_ = false;
  std::vector<std::function<void(const StoreError*)>> waiting_for_token_;
  bool closed_ = false;
};

}  // namespace lockwatch::detail
