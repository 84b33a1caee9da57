// SPDX-License-Identifier: Apache-2.0
// spillway/detail/thread_name.hpp: names the library's threads, so that top -H, perf, gdb
// and /proc/<pid>/task/*/comm show which thread is which ("spw-uring", "spw-vtier", ...).
//
// Guarantees:
// - name_thread(t, name) names a started std::thread from its starter (the name is set when
//   it returns); name_this_thread(name) names the calling thread. On Linux through
//   pthread_setname_np; names longer than the kernel's 15 characters are cut to 15.
//   Elsewhere they do nothing.
// - It never throws and never fails the caller: a name is a diagnostic, not a requirement.
#pragma once

#include <cstddef>
#include <cstring>
#include <string_view>
#include <thread>

#if defined(__linux__)
#include <pthread.h>
#endif

namespace spillway::detail {

/// The longest thread name the kernel keeps (16 bytes with the terminating NUL).
inline constexpr std::size_t max_thread_name = 15;

#if defined(__linux__)
/// Names the thread `handle` `name` (cut to max_thread_name characters); best effort.
inline void name_native_thread(pthread_t handle, std::string_view name) noexcept {
    char buf[max_thread_name + 1] = {};
    std::memcpy(buf, name.data(), name.size() < max_thread_name ? name.size() : max_thread_name);
    (void)pthread_setname_np(handle, buf);
}
#endif

/// Names the calling thread `name` (cut to max_thread_name characters); best effort.
inline void name_this_thread(std::string_view name) noexcept {
#if defined(__linux__)
    name_native_thread(pthread_self(), name);
#else
    (void)name;
#endif
}

/// Names the started thread `t` `name` from the thread that started it, so that the name
/// is in place when the starter returns (cut to max_thread_name characters); best effort.
/// @return t, for chaining after emplace_back
inline std::thread& name_thread(std::thread& t, std::string_view name) noexcept {
#if defined(__linux__)
    if (t.joinable()) name_native_thread(t.native_handle(), name);
#else
    (void)name;
#endif
    return t;
}

}  // namespace spillway::detail
