// SPDX-License-Identifier: Apache-2.0
// examples/quickstart/tier_round_trip.cpp: step 1 of docs/integration.md. A file tier in a
// directory stores a blob and gives it back; a read with the wrong size is refused with an
// error naming both sizes. Exits non-zero if any of that does not hold.
//
// Usage: tier_round_trip [SCRATCH_DIR]
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

// [step-1-include-begin]
#include <spillway/spillway.hpp>
// [step-1-include-end]

#include "quickstart.hpp"

using quickstart::expect;

int main(int argc, char** argv) {
    return quickstart::run_main("tier_round_trip", [&] {
        quickstart::scratch_dir scratch(argc, argv, "tier_round_trip");
        const std::filesystem::path directory = scratch.path();

        // [step-1-begin]
        spillway::file_tier<> tier(directory);  // an existing, writable directory
        std::printf("engine %s, %s\n", std::string(tier.engine().backend_name()).c_str(),
                    tier.direct_io() ? "O_DIRECT" : tier.direct_io_note().c_str());

        std::vector<std::byte> blob((3 << 20) + 123), back(blob.size());  // any size round-trips
        for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = std::byte(i * 31 % 251);

        spillway::io_completion written = tier.write("subgroup-0", blob);  // asynchronous: keep blob alive
        written.wait();                                 // rethrows the operation's error, if any
        tier.read("subgroup-0", back).wait();           // the buffer must have the stored size
        spillway::tier_stats stats = tier.stats();      // bytes, operations, busy time each way
        // [step-1-end]

        expect(back == blob, "the blob read back equals the blob written");
        expect(stats.bytes_written == blob.size() && stats.bytes_read == blob.size(),
               "the tier counted one write and one read of the blob's size");

        std::string refusal;
        // [step-1-error-begin]
        std::vector<std::byte> wrong(blob.size() - 1);
        try {
            tier.read("subgroup-0", wrong).wait();
        } catch (const std::invalid_argument& e) {
            refusal = e.what();  // names the tier, the key, the path and both sizes
        }
        // [step-1-error-end]
        std::printf("refused: %s\n", refusal.c_str());
        expect(refusal.find(std::to_string(blob.size()) + " bytes") != std::string::npos,
               "a read into a buffer of the wrong size is refused, naming the stored size");
        expect(tier.erase("subgroup-0") && !tier.contains("subgroup-0"), "erase removes the blob");
    });
}
