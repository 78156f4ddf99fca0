# SPDX-License-Identifier: Apache-2.0
# ctest -P script: install ULYSSES_BUILD_DIR into a fresh prefix, then build the consumer as a
# make- or meson-based engine would: `c++ $(pkg-config --cflags ulysses) main.cpp $(pkg-config
# --libs ulysses)`, with PKG_CONFIG_PATH pointing at the prefix; then run it.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${ULYSSES_BUILD_DIR} --prefix ${WORK_DIR}/prefix RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
file(GLOB_RECURSE pc ${WORK_DIR}/prefix/*/ulysses.pc)
if(NOT pc)
  message(FATAL_ERROR "no ulysses.pc under ${WORK_DIR}/prefix")
endif()
get_filename_component(pcdir ${pc} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pcdir})
foreach(what cflags libs)
  execute_process(COMMAND ${PKG_CONFIG} --${what} ulysses RESULT_VARIABLE rc OUTPUT_VARIABLE ${what} ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc)
    message(FATAL_ERROR "pkg-config --${what} ulysses failed: ${err}")
  endif()
  separate_arguments(${what} UNIX_COMMAND "${${what}}")
endforeach()
message(STATUS "pkg-config: --cflags ${cflags} --libs ${libs}")
execute_process(COMMAND ${CXX_COMPILER} -std=c++17 ${cflags} ${CONSUMER_SOURCE_DIR}/main.cpp -o ${WORK_DIR}/consumer ${libs}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "compiling with pkg-config's flags failed (${rc}):\n${out}")
endif()
execute_process(COMMAND ${WORK_DIR}/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "${out}")
if(rc)
  message(FATAL_ERROR "consumer failed (${rc})")
endif()
