# SPDX-License-Identifier: Apache-2.0
#[=======================================================================[.rst:
FindNCCL
--------

Finds the NVIDIA Collective Communications Library (NCCL ships no CMake package). Looks at
``NCCL_ROOT`` / ``NCCL_HOME`` (CMake or environment variables), NCCL's pkg-config file
(``nccl.pc``), the CUDA toolkit's directories, then the system paths.

Imported target
^^^^^^^^^^^^^^^
``NCCL::NCCL``  the NCCL library (shared, or static when ``NCCL_USE_STATIC`` is ON) with its
                include directory.

Result variables
^^^^^^^^^^^^^^^^
``NCCL_FOUND``, ``NCCL_INCLUDE_DIRS``, ``NCCL_LIBRARIES``, ``NCCL_VERSION`` (``MAJOR.MINOR.PATCH``
read from ``nccl.h``), ``NCCL_VERSION_CODE`` (as in ``nccl.h``).

Cache variables: ``NCCL_INCLUDE_DIR``, ``NCCL_LIBRARY``.
#]=======================================================================]

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_NCCL QUIET nccl)
endif()

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} $ENV{NCCL_DIR})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_nccl_cuda_root ${CUDAToolkit_BIN_DIR} DIRECTORY)
  list(APPEND _nccl_hints ${_nccl_cuda_root})
endif()

if(NCCL_USE_STATIC)
  set(_nccl_names libnccl_static.a nccl_static)
else()
  set(_nccl_names nccl)
endif()
# The library first, then the header next to it (a machine may hold several copies of nccl.h).
find_library(NCCL_LIBRARY NAMES ${_nccl_names}
  HINTS ${_nccl_hints} ${PC_NCCL_LIBRARY_DIRS}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
set(_nccl_inc_hints ${_nccl_hints} ${PC_NCCL_INCLUDE_DIRS})
if(NCCL_LIBRARY)
  get_filename_component(_nccl_libdir ${NCCL_LIBRARY} DIRECTORY)
  get_filename_component(_nccl_prefix ${_nccl_libdir} DIRECTORY)
  list(PREPEND _nccl_inc_hints ${_nccl_prefix})
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_inc_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)

unset(NCCL_VERSION)
if(NCCL_INCLUDE_DIR AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH|VERSION_CODE) +[0-9]+")
  foreach(_p MAJOR MINOR PATCH VERSION_CODE)
    string(REGEX MATCH "#define NCCL_${_p} +([0-9]+)" _m "${_nccl_defs}")
    set(NCCL_${_p} ${CMAKE_MATCH_1})
  endforeach()
  if(NOT "${NCCL_MAJOR}" STREQUAL "")
    set(NCCL_VERSION ${NCCL_MAJOR}.${NCCL_MINOR}.${NCCL_PATCH})
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND)
  set(NCCL_INCLUDE_DIRS ${NCCL_INCLUDE_DIR})
  set(NCCL_LIBRARIES ${NCCL_LIBRARY})
  if(NOT TARGET NCCL::NCCL)
    add_library(NCCL::NCCL UNKNOWN IMPORTED)
    set_target_properties(NCCL::NCCL PROPERTIES
      IMPORTED_LOCATION ${NCCL_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
  endif()
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
