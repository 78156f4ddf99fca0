# SPDX-License-Identifier: Apache-2.0
# ctest -P script: a small ulysses_perf sweep to JSON, then --fit on it and --check against it.
file(MAKE_DIRECTORY "${DIR}")
execute_process(COMMAND "${PERF}" --backend local --ranks 2 --model gpt-2 --direction both -b 256 -e 2048 -f 2 -n 2 -w 1 --json "${DIR}/run.json"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ulysses_perf sweep failed: ${rc}")
endif()
execute_process(COMMAND "${PERF}" --fit "${DIR}/params.json" "${DIR}/run.json" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ulysses_perf --fit failed: ${rc}")
endif()
execute_process(COMMAND "${PERF}" --check "${DIR}/params.json" "${DIR}/run.json")  # exit 1 when a row is off by > 15%: timing, not a test
