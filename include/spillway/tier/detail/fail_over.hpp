// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/detail/fail_over.hpp: the record a virtual tier's write keeps of the
/// children that failed it, and the error it ends with when none is left.
///
/// Guarantees:
///  - Only a std::system_error (EIO, ENOSPC, ...) is a failure to fail over from; any other
///    error (a bad argument) ends the write as it is.
///  - Each recorded failure adds the child to tried() and "; <child>: <error text>" to the
///    final message, in the order they happened.
///  - exhausted() is a std::system_error carrying the last failure's error number.
/// The fail-over protocol is in docs/design.md ("Multi-path offload", step 6).
#pragma once

#include <cstddef>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace spillway::detail {

/// The error number of a std::system_error, else 0.
inline int errno_of(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const std::system_error& e) {
        return e.code().value();
    } catch (...) {
        return 0;
    }
}

/// The failures of one write so far, over the children it tried.
class write_failures {
public:
    /// Records that child `child` (named `label` in messages) failed with `error`.
    /// @return the error's text when the write may fail over (a std::system_error), else
    ///         std::nullopt and nothing is recorded
    std::optional<std::string> record(std::size_t child, std::string_view label,
                                      const std::exception_ptr& error) {
        std::string what;
        try {
            std::rethrow_exception(error);
        } catch (const std::system_error& e) {
            last_errno_ = e.code().value();
            what = e.what();
        } catch (...) {
            return std::nullopt;
        }
        tried_.push_back(child);
        text_ += "; " + std::string(label) + ": " + what;
        return what;
    }

    /// The children that failed, in order.
    [[nodiscard]] const std::vector<std::size_t>& tried() const noexcept { return tried_; }

    /// The write's final error: "<context> failed on every usable child; <child>: <error>...".
    [[nodiscard]] std::exception_ptr exhausted(std::string_view context) const {
        return std::make_exception_ptr(
            std::system_error(last_errno_, std::generic_category(),
                              std::string(context) + " failed on every usable child" + text_));
    }

private:
    std::vector<std::size_t> tried_;
    std::string text_;
    int last_errno_ = 0;
};

}  // namespace spillway::detail
