// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/tests/trainer_support.hpp: what the trainer's tests share: a run in this
// process, a run of the binary in a child, a file's bytes, an error's message, and the
// smallest --memory-budget train() names.
#pragma once

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "trainer.hpp"

namespace mini_gpt::testing {

/// A tiny model (C 32, 4 heads, T 16, B 4, 2 threads, quiet, a 16 KiB corpus) of `layers`
/// layers for `steps` steps, with --path scratch/p1 .. p<paths> and its locks in scratch
/// (not /dev/shm: the scratch directory goes after the test).
inline options tiny_options(const std::filesystem::path& scratch, int layers, int steps,
                            int paths) {
    options o;
    o.layers = layers;
    o.channels = 32;
    o.heads = 4;
    o.max_seq = 16;
    o.seq = 16;
    o.batch = 4;
    o.steps = steps;
    o.lr = 1e-3f;
    o.threads = 2;
    o.quiet = true;
    o.corpus_bytes = 1 << 14;
    o.paths.clear();
    for (int i = 1; i <= paths; ++i) {
        std::string name = "p";
        name += std::to_string(i);
        o.paths.push_back(scratch / name);
    }
    o.lock_dir = scratch / "locks";
    return o;
}

/// train(o) with its output discarded; the losses.
inline std::vector<float> run(const options& o) {
    std::ostringstream out;
    return train(o, out);
}

/// Runs `args` (argv[0] found on PATH) in a child with stdout to `out` and stderr to
/// `out`.err; its exit status, or 128 + the signal that ended it.
inline int run(const std::vector<std::string>& args, const std::filesystem::path& out) {
    std::fflush(nullptr);  // (the child's freopen would write the parent's buffered output)
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (!std::freopen(out.c_str(), "w", stdout)) ::_exit(126);
        if (!std::freopen((out.string() + ".err").c_str(), "w", stderr)) ::_exit(126);
        std::vector<std::string> copy = args;
        std::vector<char*> argv;
        for (auto& a : copy) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execvp(argv[0], argv.data());
        ::_exit(127);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// The contents of `p` (empty when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// The bytes of `p`, which must exist (each run writes its model to a path of its own, so a
/// run that failed to write cannot pass by an older run's file).
inline std::vector<char> file_bytes(const std::filesystem::path& p) {
    REQUIRE_MESSAGE(std::filesystem::exists(p), p.string() << " was not written");
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// What `f` throws, or "(no error)".
inline std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no error)";
}

/// The smallest budget train() names when refusing `o` with a budget of one byte.
inline std::size_t smallest_budget_of(options o) {
    o.memory_budget = 1;
    const std::string m = message_of([&] { run(o); });
    const std::string key = "the smallest budget that works is ";
    const auto at = m.find(key);
    REQUIRE_MESSAGE(at != std::string::npos, m);
    return std::stoull(m.substr(at + key.size()));
}

}  // namespace mini_gpt::testing
