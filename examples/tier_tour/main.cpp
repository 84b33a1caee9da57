// SPDX-License-Identifier: Apache-2.0
// tier_tour: the quickest look at Spillway's storage tiers at work.
//
// Writes a set of blobs to each tier, reads them back, checks every byte, and prints a
// summary table of what each tier moved and how fast: the host tier, and the file tier in a
// scratch directory (under $TMPDIR, or the directory given as the second argument) through
// the io_uring engine (when this machine allows it) and the POSIX engine. `--quick` uses
// small sizes.
#include <spillway/config.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

template <spillway::storage_tier Tier>
bool tour(Tier& tier, std::size_t blobs, std::size_t nbytes) {
    std::vector<std::vector<std::byte>> data(blobs, std::vector<std::byte>(nbytes));
    std::mt19937_64 rng(42);
    for (auto& d : data)
        for (auto& b : d) b = static_cast<std::byte>(rng());
    std::vector<spillway::io_completion> pending;
    for (std::size_t i = 0; i < blobs; ++i) pending.push_back(tier.write("blob" + std::to_string(i), data[i]));
    for (auto& p : pending) p.wait();
    pending.clear();
    std::vector<std::vector<std::byte>> back(blobs, std::vector<std::byte>(nbytes));
    for (std::size_t i = 0; i < blobs; ++i) pending.push_back(tier.read("blob" + std::to_string(i), back[i]));
    for (auto& p : pending) p.wait();
    bool ok = back == data;
    auto s = tier.stats();
    std::printf("| %-10s | %10.1f MiB | %10.2f GB/s | %10.1f MiB | %10.2f GB/s | %-4s |\n",
                std::string(tier.name()).c_str(), s.bytes_written / 1048576.0, s.write_bandwidth() / 1e9,
                s.bytes_read / 1048576.0, s.read_bandwidth() / 1e9, ok ? "ok" : "BAD");
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    std::size_t blobs = quick ? 8 : 64, nbytes = quick ? (1u << 20) : (8u << 20);
    std::printf("Spillway %s tier tour: %zu blobs of %zu bytes per tier\n\n", SPILLWAY_VERSION_STRING, blobs, nbytes);
    std::printf("| %-10s | %14s | %15s | %14s | %15s | %-4s |\n", "tier", "written", "write bw", "read", "read bw", "ok");
    std::printf("|------------|----------------|-----------------|----------------|-----------------|------|\n");
    bool ok = true;
    spillway::host_tier host;
    ok &= tour(host, blobs, nbytes);

    // The file tier, once per engine, in a scratch directory removed at the end.
    namespace fs = std::filesystem;
    fs::path root = argc > 2 ? fs::path(argv[2]) : fs::temp_directory_path();
    fs::path dir = root / ("spillway-tier-tour-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::string notes;
    try {
        spillway::file_tier_options opt;
#if SPILLWAY_HAS_LIBURING
        if (spillway::uring_probe().available) {
            opt.name = "file/uring";
            spillway::file_tier<spillway::uring_engine> uring(dir, opt);
            ok &= tour(uring, blobs, nbytes);
            notes += "file/uring: " + std::string(uring.direct_io() ? "O_DIRECT" : uring.direct_io_note()) + "\n";
        } else {
            notes += "io_uring unavailable here: " + spillway::uring_probe().reason + "\n";
        }
#else
        notes += "built without liburing: no io_uring engine\n";
#endif
        opt.name = "file/posix";
        spillway::file_tier<spillway::posix_engine> posix(dir, opt);
        ok &= tour(posix, blobs, nbytes);
        notes += "file/posix: " + std::string(posix.direct_io() ? "O_DIRECT" : posix.direct_io_note()) + "\n";
    } catch (const std::exception& e) {
        std::printf("file tier failed: %s\n", e.what());
        ok = false;
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    std::printf("\nfile tiers in %s\n%s", dir.c_str(), notes.c_str());
    return ok ? 0 : 1;
}
