# Compiles Spillway's CUDA code with nvcc, without needing a GPU (ctest cuda.nvcc_compile,
# label cuda_compile). Each public header in spillway/cuda/ is compiled on its own (included
# twice, proving its include guard), then each source in SOURCES.
#
#   cmake -DNVCC=<nvcc> -DINCLUDE_DIRS=<dirs> -DDEFINES=<defs> -DHEADERS=<headers>
#         -DSOURCES=<.cu files> -DWORK_DIR=<scratch> -P nvcc_compile.cmake
cmake_minimum_required(VERSION 3.22)
file(MAKE_DIRECTORY "${WORK_DIR}")
set(flags -std=c++20 -x cu -c)
# Our headers compile warning-free; the test sources also pull in third-party macros
# (liburing's io_uring_for_each_cqe) that warn once nvcc has expanded them, so they are
# compiled without -Werror.
set(header_flags --Werror all-warnings -Xcompiler=-Wall,-Wextra)
foreach(dir IN LISTS INCLUDE_DIRS)
  list(APPEND flags "-I${dir}")
endforeach()
foreach(def IN LISTS DEFINES)
  list(APPEND flags "-D${def}")
endforeach()

set(units "")
set(header_units "")
foreach(header IN LISTS HEADERS)
  string(MAKE_C_IDENTIFIER "${header}" id)
  set(tu "${WORK_DIR}/${id}.cu")
  file(WRITE "${tu}" "#include <${header}>\n#include <${header}>\n")
  list(APPEND units "${tu}")
  list(APPEND header_units "${tu}")
endforeach()
list(APPEND units ${SOURCES})

set(failed "")
foreach(unit IN LISTS units)
  get_filename_component(name "${unit}" NAME_WE)
  message(STATUS "nvcc: ${unit}")
  set(extra "")
  if(unit IN_LIST header_units)
    set(extra ${header_flags})
  endif()
  execute_process(COMMAND "${NVCC}" ${flags} ${extra} "${unit}" -o "${WORK_DIR}/${name}.o"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(STATUS "${out}")
    list(APPEND failed "${unit}")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "nvcc failed on: ${failed}")
endif()
message(STATUS "nvcc compiled ${units}")
