// SPDX-License-Identifier: Apache-2.0
// A consumer's program, built by the consumer.* tests against an installed Spillway, its
// source tree, FetchContent and pkg-config: stores a blob in a file tier (so the io_uring
// engine, when compiled in, is linked and used) and reads it back.
//
// Usage: main [DIRECTORY]   (an existing directory; default: a fresh one under /tmp)
// Prints "spillway <version> consumer: SPILLWAY_HAS_LIBURING=<0|1>, engine <name>, round trip ok"
// (the tests match it) and exits 0, or says what failed and exits 1.
#include <spillway/tier/file_tier.hpp>
#if CONSUMER_CUDA
#  include <spillway/cuda/pinned_buffer.hpp>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

int main(int argc, char** argv) try {
    std::string base = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
    std::string pattern = base + "/spillway-consumer-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
        std::perror(("mkdtemp " + pattern).c_str());
        return 1;
    }
    std::filesystem::path directory = pattern;
    bool same = false;
    std::string engine;
    {
        spillway::file_tier<> tier(directory);
        engine = std::string(tier.engine().backend_name());
        std::string_view text = "hello from a consumer";
        auto bytes = std::as_bytes(std::span(text.data(), text.size()));
        tier.write("greeting", bytes).wait();
        std::vector<std::byte> back(bytes.size());
        tier.read("greeting", back).wait();
        same = std::equal(back.begin(), back.end(), bytes.begin());
    }
    std::filesystem::remove_all(directory);
#if CONSUMER_CUDA
    int devices = 0;
    cudaError_t status = cudaGetDeviceCount(&devices);  // links the CUDA runtime; no GPU needed
    std::printf("spillway::cuda: cudaGetDeviceCount says %s, %d devices\n", cudaGetErrorName(status),
                status == cudaSuccess ? devices : 0);
#endif
    std::printf("spillway %s consumer: SPILLWAY_HAS_LIBURING=%d, engine %s, round trip %s\n",
                SPILLWAY_VERSION_STRING, SPILLWAY_HAS_LIBURING, engine.c_str(), same ? "ok" : "FAILED");
    return same ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
}
