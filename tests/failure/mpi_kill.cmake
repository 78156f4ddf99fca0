# SPDX-License-Identifier: Apache-2.0
# ctest -P script: runs MPIEXEC -n 3 EXE [ARGS] (mpi_kill.cpp: rank 2 is killed before the exchange;
# ARGS "window": on the window path) and judges it. What is honest to assert: the library cannot keep Open MPI's runtime from ending the
# job when a process dies, so the test passes when
#   (a) both survivors printed "OK" (a coded error within the deadline: the library's property), or
#   (b) mpiexec ended by itself, within TIMEOUT_S, reporting the killed process, and no survivor
#       printed "WRONG" (the runtime ended the job before the survivors reached their deadline);
# and fails when a survivor printed WRONG (no error, a wrong code, or too late) or mpiexec had to
# be killed here (a hang) without both survivors having reported. Which of (a) and (b) held is printed.
# Arguments: MPIEXEC, NP_FLAG, EXE, FLAGS (a list), ARGS (the program's, optional), TIMEOUT_S.
execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 3 ${FLAGS} ${EXE} ${ARGS}
  TIMEOUT ${TIMEOUT_S} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}\n${err}")
message(STATUS "mpiexec result: ${rc}\n${all}")
if(all MATCHES "mpi_kill: rank [0-9]+: WRONG")
  message(FATAL_ERROR "a survivor of the killed rank got no coded error in time (see its WRONG line above)")
endif()
set(survivors 0)
foreach(r 0 1)
  if(all MATCHES "mpi_kill: rank ${r}: OK")
    math(EXPR survivors "${survivors} + 1")
  endif()
endforeach()
if(survivors EQUAL 2)
  if(NOT rc MATCHES "^[0-9]+$")
    message(STATUS "PASS (a): both survivors reported a coded error within the deadline; mpiexec did not end by itself afterwards (${rc}): MPI's teardown, not the library's wait")
  else()
    message(STATUS "PASS (a): both survivors reported a coded error within the deadline (mpiexec exit ${rc}: it reports the killed process)")
  endif()
elseif(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "HANG: mpiexec did not end within ${TIMEOUT_S} s (${rc}) and only ${survivors} of 2 survivors reported")
elseif(all MATCHES "signal 9|[Kk]illed")
  message(STATUS "PASS (b): mpiexec ended the job (exit ${rc}) when rank 2 was killed, before ${survivors} of 2 survivors reported: Open MPI's runtime, as far as it lets them run")
else()
  message(FATAL_ERROR "mpiexec ended (exit ${rc}) without reporting the killed process, and only ${survivors} of 2 survivors reported")
endif()
