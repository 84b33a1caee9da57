// SPDX-License-Identifier: Apache-2.0
// tests/support/random_bytes.hpp: reproducible random test data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace spillway::test {

/// nbytes of pseudo-random data from `seed` (the same seed gives the same bytes).
inline std::vector<std::byte> random_bytes(std::size_t nbytes, std::uint64_t seed) {
    std::vector<std::byte> out(nbytes);
    std::mt19937_64 rng(seed);
    std::size_t i = 0;
    for (; i + 8 <= nbytes; i += 8) {
        std::uint64_t w = rng();
        for (int b = 0; b < 8; ++b) out[i + b] = static_cast<std::byte>(w >> (8 * b));
    }
    // The tail (fewer than 8 bytes) takes the low bytes of one more draw.
    for (std::uint64_t w = rng(); i < nbytes; ++i, w >>= 8) out[i] = static_cast<std::byte>(w & 0xffu);
    return out;
}

}  // namespace spillway::test
