// SPDX-License-Identifier: Apache-2.0
// tests/support/simd_cases.hpp: one doctest case per SIMD level.
//
// SPILLWAY_SIMD_CASES("name", level) { ... } defines a function of `simd_level level` and
// registers it three times: "name: scalar", "name: avx2", "name: avx512". A level the CPU
// lacks is registered with doctest's skip decorator, so the run reports it as skipped (its
// summary counts it) instead of passing it without a check.
#pragma once

#include <doctest/doctest.h>

#include <spillway/optim/detail/simd.hpp>

#define SPILLWAY_SIMD_CASE_AT(fn, name, lvl)                                \
    TEST_CASE(name ": " #lvl* doctest::skip(                                \
        !spillway::detail::supported(spillway::detail::simd_level::lvl))) { \
        fn(spillway::detail::simd_level::lvl);                              \
    }
#define SPILLWAY_SIMD_CASES_NAMED(fn, name, level)      \
    static void fn(spillway::detail::simd_level level); \
    SPILLWAY_SIMD_CASE_AT(fn, name, scalar)             \
    SPILLWAY_SIMD_CASE_AT(fn, name, avx2)               \
    SPILLWAY_SIMD_CASE_AT(fn, name, avx512)             \
    static void fn(spillway::detail::simd_level level)
#define SPILLWAY_SIMD_CASES(name, level) \
    SPILLWAY_SIMD_CASES_NAMED(DOCTEST_ANONYMOUS(spillway_simd_case_), name, level)
