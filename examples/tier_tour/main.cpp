// tier_tour: the quickest look at Spillway's storage tiers at work.
//
// Writes a set of blobs to each tier, reads them back, checks every byte, and prints a
// summary table of what each tier moved and how fast. `--quick` uses small sizes.
#include <spillway/spillway.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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
    return ok ? 0 : 1;
}
