// SPDX-License-Identifier: Apache-2.0
// tests/core/config_test.cpp: SPILLWAY_VERSION is one number usable in #if, made of the three
// parts.
#include <doctest/doctest.h>

#include <string>

#include <spillway/config.hpp>

#if !defined(SPILLWAY_VERSION) || SPILLWAY_VERSION < 200
#error "SPILLWAY_VERSION must be usable in #if and at least 200 (0.2.0)"
#endif

TEST_CASE("SPILLWAY_VERSION is major * 10000 + minor * 100 + patch, and orders releases") {
    static_assert(SPILLWAY_VERSION == SPILLWAY_VERSION_MAJOR * 10000 +
                                          SPILLWAY_VERSION_MINOR * 100 + SPILLWAY_VERSION_PATCH);
    static_assert(spillway::version == SPILLWAY_VERSION);
    CHECK(SPILLWAY_VERSION_MINOR < 100);
    CHECK(SPILLWAY_VERSION_PATCH < 100);
    const std::string parts = std::to_string(SPILLWAY_VERSION_MAJOR) + "." +
                              std::to_string(SPILLWAY_VERSION_MINOR) + "." +
                              std::to_string(SPILLWAY_VERSION_PATCH);
    CHECK(parts == SPILLWAY_VERSION_STRING);
#if SPILLWAY_VERSION / 10000 == SPILLWAY_VERSION_MAJOR &&     \
    SPILLWAY_VERSION / 100 % 100 == SPILLWAY_VERSION_MINOR && \
    SPILLWAY_VERSION % 100 == SPILLWAY_VERSION_PATCH
    const bool preprocessor_agrees = true;
#else
    const bool preprocessor_agrees = false;
#endif
    CHECK(preprocessor_agrees);
}
