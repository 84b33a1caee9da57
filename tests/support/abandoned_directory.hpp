// SPDX-License-Identifier: Apache-2.0
// tests/support/abandoned_directory.hpp: an owned_directory whose owner died, made by a
// forked child, as a process killed part-way through a save or a run leaves one.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <spillway/lock/owned_directory.hpp>

namespace spillway::test {

// A child creates an owned directory under `parent`, writes some bytes into it, reports its
// path through a pipe and dies as `how` says (0: _exit without destructors, else that signal).
inline std::filesystem::path abandoned_by_child(const std::filesystem::path& parent, const std::string& prefix, int how) {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(p[0]);
        try {
            auto d = owned_directory::create(parent, prefix);
            std::ofstream(d.path() / "state.bin") << "half-written checkpoint";
            std::string s = d.path().string();
            if (::write(p[1], s.data(), s.size()) != static_cast<ssize_t>(s.size())) ::_exit(3);
            ::close(p[1]);
            if (how != 0) ::kill(::getpid(), how);
            ::_exit(0);  // no destructor runs
        } catch (...) {
            ::_exit(2);
        }
    }
    ::close(p[1]);
    std::string path;
    char buf[512];
    for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) path.append(buf, static_cast<std::size_t>(n));
    ::close(p[0]);
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    if (how == 0) REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    else REQUIRE((WIFSIGNALED(st) && WTERMSIG(st) == how));
    return path;
}


}  // namespace spillway::test
