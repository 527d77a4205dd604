// lib/core/page_allocator.hpp: an allocator for the tables that grow with
// the number of leases (the watchdog's registry, a thread's handles).
//
// A block of 1 MiB or more is mapped from the kernel and unmapped when
// freed. Through malloc, a grown table's old blocks would stay in the
// process (glibc raises its mmap threshold to the size of a freed mapped
// block, so the next such blocks come from the heap and are kept there):
// a million leases would keep some 50 MB of tables they outgrew.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <memory>
#include <new>

namespace lockwatch::detail {

template <class T>
struct PageAllocator {
  using value_type = T;
  static constexpr std::size_t kMapFrom = std::size_t{1} << 20;

  PageAllocator() noexcept = default;
  template <class U>
  PageAllocator(const PageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kMapFrom) return std::allocator<T>{}.allocate(n);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kMapFrom) return std::allocator<T>{}.deallocate(p, n);
    ::munmap(p, bytes);
  }
  template <class U>
  bool operator==(const PageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace lockwatch::detail
