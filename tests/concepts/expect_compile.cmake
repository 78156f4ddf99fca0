# SPDX-License-Identifier: Apache-2.0
# ctest -P script: compiles SOURCE with COMPILER and ARGS twice. With -D${GOOD_DEFINE} it must
# compile; without it, it must FAIL and the compiler's output must match EXPECT (a regex): a
# compile-time check that fires for the reason it states and no other.
execute_process(COMMAND ${COMPILER} ${ARGS} -D${GOOD_DEFINE} ${SOURCE} RESULT_VARIABLE good OUTPUT_VARIABLE out1 ERROR_VARIABLE err1)
if(NOT good EQUAL 0)
  message(FATAL_ERROR "the control build (-D${GOOD_DEFINE}) failed, so the check below would prove nothing:\n${out1}\n${err1}")
endif()
execute_process(COMMAND ${COMPILER} ${ARGS} ${SOURCE} RESULT_VARIABLE bad OUTPUT_VARIABLE out2 ERROR_VARIABLE err2)
if(bad EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not: the mistake it holds was not caught")
endif()
if(NOT "${out2}${err2}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "${SOURCE} failed to compile, but not with a message matching '${EXPECT}':\n${out2}\n${err2}")
endif()
string(REGEX MATCH "[^\n]*${EXPECT}[^\n]*" line "${out2}${err2}")
message(STATUS "refused as expected: ${line}")
