# SPDX-License-Identifier: Apache-2.0
# ctest -P script: (a) install ULYSSES_BUILD_DIR into a fresh prefix and build the consumer with
# find_package, or (b) build the consumer with add_subdirectory(ULYSSES_SOURCE_DIR); then run it.
# EXTRA_ARGS (a list) goes to the consumer's configure (e.g. CUDA hidden).
file(REMOVE_RECURSE ${WORK_DIR})
set(args -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G ${CMAKE_GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${EXTRA_ARGS})
if(ULYSSES_BUILD_DIR)
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${ULYSSES_BUILD_DIR} --prefix ${WORK_DIR}/prefix
    RESULT_VARIABLE rc OUTPUT_QUIET)
  if(rc)
    message(FATAL_ERROR "cmake --install failed (${rc})")
  endif()
  list(APPEND args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  # The install tree holds no forwarding header (0.2 removed them): no header of only
  # preprocessor lines and comments, except the umbrellas, which include a whole module.
  set(umbrellas ulysses.hpp torch/torch.hpp comm/mpi.hpp comm/nccl.cuh)
  file(GLOB_RECURSE installed RELATIVE ${WORK_DIR}/prefix/include/ulysses
    ${WORK_DIR}/prefix/include/ulysses/*.hpp ${WORK_DIR}/prefix/include/ulysses/*.cuh)
  if(NOT installed)
    message(FATAL_ERROR "cmake --install put no header under ${WORK_DIR}/prefix/include/ulysses")
  endif()
  foreach(h IN LISTS installed)
    file(STRINGS ${WORK_DIR}/prefix/include/ulysses/${h} code REGEX "^[ \t]*[^ \t/#]")
    list(FIND umbrellas "${h}" umbrella)
    if(NOT code AND umbrella EQUAL -1)
      message(FATAL_ERROR "the install tree has a forwarding header: include/ulysses/${h}")
    endif()
  endforeach()
else()
  list(APPEND args -DULYSSES_SOURCE_DIR=${ULYSSES_SOURCE_DIR} -DULYSSES_BUILD_TESTS=OFF
    -DULYSSES_BUILD_EXAMPLES=OFF -DULYSSES_BUILD_BENCHMARKS=OFF -DULYSSES_ENABLE_CUDA=OFF)
endif()
foreach(step "configure;${args}" "build;--build;${WORK_DIR}/build")
  list(POP_FRONT step name)
  execute_process(COMMAND ${CMAKE_COMMAND} ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc)
    message(FATAL_ERROR "consumer ${name} failed (${rc}):\n${out}")
  endif()
endforeach()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "${out}")
if(rc)
  message(FATAL_ERROR "consumer failed (${rc})")
endif()
