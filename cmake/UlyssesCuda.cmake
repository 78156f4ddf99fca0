# SPDX-License-Identifier: Apache-2.0
# CUDA and NCCL parts of ulysses, included by the top-level CMakeLists.txt. Optional: whatever is
# missing is skipped with one STATUS line, configure never fails.
#   ulysses::cuda  (ulysses_cuda, INTERFACE): ulysses + CUDA::cudart; cuda/executor.cuh,
#                  comm/local_device.cuh. Consumers compile .cu sources with their CUDA compiler.
#   ulysses::nccl  (ulysses_nccl, INTERFACE): ulysses::cuda + NCCL::NCCL; comm/nccl.cuh.
# Sets ULYSSES_HAS_CUDA / ULYSSES_HAS_NCCL (used by ulyssesConfig.cmake).
set(ULYSSES_HAS_CUDA OFF)
set(ULYSSES_HAS_NCCL OFF)

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "ulysses: no CUDA compiler found: ulysses::cuda, ulysses::nccl, CUDA tests and benchmarks skipped")
  return()
endif()
# The GPU check targets sm_90 (H100/H200); one architecture keeps CI compile times short.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
if(NOT DEFINED CMAKE_CUDA_STANDARD)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
endif()
enable_language(CUDA)
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  message(STATUS "ulysses: CUDA toolkit not found: ulysses::cuda, ulysses::nccl skipped")
  return()
endif()

add_library(ulysses_cuda INTERFACE)
add_library(ulysses::cuda ALIAS ulysses_cuda)
set_target_properties(ulysses_cuda PROPERTIES EXPORT_NAME cuda)
target_link_libraries(ulysses_cuda INTERFACE ulysses CUDA::cudart)
list(APPEND ULYSSES_EXPORTED_TARGETS ulysses_cuda)
set(ULYSSES_HAS_CUDA ON)
message(STATUS "ulysses: CUDA ${CUDAToolkit_VERSION} found (architectures ${CMAKE_CUDA_ARCHITECTURES}): ulysses::cuda")

find_package(NCCL QUIET)
if(NCCL_FOUND)
  add_library(ulysses_nccl INTERFACE)
  add_library(ulysses::nccl ALIAS ulysses_nccl)
  set_target_properties(ulysses_nccl PROPERTIES EXPORT_NAME nccl)
  # dlsym/dladdr: optional NCCL functions (ncclCommRevoke, the window API) are resolved at run time.
  target_link_libraries(ulysses_nccl INTERFACE ulysses_cuda NCCL::NCCL ${CMAKE_DL_LIBS})
  list(APPEND ULYSSES_EXPORTED_TARGETS ulysses_nccl)
  set(ULYSSES_HAS_NCCL ON)
  message(STATUS "ulysses: NCCL ${NCCL_VERSION} found (${NCCL_LIBRARY}): ulysses::nccl")
else()
  message(STATUS "ulysses: NCCL not found (set NCCL_ROOT): ulysses::nccl and NCCL tests skipped")
endif()
