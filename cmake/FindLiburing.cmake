# SPDX-License-Identifier: Apache-2.0
# FindLiburing: locates liburing (Debian: liburing-dev) and defines Liburing::liburing.
# Result variables: Liburing_FOUND, Liburing_INCLUDE_DIR, Liburing_LIBRARY, Liburing_VERSION.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_LIBURING QUIET liburing)
endif()
find_path(Liburing_INCLUDE_DIR NAMES liburing.h HINTS ${PC_LIBURING_INCLUDE_DIRS})
find_library(Liburing_LIBRARY NAMES uring HINTS ${PC_LIBURING_LIBRARY_DIRS})
set(Liburing_VERSION "${PC_LIBURING_VERSION}")
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Liburing
  REQUIRED_VARS Liburing_LIBRARY Liburing_INCLUDE_DIR
  VERSION_VAR Liburing_VERSION)
if(Liburing_FOUND AND NOT TARGET Liburing::liburing)
  add_library(Liburing::liburing UNKNOWN IMPORTED)
  set_target_properties(Liburing::liburing PROPERTIES
    IMPORTED_LOCATION "${Liburing_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Liburing_INCLUDE_DIR}")
endif()
mark_as_advanced(Liburing_INCLUDE_DIR Liburing_LIBRARY)
