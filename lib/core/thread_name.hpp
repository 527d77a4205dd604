// lib/core/thread_name.hpp: names a thread, as ps -L, top -H,
// gdb, perf and /proc/<pid>/task/<tid>/comm show it. lockwatch's threads
// are lw-loop (the I/O loop), lw-pool-N (the runtime's pool), lw-notify
// (stop callbacks and completion handlers) and lw-events (observers and the
// log).
#pragma once

#include <pthread.h>

#include <algorithm>
#include <string_view>
#include <thread>

namespace lockwatch::detail {

// Names `thread`, right after it was started, so that the name is there
// before its creator returns (a thread naming itself might not have run
// yet). Linux keeps at most 15 bytes of a name: the rest is cut. A name is
// only for people reading a process list, so one that cannot be set is no
// error.
inline void name_thread(std::thread& thread, std::string_view name) noexcept {
  char buf[16] = {};
  name.copy(buf, std::min<std::size_t>(name.size(), sizeof buf - 1));
  (void)::pthread_setname_np(thread.native_handle(), buf);
}

}  // namespace lockwatch::detail
