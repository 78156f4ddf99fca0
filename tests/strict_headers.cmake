# SPDX-License-Identifier: Apache-2.0
# ctest -P script: compile SOURCE with COMPILER and ARGS (a list) and fail when the compiler fails
# or prints any diagnostic located in OUR_DIR (the library's include/ulysses). The second rule is
# for nvcc, whose preprocessed output makes the CUDA toolkit's own headers warn under strict host
# flags: there the toolkit's warnings are let through and ours are not.
execute_process(COMMAND ${COMPILER} ${ARGS} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCHALL "[^\n]*${OUR_DIR}[^\n]*(warning|error)[^\n]*" ours "${out}\n${err}")
if(NOT rc EQUAL 0 OR ours)
  list(JOIN ours "\n" ours)
  message(FATAL_ERROR "strict build failed (exit ${rc}): ${COMPILER} ${ARGS} ${SOURCE}\n${ours}\n${out}\n${err}")
endif()
message(STATUS "strict build clean: ${COMPILER} ${ARGS}")
