// SPDX-License-Identifier: Apache-2.0
// The storage_tier conformance suite: every tier model and decorator must pass every case
// (the contract is written in include/spillway/tier/storage_tier.hpp). The cases live in
// conformance_cases.hpp, factories and helpers in conformance.hpp; this file instantiates
// them for the host-side tiers (tests/cuda/device_tier_test.cu does the same for the GPU).
//
// To add a tier: write a factory (see conformance.hpp) and add ONE line to
// SPILLWAY_CONFORMANCE_TIERS below (and to SPILLWAY_FAULT_BASES if faulty_tier should be
// wrapped around it).
#include "tier/conformance_cases.hpp"
#include "tier/virtual_tier_conformance.hpp"

using namespace spillway::test::conformance;

// clang-format off
#define SPILLWAY_CONFORMANCE_TIERS            \
    host_factory,                             \
    file_disk_factory,                        \
    file_shm_factory,                         \
    throttled_of<host_factory>,               \
    throttled_of<file_disk_factory>,          \
    faulty_of<host_factory>,                  \
    faulty_of<throttled_of<host_factory>>,    \
    virtual_factory,                          \
    virtual_striped_factory
// Base tiers the fault cases wrap in faulty_tier<>.
#define SPILLWAY_FAULT_BASES          \
    host_factory,                     \
    file_disk_factory,                \
    file_shm_factory,                 \
    throttled_of<host_factory>
// clang-format on

SPILLWAY_CONFORMANCE_SUITE(SPILLWAY_CONFORMANCE_TIERS);
SPILLWAY_CONFORMANCE_FAULT_SUITE(SPILLWAY_FAULT_BASES);
