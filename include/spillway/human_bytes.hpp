// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/human_bytes.hpp: how messages and reports write a byte count.
///
/// Guarantees: powers of 1024 with IEC units (B, KiB, MiB, GiB, TiB); counts under 1 KiB
/// are written whole. Pure functions, no allocation beyond the returned string.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace spillway {

/// "1.5 MiB", "12 B": `nbytes` in the largest unit that leaves at least 1, with `decimals`
/// digits after the point (none for bytes).
[[nodiscard]] inline std::string human_bytes(double nbytes, int decimals = 1) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (nbytes >= 1024 && u < 4) {
        nbytes /= 1024;
        ++u;
    }
    char text[64];
    std::snprintf(text, sizeof text, "%.*f %s", u == 0 ? 0 : decimals, nbytes, units[u]);
    return text;
}

/// "1.50 GiB (1610612736 bytes)", "512 bytes": a human size with the exact count, for
/// messages that name a limit a user may copy.
[[nodiscard]] inline std::string human_bytes_exact(std::size_t nbytes) {
    if (nbytes < 1024) return std::to_string(nbytes) + " bytes";
    return human_bytes(static_cast<double>(nbytes), 2) + " (" + std::to_string(nbytes) + " bytes)";
}

}  // namespace spillway
