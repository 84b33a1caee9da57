# SPDX-License-Identifier: Apache-2.0
# Developer settings for Spillway's own tests, benchmarks and examples: warnings and
# sanitizers live in the private target spillway_dev_settings, never in the exported one.
add_library(spillway_dev_settings INTERFACE)

option(SPILLWAY_WARNINGS_AS_ERRORS "Treat warnings in Spillway's own code as errors" OFF)
set(SPILLWAY_SANITIZE "" CACHE STRING "Sanitizers for tests and examples: '', 'address,undefined' or 'thread'")

target_compile_options(spillway_dev_settings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast>)
if(SPILLWAY_WARNINGS_AS_ERRORS)
  target_compile_options(spillway_dev_settings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(SPILLWAY_SANITIZE)
  target_compile_options(spillway_dev_settings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${SPILLWAY_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(spillway_dev_settings INTERFACE -fsanitize=${SPILLWAY_SANITIZE})
  target_compile_definitions(spillway_dev_settings INTERFACE SPILLWAY_SANITIZED=1)
endif()
