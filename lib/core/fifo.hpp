// lib/core/fifo.hpp: a first-in first-out queue on one ring buffer.
//
// std::deque allocates a node each time its end crosses one, and with
// elements of a few hundred bytes a node holds one or two: a queue that a
// request enters and its reply leaves costs an allocation per request.
// Fifo reuses its slots instead: a queue that stays about the same length
// allocates nothing in steady state. It grows by doubling and never
// shrinks. A popped slot is reset to T{} at once, so what it held (a
// callback, the buffers it kept alive) goes with the pop, as with a deque.
//
// T must be default-constructible and move-assignable. Not thread-safe.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace lockwatch::detail {

template <class T>
class Fifo {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  T& front() noexcept { return slots_[head_]; }
  const T& front() const noexcept { return slots_[head_]; }

  void push_back(T value) {
    if (size_ == slots_.size()) grow();
    slots_[(head_ + size_) & (slots_.size() - 1)] = std::move(value);
    ++size_;
  }
  // The front element, moved out; its slot is reset.
  T take_front() {
    T value = std::move(slots_[head_]);
    slots_[head_] = T{};
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
    return value;
  }

 private:
  void grow() {
    std::vector<T> bigger(slots_.empty() ? 8 : 2 * slots_.size());
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = std::move(slots_[(head_ + i) & (slots_.size() - 1)]);
    slots_ = std::move(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;  // a power of two in size, or empty
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace lockwatch::detail
