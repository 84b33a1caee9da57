// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/error.hpp: the error types and helpers every layer uses.
///
/// Conventions (see docs/design.md):
/// - OS and io_uring failures are std::system_error carrying the errno; the message names the
///   call, the path or key, and the size involved.
/// - Bad arguments and configuration are std::invalid_argument with a sentence a user can act
///   on, raised eagerly (in constructors, at API boundaries).
/// - Inside the I/O engines the liburing convention (-errno) is kept; each engine converts a
///   failed operation once, when it completes (io/detail/engine_common.hpp's make_io_error
///   builds the exception its io_completion rethrows).
#pragma once

#include <cerrno>
#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace spillway {

/// Throws std::system_error in std::generic_category() with the message
/// `"<what>: <call> failed"`; the category appends the errno's text to what() as usual.
/// @param err  a positive errno value (e.g.\ `errno` right after the failed call)
/// @param call the system or liburing call that failed, e.g.\ `"pwrite"`
/// @param what the object it failed on: a path, a key, a size
[[noreturn]] inline void throw_system_error(int err, std::string_view call, std::string_view what) {
    std::string msg(what);
    msg += ": ";
    msg += call;
    msg += " failed";
    throw std::system_error(err, std::generic_category(), msg);
}

/// Argument check used in constructors and at API boundaries.
/// @throws std::invalid_argument with `message` (a sentence naming the argument, its value
///         and the limit) when `cond` is false; does nothing otherwise
inline void expect_argument(bool cond, std::string_view message) {
    if (!cond) throw std::invalid_argument(std::string(message));
}

/// Renders a byte count for error messages, e.g.\ `bytes_str(4096)` is `"4096 bytes"`.
inline std::string bytes_str(std::size_t nbytes) {
    return std::to_string(nbytes) + " bytes";
}

/// Strings longer than this many bytes (the longest file name, so the longest valid key) are
/// cut in messages by quoted().
inline constexpr std::size_t quoted_whole_limit = 255;
/// How many leading bytes quoted() keeps of a string it cuts.
inline constexpr std::size_t quoted_cut_bytes = 100;

/// Quotes a caller-provided key or name for an error message: `quoted("a")` is `"'a'"`, so
/// an empty key or one with spaces stays visible in the message. Control bytes (a NUL, a
/// newline) are written as `\xNN`, so the message stays one line that what() shows whole.
/// A string longer than quoted_whole_limit (255) bytes, which no valid key is, is cut to its
/// first 100 bytes: a 5,000-byte key becomes `'kkk...k...' (5000 bytes)`, so what() stays
/// readable and still says how long the string was.
inline std::string quoted(std::string_view s) {
    const bool cut = s.size() > quoted_whole_limit;
    std::string out = "'";
    for (char c : cut ? s.substr(0, quoted_cut_bytes) : s) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            constexpr char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[u >> 4];
            out += hex[u & 15];
        } else {
            out += c;
        }
    }
    if (cut) {
        out += "...' (";
        out += std::to_string(s.size());
        out += " bytes)";
    } else {
        out += "'";
    }
    return out;
}
// Exact-match overloads: an unqualified quoted(str) inside namespace spillway also finds
// std::quoted (<iomanip>) by argument-dependent lookup; these non-templates win over it, for
// const and non-const strings alike.
/// @copydoc quoted(std::string_view)
inline std::string quoted(const std::string& s) {
    return quoted(std::string_view(s));
}
/// @copydoc quoted(std::string_view)
inline std::string quoted(std::string& s) { return quoted(std::string_view(s)); }
/// @copydoc quoted(std::string_view)
inline std::string quoted(const char* s) {
    return quoted(std::string_view(s));
}

/// The same error with `context` put in front of its message, for a layer that adds what it
/// was doing (a subgroup, a path, a tensor) to an error from the layer below.
/// std::system_error appends the errno's text to what() itself, so that text is taken off
/// the inner message first and appears once, at the end, as in any other system_error.
/// @param e       the error from the layer below (its code is kept)
/// @param context e.g.\ `"subgroup 3 (read)"`; a ": " separates it from the inner message
inline std::system_error with_context(const std::system_error& e, std::string_view context) {
    std::string inner = e.what();
    const std::string errno_text = e.code().message();
    if (inner == errno_text) {
        inner.clear();  // constructed without a message of its own
    } else if (const std::string suffix = ": " + errno_text;
               inner.size() >= suffix.size() &&
               inner.compare(inner.size() - suffix.size(), suffix.size(), suffix) == 0) {
        inner.resize(inner.size() - suffix.size());
    }
    std::string message(context);
    if (!message.empty() && !inner.empty()) message += ": ";
    message += inner;
    return std::system_error(e.code(), message);
}

/// A re-throwable copy of `error` with `context` in front of its message, for errors carried
/// as std::exception_ptr from a completion thread to the caller. A std::system_error keeps its
/// code (as above), a std::invalid_argument stays one, any other exception becomes a
/// std::runtime_error with the same text.
/// @param error   the error from the layer below; must not be null
/// @param context e.g.\ `"stash: read of 'x' from tier 'disk'"`; ": " separates it
inline std::exception_ptr with_context(std::exception_ptr error, std::string_view context) {
    const std::string prefix = std::string(context) + ": ";
    try {
        std::rethrow_exception(error);
    } catch (const std::system_error& e) {
        return std::make_exception_ptr(with_context(e, context));
    } catch (const std::invalid_argument& e) {
        return std::make_exception_ptr(std::invalid_argument(prefix + e.what()));
    } catch (const std::exception& e) {
        return std::make_exception_ptr(std::runtime_error(prefix + e.what()));
    } catch (...) {
        return std::make_exception_ptr(std::runtime_error(prefix + "unknown error"));
    }
}

/// Throws with_context(error, context).
[[noreturn]] inline void rethrow_with_context(std::exception_ptr error, std::string_view context) {
    std::rethrow_exception(with_context(std::move(error), context));
}

/// Validates a key or file name supplied by a caller: non-empty, at most 255 bytes, no '/',
/// no NUL, and not "." or "..", so that it can never escape the directory it is placed in.
/// @param key  the caller's key
/// @param what how the message calls it (`"key"`, `"file name"`, ...); a tier passes
///             `"<tier name>: key"` so the message says which tier refused it
/// A key longer than 255 bytes is cut in the message (see quoted()).
/// @throws std::invalid_argument `"<what> '<key>' <reason>"` when a rule is broken
inline void validate_key(std::string_view key, std::string_view what = "key") {
    auto fail = [&](std::string_view why) {
        throw std::invalid_argument(std::string(what) + " " + quoted(key) + " " + std::string(why));
    };
    if (key.empty()) fail("is empty");
    if (key.size() > 255) fail("is longer than 255 bytes");
    if (key == "." || key == "..") fail("is a relative directory name ('.' and '..' are refused)");
    for (char c : key) {
        if (c == '/') fail("contains '/' (keys may not name paths)");
        if (c == '\0') fail("contains a NUL byte");
    }
}

}  // namespace spillway
