include(GoogleTest)

# dlaunch_add_test(NAME SOURCES... LIBS... LABEL unit|integration|gpu
#                  [TIMEOUT seconds]): one GoogleTest binary; each of its tests
# is registered with CTest under the given label, and the binary is built by
# the target tests-LABEL (tests/CMakeLists.txt).
function(dlaunch_add_test name)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT ARG_LABEL MATCHES "^(unit|integration|gpu)$")
    message(FATAL_ERROR "dlaunch_add_test(${name}): LABEL must be unit, integration or gpu")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  dlaunch_target_defaults(${name})
  set_property(GLOBAL APPEND PROPERTY DLAUNCH_TESTS_${ARG_LABEL} ${name})
  set_target_properties(${name} PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    DLAUNCH_BIN_DIR="${PROJECT_BINARY_DIR}/bin"
    DLAUNCH_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS ${ARG_LABEL} TIMEOUT ${ARG_TIMEOUT})
endfunction()
