// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/tests/cli_support.hpp: what the command-line tests share: the mini_gpt
// binary run in a child (its exit status, stdout and stderr), a tiny model's flags, and the
// check that a refusal is exit status 2 with one line naming what it must.
#pragma once

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace mini_gpt::cli_testing {

struct result {
    int status = -1;  // exit status, or 128 + signal
    std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// In a forked child: becomes mini_gpt with `args` (exit status 127 if that fails).
[[noreturn]] inline void exec_mini_gpt(std::vector<std::string>& args) {
    std::vector<char*> argv;
    std::string exe = MINI_GPT_EXE;
    argv.push_back(exe.data());
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
}

/// Runs mini_gpt with `args`, stdout and stderr to files under `dir`; with a `limit` in seconds
/// it kills the run with SIGKILL then (status 128 + 9): a run that would block for ever fails
/// the test instead of hanging it. `in_child` runs in the child before the exec (to set a
/// resource limit, say).
inline result run_within(const std::filesystem::path& dir, std::vector<std::string> args, int limit,
                         const std::function<void()>& in_child = {}) {
    auto out = dir / "stdout.txt", err = dir / "stderr.txt";
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ::dup2(o, 1);
        ::dup2(e, 2);
        if (in_child) in_child();
        exec_mini_gpt(args);
    }
    int st = 0;
    if (limit <= 0) ::waitpid(pid, &st, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit);
    while (limit > 0 && ::waitpid(pid, &st, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &st, 0);
            break;
        }
        ::usleep(10'000);
    }
    result r;
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
}

/// Runs mini_gpt with `args` to completion (run_within without a limit).
inline result run(const std::filesystem::path& dir, std::vector<std::string> args) {
    return run_within(dir, std::move(args), 0);
}

/// Runs mini_gpt with `args` (which must include --json) and kills it with SIGKILL once it
/// reported `step` (counted from 1: that many steps are done).
inline void kill_after_step(std::vector<std::string> args, int step) {
    int pipefd[2];
    REQUIRE(::pipe(pipefd) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(pipefd[1], 1);
        ::close(pipefd[0]);
        exec_mini_gpt(args);
    }
    ::close(pipefd[1]);
    const std::string mark = "\"step\":" + std::to_string(step) + ",";
    std::string seen;
    char buf[4096];
    while (seen.find(mark) == std::string::npos) {
        ssize_t n = ::read(pipefd[0], buf, sizeof buf);
        if (n <= 0) break;
        seen.append(buf, static_cast<std::size_t>(n));
    }
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    ::close(pipefd[0]);
    REQUIRE(WIFSIGNALED(st));
    CHECK(WTERMSIG(st) == SIGKILL);
    REQUIRE(seen.find(mark) != std::string::npos);
}

inline std::vector<std::string> tiny_args() {
    return {"--layers",  "2",  "--channels",     "32",   "--heads", "4",
            "--max-seq", "16", "--seq",          "16",   "--batch", "2",
            "--threads", "2",  "--corpus-bytes", "8192", "--lr",    "1e-3"};
}

inline std::vector<std::string> operator+(std::vector<std::string> a,
                                          const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<std::byte>& b) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

/// Expects exit status 2 and one line on stderr containing every string in `needles`.
inline void expect_refused(const result& r, const std::vector<std::string>& needles) {
    INFO("stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    for (const auto& n : needles) CHECK(r.err.find(n) != std::string::npos);
}

/// The value of `name` on each --json line of `out`, as printed.
inline std::vector<std::string> json_values(const std::string& out, const std::string& name) {
    std::vector<std::string> v;
    const std::string key = "\"" + name + "\":";
    for (auto at = out.find(key); at != std::string::npos; at = out.find(key, at + 1)) {
        auto begin = at + key.size();
        v.push_back(out.substr(begin, out.find(',', begin) - begin));
    }
    return v;
}

inline std::vector<std::string> json_losses(const std::string& out) {
    return json_values(out, "loss");
}

}  // namespace mini_gpt::cli_testing
