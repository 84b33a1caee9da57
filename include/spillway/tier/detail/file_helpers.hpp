// SPDX-License-Identifier: Apache-2.0
// spillway/tier/detail/file_helpers.hpp: file_tier's helpers for its own files: temporary
// file names unique across the hosts sharing a directory, the test that says whether a
// process that left such a file is gone, and the descriptor owner (spillway::unique_fd).
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <signal.h>
#include <unistd.h>

#include "spillway/io/durable_file.hpp"

namespace spillway::detail {

/// Closes a descriptor at scope exit unless released (the public spillway::unique_fd).
using unique_fd = spillway::unique_fd;

/// Numbers the temporary and probe files of every file tier in this process.
inline std::atomic<std::uint64_t>& file_tier_counter() noexcept {
    static std::atomic<std::uint64_t> counter{0};
    return counter;
}

/// This host's name (gethostname), or "unknown-host"; read once.
inline const std::string& host_name() {
    static const std::string name = [] {
        char buf[256] = {};
        if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0')
            return std::string("unknown-host");
        std::string n(buf);
        for (char& c : n)
            if (c == '/') c = '_';
        return n;
    }();
    return name;
}

/// "<prefix><kind><pid>.<n>.<host>": unique on a directory shared by several hosts, whose
/// processes may have the same id.
inline std::string file_tier_temp_name(std::string_view prefix, std::string_view kind) {
    return std::string(prefix) + std::string(kind) + std::to_string(::getpid()) + "." +
           std::to_string(file_tier_counter().fetch_add(1, std::memory_order_relaxed)) + "." +
           host_name();
}

/// True when `name` is "<prefix>tmp.<pid>.<n>.<host>" or "<prefix>probe.<pid>.<n>.<host>"
/// of a process of this host that no longer exists (a crash mid-write, or spares never
/// cleaned up). Another host's names are never orphaned here: its process ids mean nothing
/// on this host, and its tier may be running (a directory on a shared file system). Names
/// without a host part are judged by the process id alone.
inline bool file_tier_orphan(std::string_view name, std::string_view prefix) {
    if (name.substr(0, prefix.size()) != prefix) return false;
    for (std::string_view kind : {std::string_view("tmp."), std::string_view("probe.")}) {
        std::string_view rest = name.substr(prefix.size());
        if (rest.substr(0, kind.size()) != kind) continue;
        rest.remove_prefix(kind.size());
        const auto pid_end = rest.find('.');
        long pid = std::strtol(std::string(rest.substr(0, pid_end)).c_str(), nullptr, 10);
        const auto counter_end =
            pid_end == std::string_view::npos ? pid_end : rest.find('.', pid_end + 1);
        const bool this_host =
            counter_end == std::string_view::npos || rest.substr(counter_end + 1) == host_name();
        if (this_host && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
            return true;
    }
    return false;
}

}  // namespace spillway::detail
