// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/trace/json_string.hpp: text as a JSON string, for every JSON the library and its
/// examples write (the trace, mini_gpt's --json lines).
///
/// Guarantees: the output is valid JSON and valid UTF-8 whatever the input bytes; valid
/// UTF-8 input comes back unchanged when the JSON is parsed; nothing is lost silently except
/// invalid bytes, each replaced by U+FFFD.
#pragma once

#include <cstddef>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

namespace spillway {

namespace detail {

/// Length of the valid UTF-8 sequence at s[i] (i < s.size()), or 0 when the bytes there are
/// not one (a stray continuation byte, a truncated or overlong sequence, a surrogate, a code
/// point above U+10FFFF).
inline std::size_t utf8_length(std::string_view s, std::size_t i) {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
    const unsigned char c = b(0);
    std::size_t n = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xe  ? 3
                    : (c >> 3) == 0x1e ? 4
                                       : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (std::size_t k = 1; k < n; ++k)
        if ((b(k) & 0xc0) != 0x80) return 0;
    if (n == 2 && c < 0xc2) return 0;                   // overlong
    if (n == 3 && c == 0xe0 && b(1) < 0xa0) return 0;   // overlong
    if (n == 3 && c == 0xed && b(1) >= 0xa0) return 0;  // surrogate
    if (n == 4 && (c > 0xf4 || (c == 0xf0 && b(1) < 0x90) || (c == 0xf4 && b(1) >= 0x90))) return 0;
    return n;
}

}  // namespace detail

/// Writes `s` as a JSON string: quoted, with quotes, backslashes and control bytes escaped,
/// and each byte that does not start a valid UTF-8 sequence written as U+FFFD (JSON text is
/// UTF-8; parsers and trace viewers refuse anything else). Valid UTF-8 passes unchanged.
inline void write_json_string(std::ostream& out, std::string_view s) {
    out << '"';
    for (std::size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        auto u = static_cast<unsigned char>(c);
        if (u >= 0x80) {
            const std::size_t n = detail::utf8_length(s, i);
            if (n == 0) {
                out << "\\ufffd";
            } else {
                out << s.substr(i, n);
                i += n - 1;
            }
            continue;
        }
        switch (c) {
            case '"':
                out << "\\\"";
                break;
            case '\\':
                out << "\\\\";
                break;
            case '\n':
                out << "\\n";
                break;
            case '\t':
                out << "\\t";
                break;
            case '\r':
                out << "\\r";
                break;
            default:
                if (u < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", u);
                    out << buf;
                } else {
                    out << c;
                }
        }
    }
    out << '"';
}

/// `s` as a JSON string (see write_json_string).
inline std::string json_string(std::string_view s) {
    std::ostringstream out;
    write_json_string(out, s);
    return out.str();
}

}  // namespace spillway
