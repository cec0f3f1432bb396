# dlaunch_target_defaults(TARGET): C++20, warnings (and -Werror when
# DLAUNCH_WERROR) and repo-rooted includes for the project's own targets only.
function(dlaunch_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic
    $<$<BOOL:${DLAUNCH_WERROR}>:-Werror>)
  get_target_property(_type ${target} TYPE)
  if(NOT _type STREQUAL "EXECUTABLE")
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  else()
    target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
  endif()
endfunction()

# dlaunch_add_executable(NAME SOURCES... LIBS ...): a thin binary in build/bin.
function(dlaunch_add_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  dlaunch_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS})
endfunction()
