// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/size_flag.cpp: a byte size given on the command line (size_flag.hpp).
#include "size_flag.hpp"

#include <cstdint>
#include <string_view>

#include "llmc_format.hpp"
#include "spillway/error.hpp"

namespace mini_gpt {

std::size_t parse_size(const std::string& flag, const std::string& v) {
    const std::string value = spillway::quoted(v);
    auto refuse = [&](const std::string& why) -> std::size_t {
        throw input_error(flag + " " + value + ": " + why);
    };
    // 1. The number: whole digits, then optional fraction digits, kept exactly as
    //    mantissa / 10^scale (at most 30 digits in all, so the 128-bit product below cannot
    //    overflow: 10^30 * 1024^4 < 2^128).
    __extension__ typedef unsigned __int128 u128;
    u128 mantissa = 0, scale = 1;
    std::size_t at = 0, digits = 0;
    bool fraction = false, fraction_digits = false;
    for (; at < v.size(); ++at) {
        const char c = v[at];
        if (c == '.' && !fraction && digits > 0) {
            fraction = true;
            continue;
        }
        if (c < '0' || c > '9') break;
        if (++digits > 30) return refuse("too many digits");
        mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
        if (fraction) {
            scale *= 10;
            fraction_digits = true;
        }
    }
    if (digits == 0 || (fraction && !fraction_digits))
        return refuse("expected a size such as 3.5G, 800M or 4096");
    // 2. The unit.
    std::string_view unit = std::string_view(v).substr(at);
    if (unit.size() >= 2 && (unit.substr(1) == "iB" || unit.substr(1) == "B"))
        unit = unit.substr(0, 1);
    u128 mult = 1;
    if (unit == "K" || unit == "k")
        mult = u128{1} << 10;
    else if (unit == "M" || unit == "m")
        mult = u128{1} << 20;
    else if (unit == "G" || unit == "g")
        mult = u128{1} << 30;
    else if (unit == "T" || unit == "t")
        mult = u128{1} << 40;
    else if (!unit.empty() && unit != "B")
        return refuse("unknown unit '" + std::string(unit) +
                      "' (use K, M, G or T: powers of 1024)");
    // 3. A whole number of bytes, from 1 to 10^18.
    const u128 scaled = mantissa * mult;
    if (scaled % scale != 0) return refuse("not a whole number of bytes");
    const u128 bytes = scaled / scale;
    if (bytes < 1) return refuse("expected a size of at least 1 byte");
    if (bytes > u128{1'000'000'000'000'000'000ull}) return refuse("more than 10^18 bytes");
    return static_cast<std::size_t>(bytes);
}

}  // namespace mini_gpt
