// SPDX-License-Identifier: Apache-2.0
// bench/support/bench_env.hpp: settings shared by the benchmark binaries.
//
// SPILLWAY_BENCH_SMOKE=1 asks for a quick pass (small sizes) so the test run can prove that
// each benchmark starts; SPILLWAY_BENCH_DIR names the directory for scratch files (default:
// the current directory's spillway-bench folder, on the disk).
//
// Every binary that includes this header adds "cpu_model" (the CPU's model name, from
// /proc/cpuinfo) to Google Benchmark's context, so each JSON report names the machine it was
// measured on; scripts/bench_report.py prints it under every table and plot.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>

namespace spillway::bench {

inline bool smoke() {
    const char* s = std::getenv("SPILLWAY_BENCH_SMOKE");
    return s && *s && std::string(s) != "0";
}

inline std::filesystem::path scratch_dir() {
    const char* s = std::getenv("SPILLWAY_BENCH_DIR");
    std::filesystem::path p = s && *s ? std::filesystem::path(s) : std::filesystem::current_path() / "spillway-bench";
    std::filesystem::create_directories(p);
    return p;
}

/// The CPU's model name: /proc/cpuinfo's "model name" (x86), else "Model" or "cpu model"
/// (other architectures); "unknown CPU" when none is there.
inline std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    for (const char* key : {"model name", "Model", "cpu model"}) {
        in.clear();
        in.seekg(0);
        while (std::getline(in, line)) {
            if (line.rfind(key, 0) != 0) continue;
            auto colon = line.find(':');
            if (colon == std::string::npos) continue;
            auto start = line.find_first_not_of(" \t", colon + 1);
            if (start != std::string::npos) return line.substr(start);
        }
    }
    return "unknown CPU";
}

/// The machine in words for a side file: "<cpu model>, <n> CPUs".
inline std::string machine_description() {
    return cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) + " CPUs";
}

/// Now, in UTC, as ISO 8601 ("2026-12-01T10:15:00Z").
inline std::string utc_now() {
    std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return text;
}

/// Where a benchmark writes a side file (a time series beside its JSON report): the directory
/// of --benchmark_out=PATH when it is among the arguments, else the current directory.
/// Call it before benchmark::Initialize, which removes the flags it knows from argv.
inline std::filesystem::path side_file(int argc, char** argv, std::string_view name) {
    constexpr std::string_view flag = "--benchmark_out=";
    for (int i = 1; i < argc; ++i) {
        std::string_view arg(argv[i]);
        if (arg.substr(0, flag.size()) == flag) {
            std::filesystem::path out(arg.substr(flag.size()));
            return out.parent_path() / name;  // an empty parent is the current directory
        }
    }
    return std::filesystem::path(name);
}

namespace detail {
// Registered before main() runs, once per binary (an inline variable has one definition).
inline const bool cpu_model_in_context = [] {
    benchmark::AddCustomContext("cpu_model", cpu_model());
    return true;
}();
}  // namespace detail

}  // namespace spillway::bench
