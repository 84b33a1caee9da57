# SPDX-License-Identifier: Apache-2.0
# Runs your_trainer in memory and offloaded (two paths, at the smallest budget it names) and
# fails unless both print the same losses and final CRC, the offloaded run's peak RSS is within
# that budget, and one byte less is refused (exit 2) naming the same figure.
# It also counts the lines of code Spillway adds (the [spillway-*] regions, comments and blank
# lines left out): docs/integration.md promises fewer than 60.
# Usage: cmake -DTRAINER=... -DSCRATCH=... [-DSANITIZED=ON] -P your_trainer_check.cmake
file(READ ${CMAKE_CURRENT_LIST_DIR}/your_trainer.cpp text)
# One list item per line: ';' and the brackets (which CMake's lists treat specially) replaced.
string(REPLACE ";" "<semicolon>" text "${text}")
string(REPLACE "[" "<open>" text "${text}")
string(REPLACE "]" "<close>" text "${text}")
string(REPLACE "\n" ";" source "${text}")
set(inside FALSE)
set(added 0)
foreach(line IN LISTS source)
  if(line MATCHES "// <open>spillway-[a-z]+-begin<close>")
    set(inside TRUE)
  elseif(line MATCHES "// <open>spillway-[a-z]+-end<close>")
    set(inside FALSE)
  elseif(inside AND NOT line MATCHES "^[ ]*(//.*)?$")
    math(EXPR added "${added} + 1")
  endif()
endforeach()
message(STATUS "your_trainer.cpp: ${added} lines of code in its [spillway-*] regions")
if(added EQUAL 0 OR added GREATER_EQUAL 60)
  message(FATAL_ERROR "your_trainer.cpp adds ${added} lines for Spillway; the guide promises fewer than 60")
endif()
set(model --layers 6 --width 96 --batch 24 --steps 5)
file(REMOVE_RECURSE ${SCRATCH})
file(MAKE_DIRECTORY ${SCRATCH}/a ${SCRATCH}/b)

function(run out_var rc_var)
  execute_process(COMMAND ${TRAINER} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message(STATUS "your_trainer ${ARGN}: exit ${rc}\n${out}${err}")
  set(${out_var} "${out}${err}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

# The lines two runs must share: each step's loss and the final params' CRC.
function(results text out_var)
  string(REGEX MATCHALL "step [0-9]+ loss [^\n]*|params crc32c [0-9a-f]+" lines "${text}")
  set(${out_var} "${lines}" PARENT_SCOPE)
endfunction()

run(memory rc ${model} --offload none)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the in-memory run failed")
endif()
# The smallest budget the plan names (a pure function of the model and a fixed process
# allowance, so every identical run names it): asked with a budget of one byte.
run(refused rc ${model} --offload all --memory-budget 1 --path ${SCRATCH}/a --path ${SCRATCH}/b)
string(REGEX MATCH "the smallest budget that works is ([0-9]+) bytes" _ "${refused}")
set(smallest ${CMAKE_MATCH_1})
if(NOT rc EQUAL 2 OR NOT smallest)
  message(FATAL_ERROR "a budget of one byte was not refused naming the smallest that works")
endif()
# At exactly that budget the offloaded run trains, with the in-memory run's bits, within it.
run(offloaded rc ${model} --offload all --memory-budget ${smallest} --path ${SCRATCH}/a
    --path ${SCRATCH}/b)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the offloaded run at the smallest budget it names failed")
endif()
results("${memory}" want)
results("${offloaded}" got)
list(LENGTH want n)
if(n LESS 6 OR NOT want STREQUAL got)
  message(FATAL_ERROR "offloaded and in-memory runs differ:\n${want}\n--\n${got}")
endif()
string(REGEX MATCH "peak RSS ([0-9]+) bytes of the budget ([0-9]+)" _ "${offloaded}")
if(NOT CMAKE_MATCH_1 OR NOT CMAKE_MATCH_2 EQUAL smallest OR CMAKE_MATCH_1 GREATER CMAKE_MATCH_2)
  message(FATAL_ERROR "the offloaded run's peak RSS is over its budget (or not printed)")
endif()
# One byte less is refused, naming the same figure. (Not under a sanitizer: its shadow memory
# puts the process's peak above the fixed allowance, so the baseline is measured and moves
# between runs, as plan/process_baseline.hpp says.)
if(SANITIZED)
  file(REMOVE_RECURSE ${SCRATCH})
  return()
endif()
math(EXPR below "${smallest} - 1")
run(refused rc ${model} --offload all --memory-budget ${below} --path ${SCRATCH}/a)
if(NOT rc EQUAL 2 OR NOT refused MATCHES "is ${smallest} bytes")
  message(FATAL_ERROR "a budget of ${below} bytes was not refused naming ${smallest}")
endif()
file(REMOVE_RECURSE ${SCRATCH})
