// lib/runtime/decisions.hpp: what the wait queue and the watchdog decide,
// for the lock table to act on.
//
// The parts never call up into the table: an attempt's answer, a wait that
// runs out, a lease whose release is confirmed are written here, and the
// table acts on them in order, after its own call into a part returns, or
// at the end of the loop's turn for what a store's answer or a timer
// decided (Loop::at_turn_end: before the loop next polls).
//
// Threading: the loop thread's, as the parts'.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/loop.hpp"

namespace lockwatch::detail {

struct Acquisition;
struct LeaseRecord;

class Decisions {
 public:
  using Clock = std::chrono::steady_clock;
  struct Decision {
    enum class Kind : std::uint8_t { kTaken, kFailed, kFinished } kind;
    std::shared_ptr<Acquisition> a;   // taken, failed
    std::shared_ptr<LeaseRecord> l;   // finished
    std::uint64_t fence = 0;          // taken
    Clock::time_point sent{};         // taken: the request that took it
    std::exception_ptr error;         // failed
    bool busy = false;                // failed: busy past its wait
  };

  // The table, once: how it acts on what is written here.
  explicit Decisions(std::function<void()> act) : act_(std::move(act)) {}

  // The lock was taken for `a` by a request sent at `sent`.
  void taken(const std::shared_ptr<Acquisition>& a, std::uint64_t fence, Clock::time_point sent) {
    push(Decision{Decision::Kind::kTaken, a, nullptr, fence, sent, nullptr, false});
  }
  // `a` ends without the lock: busy past its wait (`busy`), an error, or
  // the runtime stopping.
  void failed(const std::shared_ptr<Acquisition>& a, std::exception_ptr error, bool busy) {
    push(Decision{Decision::Kind::kFailed, a, nullptr, 0, {}, std::move(error), busy});
  }
  // The watchdog let go of `l` (released, or surely expired).
  void finished(const std::shared_ptr<LeaseRecord>& l) {
    push(Decision{Decision::Kind::kFinished, nullptr, l, 0, {}, nullptr, false});
  }

  // While one lives (the table's calls into the parts, and its acting),
  // what is written waits for the scope's end instead of the turn's: the
  // table acts on it then (one turn-end task fewer per call).
  class Scope {
   public:
    explicit Scope(Decisions& d) noexcept : d_(d) { ++d_.scopes_; }
    ~Scope() {
      if (--d_.scopes_ == 0 && !d_.queue_.empty()) d_.act_();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Decisions& d_;
  };

  bool empty() const noexcept { return head_ == queue_.size(); }
  Decision take() {
    Decision d = std::move(queue_[head_++]);
    if (head_ == queue_.size()) {
      queue_.clear();  // keeps its capacity: no block per decision
      head_ = 0;
    }
    return d;
  }
  void clear() {
    queue_.clear();
    head_ = 0;
  }

 private:
  void push(Decision d) {
    queue_.push_back(std::move(d));
    if (armed_ || scopes_ != 0) return;
    armed_ = true;
    Loop::at_turn_end([this] {
      armed_ = false;
      act_();
    });
  }

  std::function<void()> act_;
  std::vector<Decision> queue_;  // taken from head_ on
  std::size_t head_ = 0;
  bool armed_ = false;
  int scopes_ = 0;  // Scope
};

}  // namespace lockwatch::detail
