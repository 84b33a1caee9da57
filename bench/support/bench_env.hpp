// bench/support/bench_env.hpp: settings shared by the benchmark binaries.
//
// SPILLWAY_BENCH_SMOKE=1 asks for a quick pass (small sizes) so the test run can prove that
// each benchmark starts; SPILLWAY_BENCH_DIR names the directory for scratch files (default:
// the current directory's spillway-bench folder, on the disk).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

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

}  // namespace spillway::bench
