# SPDX-License-Identifier: Apache-2.0
# tests/consumer/run_consumer.cmake: one consumer.* test. Run with cmake -P and:
#   SOURCE        tests/consumer (copied to WORK/src first, so the test never writes there)
#   WORK          a scratch folder of this test (emptied first)
#   MODE          find_package, add_subdirectory, fetchcontent or makefile; or install, which
#                 only installs the build tree BUILD into a fresh PREFIX (the fixture)
#   SPILLWAY_SOURCE_DIR  Spillway's source tree (add_subdirectory: linked as
#                 third_party/spillway; fetchcontent: FETCHCONTENT_SOURCE_DIR_SPILLWAY)
#   PC_NAME       makefile only: the pkg-config package (spillway, or spillway-posix, which
#                 is then looked up on a search path of the install alone: no liburing.pc)
#   PINNED        fetchcontent only: ON runs the documented snippet as it is, cloning
#                 file://SPILLWAY_SOURCE_DIR at the commit it pins, with no source override
#   PREFIX        an installed Spillway (find_package: CMAKE_PREFIX_PATH; makefile:
#                 PKG_CONFIG_PATH=PREFIX/share/pkgconfig)
#   GENERATOR     CMake generator for the consumer
#   ARGS          more -D options for the consumer's configure, separated by '|'
#   EXPECT_CONFIGURE_FAILURE  a regex: the configure must fail, printing a match (then stop)
#   SKIP_CONFIGURE_FAILURE    a regex: a configure that fails printing a match means this
#                 machine cannot run the test: print "consumer skipped: ..." and stop
#   EXPECT_CONFIGURE  a regex the configure output must match (the configure checks see
#                 each run of spaces and newlines as one space: CMake wraps its messages)
#   REJECT_CONFIGURE  a regex the configure output must not match
#   EXPECT_OUTPUT a regex the program's output must match
#   INSTALL       NOTHING: `cmake --install` of the consumer installs its program and no file
#                 of Spillway's; SPILLWAY: it installs Spillway's headers and package too
# Steps: 1. copy; 2. configure (or make); 3. build; 4. run; 5. install and look.
cmake_minimum_required(VERSION 3.22)
if(MODE STREQUAL "install")
  # The fixture: BUILD (this build tree) installed into a fresh PREFIX.
  file(REMOVE_RECURSE "${PREFIX}")
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD}" --prefix "${PREFIX}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake --install ${BUILD} --prefix ${PREFIX} failed (${rc})")
  endif()
  return()
endif()
foreach(required SOURCE WORK MODE)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "run_consumer.cmake: ${required} is not set")
  endif()
endforeach()

function(fail what)
  message(FATAL_ERROR "consumer (${MODE}): ${what}")
endfunction()

# 1. A fresh copy of the consumer project.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(COPY "${SOURCE}/" DESTINATION "${WORK}/src" PATTERN "run_consumer.cmake" EXCLUDE)
set(src "${WORK}/src")
set(build "${WORK}/build")
file(MAKE_DIRECTORY "${WORK}/scratch")

if(MODE STREQUAL "makefile")
  # 2-3. make, with pkg-config looking in the install first. spillway-posix is looked up
  # in the install alone (PKG_CONFIG_LIBDIR), a machine without liburing.pc.
  if(NOT PC_NAME)
    set(PC_NAME spillway)
  endif()
  if(PC_NAME STREQUAL "spillway-posix")
    set(ENV{PKG_CONFIG_LIBDIR} "${PREFIX}/share/pkgconfig")
  else()
    set(ENV{PKG_CONFIG_PATH} "${PREFIX}/share/pkgconfig")
  endif()
  execute_process(COMMAND pkg-config --cflags --libs ${PC_NAME} OUTPUT_VARIABLE flags
                  ERROR_VARIABLE flags RESULT_VARIABLE rc)
  message(STATUS "pkg-config --cflags --libs ${PC_NAME}: ${flags}")
  if(NOT rc EQUAL 0)
    fail("pkg-config does not find ${PC_NAME} in ${PREFIX}/share/pkgconfig")
  endif()
  execute_process(COMMAND make -C "${src}" my_trainer SPILLWAY_PC=${PC_NAME} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    fail("make failed (${rc})")
  endif()
  set(program "${src}/my_trainer")
else()
  # 2. Configure.
  set(configure_args -S "${src}" -B "${build}" -DCMAKE_BUILD_TYPE=Release -DCONSUMER_MODE=${MODE})
  if(GENERATOR)
    list(APPEND configure_args -G "${GENERATOR}")
  endif()
  if(MODE STREQUAL "find_package")
    list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${PREFIX}")
  elseif(MODE STREQUAL "add_subdirectory")
    file(MAKE_DIRECTORY "${src}/third_party")
    file(CREATE_LINK "${SPILLWAY_SOURCE_DIR}" "${src}/third_party/spillway" SYMBOLIC)
  elseif(MODE STREQUAL "fetchcontent" AND PINNED)
    # The pin is the GIT_TAG of the snippet; it must be a commit of this repository. A
    # source tree that is no git checkout, or a shallow one without that commit, cannot
    # run the test; a full clone without it means the documented pin does not exist.
    file(READ "${SOURCE}/CMakeLists.txt" consumer_cmake)
    if(NOT consumer_cmake MATCHES "GIT_TAG ([0-9a-f]+)")
      fail("tests/consumer/CMakeLists.txt pins no commit hash (GIT_TAG <hash>)")
    endif()
    set(pin "${CMAKE_MATCH_1}")
    find_program(git NAMES git)
    execute_process(COMMAND ${git} -C "${SPILLWAY_SOURCE_DIR}" rev-parse --is-shallow-repository
                    OUTPUT_VARIABLE shallow OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(NOT git OR NOT rc EQUAL 0)
      message(FATAL_ERROR "consumer skipped: ${SPILLWAY_SOURCE_DIR} is not a git checkout (or git is missing)")
    endif()
    execute_process(COMMAND ${git} -C "${SPILLWAY_SOURCE_DIR}" cat-file -e "${pin}^{commit}" RESULT_VARIABLE rc
                    ERROR_QUIET)
    if(NOT rc EQUAL 0 AND shallow STREQUAL "true")
      message(FATAL_ERROR "consumer skipped: ${SPILLWAY_SOURCE_DIR} is a shallow clone without the pinned commit ${pin}")
    elseif(NOT rc EQUAL 0)
      fail("the documented pin ${pin} is not a commit of ${SPILLWAY_SOURCE_DIR}")
    endif()
    list(APPEND configure_args "-DSPILLWAY_GIT_REPOSITORY=file://${SPILLWAY_SOURCE_DIR}")
  elseif(MODE STREQUAL "fetchcontent")
    list(APPEND configure_args "-DFETCHCONTENT_SOURCE_DIR_SPILLWAY=${SPILLWAY_SOURCE_DIR}"
                               "-DSPILLWAY_GIT_REPOSITORY=${SPILLWAY_SOURCE_DIR}")
  endif()
  if(ARGS)
    string(REPLACE "|" ";" more "${ARGS}")
    list(APPEND configure_args ${more})
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} ${configure_args} OUTPUT_VARIABLE out ERROR_VARIABLE out
                  RESULT_VARIABLE rc)
  message("${out}")
  # CMake wraps messages: the checks see every run of spaces and newlines as one space.
  string(REGEX REPLACE "[ \n]+" " " out "${out}")
  if(NOT rc EQUAL 0 AND DEFINED SKIP_CONFIGURE_FAILURE AND out MATCHES "${SKIP_CONFIGURE_FAILURE}")
    message(FATAL_ERROR "consumer skipped: this machine cannot run it ('${SKIP_CONFIGURE_FAILURE}')")
  endif()
  if(DEFINED EXPECT_CONFIGURE_FAILURE)
    if(rc EQUAL 0)
      fail("the configure succeeded; expected it to fail with '${EXPECT_CONFIGURE_FAILURE}'")
    endif()
    if(NOT out MATCHES "${EXPECT_CONFIGURE_FAILURE}")
      fail("the configure failed without saying '${EXPECT_CONFIGURE_FAILURE}'")
    endif()
    message(STATUS "consumer (${MODE}): the configure failed as expected")
    return()
  endif()
  if(NOT rc EQUAL 0)
    fail("the configure failed (${rc})")
  endif()
  if(DEFINED EXPECT_CONFIGURE AND NOT out MATCHES "${EXPECT_CONFIGURE}")
    fail("the configure output does not say '${EXPECT_CONFIGURE}'")
  endif()
  if(DEFINED REJECT_CONFIGURE AND out MATCHES "${REJECT_CONFIGURE}")
    fail("the configure output says '${REJECT_CONFIGURE}'")
  endif()
  # 3. Build.
  execute_process(COMMAND ${CMAKE_COMMAND} --build "${build}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    fail("the build failed (${rc})")
  endif()
  set(program "${build}/my_trainer")
endif()

# 4. Run.
execute_process(COMMAND "${program}" "${WORK}/scratch" OUTPUT_VARIABLE out ERROR_VARIABLE out
                RESULT_VARIABLE rc)
message("${out}")
if(NOT rc EQUAL 0)
  fail("the program failed (${rc})")
endif()
if(DEFINED EXPECT_OUTPUT AND NOT out MATCHES "${EXPECT_OUTPUT}")
  fail("the program's output does not match '${EXPECT_OUTPUT}'")
endif()

# 5. Install the consumer and look at what came with it.
if(DEFINED INSTALL)
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${build}" --prefix "${WORK}/installed"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    fail("cmake --install of the consumer failed (${rc})")
  endif()
  if(NOT EXISTS "${WORK}/installed/bin/my_trainer")
    fail("the consumer's own program was not installed")
  endif()
  file(GLOB_RECURSE installed RELATIVE "${WORK}/installed" "${WORK}/installed/*")
  set(spillway_files "${installed}")
  list(FILTER spillway_files INCLUDE REGEX "spillway")
  list(LENGTH spillway_files count)
  if(INSTALL STREQUAL "NOTHING" AND count GREATER 0)
    list(JOIN spillway_files "\n  " shown)
    fail("the consumer's install brought ${count} files of Spillway's:\n  ${shown}")
  endif()
  if(INSTALL STREQUAL "SPILLWAY")
    foreach(expected "^include/spillway/spillway[.]hpp$" "/cmake/spillway/spillwayConfig[.]cmake$"
                     "^share/pkgconfig/spillway[.]pc$")
      set(found "${installed}")
      list(FILTER found INCLUDE REGEX "${expected}")
      if(NOT found)
        fail("SPILLWAY_INSTALL=ON, but nothing matching ${expected} was installed")
      endif()
    endforeach()
  endif()
  message(STATUS "consumer (${MODE}): installed ${count} files of Spillway's (${INSTALL} expected)")
endif()
