/// @file
/// lockwatch/thread_pool.hpp: a fixed-size pool of worker threads that runs
/// posted tasks in FIFO order.
///
/// lockwatch runs user work here so that the I/O loop never does: the loop
/// posts the decorated call, a worker runs it, and the result travels back
/// through a future. The pool is also usable on its own.
///
/// Threading: post(), submit(), size() and on_pool_thread() may be called from
/// any thread, pool threads included. shutdown() may be called from any
/// thread; see its comment for what it does on a pool thread.
///
/// Costs: one mutex-protected deque shared by all workers, so a post is one
/// lock, one push and one condition-variable notify. A task whose callable
/// fits in UniqueFunction's inline buffer (48 bytes, nothrow-movable) needs no
/// allocation beyond the deque's own; larger ones take one heap allocation.
/// submit() adds the shared state of a std::packaged_task. The single queue
/// keeps FIFO order simple; it is not meant for millions of tiny tasks per
/// second across many cores.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

namespace lockwatch {

/// A move-only `void()` callable, like C++23's std::move_only_function<void()>:
/// unlike std::function it accepts callables that capture move-only state
/// (std::unique_ptr, std::packaged_task, std::promise). ThreadPool::post takes
/// one; any such callable converts to it.
///
/// Callables up to kInlineSize bytes whose move constructor is noexcept live
/// inside the object; others are kept on the heap. Moving a UniqueFunction
/// moves the callable (or the pointer to it) and leaves the source empty.
/// Calling an empty UniqueFunction throws std::bad_function_call. Not
/// thread-safe: one owner at a time, like any value.
class UniqueFunction {
 public:
  /// Callables up to this size (and nothrow-movable) are stored inline, without an allocation.
  static constexpr std::size_t kInlineSize = 48;

  UniqueFunction() noexcept = default;
  /// An empty function.
  UniqueFunction(std::nullptr_t) noexcept {}  // NOLINT: mirrors std::function

  template <class F, class D = std::decay_t<F>,
            class = std::enable_if_t<!std::is_same_v<D, UniqueFunction> &&
                                     std::is_invocable_r_v<void, D&> &&
                                     std::is_constructible_v<D, F>>>
  /// Takes `f` (a null function pointer makes an empty function).
  UniqueFunction(F&& f) {  // NOLINT: implicit, so that post([] {...}) reads naturally
    if constexpr (std::is_pointer_v<D>) {
      if (f == nullptr) return;  // a null function pointer makes an empty function
    }
    if constexpr (fits_inline<D>()) {
      ::new (static_cast<void*>(storage_)) D(std::forward<F>(f));
      ops_ = &kInlineOps<D>;
    } else {
      D* heap = new D(std::forward<F>(f));
      ::new (static_cast<void*>(storage_)) D*(heap);
      ops_ = &kHeapOps<D>;
    }
  }

  /// Takes `other`'s callable; `other` is left empty.
  UniqueFunction(UniqueFunction&& other) noexcept { take(other); }

  /// Destroys the callable held, then takes `other`'s.
  UniqueFunction& operator=(UniqueFunction&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }

  /// Destroys the callable held; empty afterwards.
  UniqueFunction& operator=(std::nullptr_t) noexcept {
    reset();
    return *this;
  }

  UniqueFunction(const UniqueFunction&) = delete;
  UniqueFunction& operator=(const UniqueFunction&) = delete;

  ~UniqueFunction() { reset(); }

  /// Runs the callable; whatever it throws propagates.
  void operator()() {
    if (ops_ == nullptr) throw std::bad_function_call();
    ops_->invoke(storage_);
  }

  /// True when a callable is held.
  explicit operator bool() const noexcept { return ops_ != nullptr; }

 private:
  struct Ops {
    void (*invoke)(void* storage);
    /// Moves the callable from `from` into the raw storage `to` and ends the
    /// life of what `from` held.
    void (*relocate)(void* from, void* to) noexcept;
    void (*destroy)(void* storage) noexcept;
  };

  template <class D>
  static constexpr bool fits_inline() {
    return sizeof(D) <= kInlineSize && alignof(D) <= alignof(std::max_align_t) &&
           std::is_nothrow_move_constructible_v<D>;
  }

  template <class D>
  static constexpr Ops kInlineOps{
      [](void* s) { (*std::launder(static_cast<D*>(s)))(); },
      [](void* from, void* to) noexcept {
        D* src = std::launder(static_cast<D*>(from));
        ::new (to) D(std::move(*src));
        src->~D();
      },
      [](void* s) noexcept { std::launder(static_cast<D*>(s))->~D(); },
  };

  template <class D>
  static constexpr Ops kHeapOps{
      [](void* s) { (**std::launder(static_cast<D**>(s)))(); },
      [](void* from, void* to) noexcept {
        ::new (to) D*(*std::launder(static_cast<D**>(from)));
      },
      [](void* s) noexcept { delete *std::launder(static_cast<D**>(s)); },
  };

  void take(UniqueFunction& other) noexcept {
    if (other.ops_ == nullptr) return;
    other.ops_->relocate(other.storage_, storage_);
    ops_ = other.ops_;
    other.ops_ = nullptr;
  }

  void reset() noexcept {
    if (ops_ == nullptr) return;
    const Ops* ops = ops_;
    ops_ = nullptr;
    ops->destroy(storage_);
  }

  alignas(std::max_align_t) unsigned char storage_[kInlineSize];
  const Ops* ops_ = nullptr;
};

/// Fixed-size pool of worker threads running posted tasks in FIFO order: tasks
/// start in the order they were posted (with one thread they also finish in
/// that order). The threads start in the constructor and live until
/// shutdown().
class ThreadPool {
 public:
  /// Starts `threads` workers; 0 means std::thread::hardware_concurrency()
  /// (at least 1). Throws std::system_error if a thread cannot be started.
  /// busy_poll > 0: a worker that runs out of tasks keeps looking for the
  /// next one this long before it sleeps (one such worker at a time), so
  /// that a task posted soon after costs no thread wake-up; 0 never polls.
  /// Negative (kBusyPollAdaptive, options.hpp): adaptive, as
  /// Options::runtime.busy_poll's default: a worker polls only while tasks have
  /// been arriving sooner than waking it costs, and at most that long
  /// (200 us at most), and stops polling when polls catch nothing.
  /// name_pattern names the workers (what ps -L, top -H and gdb show): its
  /// first "{}" is replaced by the worker's index from 0 ("lw-pool-{}":
  /// lw-pool-0, lw-pool-1, ...); without one every worker has the same
  /// name. Linux keeps 15 bytes of a name and cuts the rest.
  explicit ThreadPool(std::size_t threads, std::chrono::microseconds busy_poll = {},
                      std::string name_pattern = "lw-pool-{}");

  /// Calls shutdown(): queued tasks still run, then the workers are joined.
  /// If the pool is destroyed from one of its own tasks, that worker cannot
  /// join itself: it is detached and finishes its current task on state it
  /// shares with the pool, so nothing dangles. Never throws.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Queues `task` to run on a worker. Thread-safe, never blocks on running
  /// tasks. Throws lockwatch::RuntimeStopped once shutdown() has begun, and
  /// lockwatch::InvalidArgument for an empty task.
  ///
  /// An exception thrown by a posted task is caught and dropped so that it
  /// cannot take the worker (and the process) down; use submit() when the
  /// caller needs to see it.
  void post(UniqueFunction task);

  /// Queues every task of `tasks` (moved from) in their order, as post()
  /// does, under one lock: the workers they need are woken once all are
  /// queued. All or none: throws like post() before queuing any.
  void post_all(std::span<UniqueFunction> tasks);

  /// Queues `f` and returns a future for its result; an exception thrown by
  /// `f` is stored in the future. Throws like post() (synchronously, with no
  /// future) when the pool is shut down.
  template <class F>
  auto submit(F&& f) -> std::future<std::invoke_result_t<std::decay_t<F>>> {
    using R = std::invoke_result_t<std::decay_t<F>>;
    std::packaged_task<R()> task(std::forward<F>(f));
    std::future<R> result = task.get_future();
    post([task = std::move(task)]() mutable { task(); });
    return result;
  }

  /// Refuses new work from now on, lets the workers run everything already
  /// queued, and joins them. Idempotent and thread-safe; concurrent callers
  /// all return after the join.
  ///
  /// Called from one of this pool's own tasks, it cannot wait for the queue
  /// (the caller is part of the draining): it only refuses new work and
  /// returns at once; the workers drain the queue and exit on their own, and
  /// the destructor (or a later shutdown() from another thread) joins them.
  void shutdown() noexcept;

  /// The number of worker threads, fixed at construction.
  std::size_t size() const noexcept;

  /// True when the calling thread is a worker of any lockwatch ThreadPool.
  static bool on_pool_thread() noexcept;

 private:
  struct State;
  static void run_worker(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  std::size_t size_;
};

}  // namespace lockwatch
