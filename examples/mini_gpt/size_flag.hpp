// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/size_flag.hpp: a byte size given on the command line (--memory-budget).
//
// Guarantees: the value is read exactly (decimal digits, never through a float), so "1.5K" is
// 1536 bytes and no rounding can turn a size into another one; a value that is not a whole
// number of bytes of at least 1 after its unit ("0.5", "0.0001K", "1.1K") is refused, never
// rounded to 0 (which would mean "no limit").
#pragma once

#include <cstddef>
#include <string>

namespace mini_gpt {

/// "3.5G", "800M", "64K", "123" (bytes): digits with an optional decimal fraction, then an
/// optional unit K, M, G or T (powers of 1024, either case) with an optional "B" or "iB"
/// after it, or "B" alone. The result is a whole number of bytes from 1 to 10^18.
/// @throws input_error naming `flag` and the value for anything else: another spelling, an
/// unknown unit, 0, a fraction of a byte, or more than 10^18 bytes.
std::size_t parse_size(const std::string& flag, const std::string& v);

}  // namespace mini_gpt
