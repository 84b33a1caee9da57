# SPDX-License-Identifier: Apache-2.0
# tests/consumer/check_version.cmake: the test version.sources_agree. Run with cmake -P,
# -DVERSION=<project(VERSION) of CMakeLists.txt> and -DROOT=<source tree>.
# project(VERSION) is the one source of truth; this fails, naming the file to fix, when
# include/spillway/config.hpp's SPILLWAY_VERSION_* macros or the latest release section of
# CHANGELOG.md ("## [X.Y.Z] - date") say another version.
cmake_minimum_required(VERSION 3.22)
string(REGEX MATCH "^([0-9]+)[.]([0-9]+)[.]([0-9]+)$" ok "${VERSION}")
if(NOT ok)
  message(FATAL_ERROR "project(VERSION ${VERSION}) in CMakeLists.txt is not MAJOR.MINOR.PATCH")
endif()
set(want_major ${CMAKE_MATCH_1})
set(want_minor ${CMAKE_MATCH_2})
set(want_patch ${CMAKE_MATCH_3})

set(problems "")
file(READ "${ROOT}/include/spillway/config.hpp" config)
foreach(part MAJOR MINOR PATCH)
  string(TOLOWER "${part}" lower)
  if(NOT config MATCHES "#define SPILLWAY_VERSION_${part} ([0-9]+)")
    string(APPEND problems "include/spillway/config.hpp defines no SPILLWAY_VERSION_${part}\n")
  elseif(NOT CMAKE_MATCH_1 STREQUAL want_${lower})
    string(APPEND problems "include/spillway/config.hpp: SPILLWAY_VERSION_${part} is ${CMAKE_MATCH_1}, "
                           "project(VERSION ${VERSION}) says ${want_${lower}}\n")
  endif()
endforeach()
if(NOT config MATCHES "#define SPILLWAY_VERSION_STRING \"([^\"]*)\"")
  string(APPEND problems "include/spillway/config.hpp defines no SPILLWAY_VERSION_STRING\n")
elseif(NOT CMAKE_MATCH_1 STREQUAL VERSION)
  string(APPEND problems "include/spillway/config.hpp: SPILLWAY_VERSION_STRING is \"${CMAKE_MATCH_1}\", "
                         "project(VERSION ${VERSION}) says \"${VERSION}\"\n")
endif()

file(READ "${ROOT}/CHANGELOG.md" changelog)
if(NOT changelog MATCHES "\n## \\[([0-9]+[.][0-9]+[.][0-9]+)\\]")
  string(APPEND problems "CHANGELOG.md has no release section (## [X.Y.Z] - YYYY-MM-DD)\n")
elseif(NOT CMAKE_MATCH_1 STREQUAL VERSION)
  string(APPEND problems "CHANGELOG.md: the latest release is ${CMAKE_MATCH_1}, project(VERSION ${VERSION}) says ${VERSION}\n")
endif()

if(problems)
  message(FATAL_ERROR "The version is set by project(VERSION) in CMakeLists.txt; these disagree:\n${problems}")
endif()
message(STATUS "version ${VERSION}: CMakeLists.txt, include/spillway/config.hpp and CHANGELOG.md agree")
