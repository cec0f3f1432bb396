# dlaunch_target_defaults(TARGET): C++20, warnings (and -Werror when
# DLAUNCH_WERROR) and repo-rooted includes for the project's own targets only.
function(dlaunch_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic
    $<$<BOOL:${DLAUNCH_WERROR}>:-Werror>)
  # GCC 12's -Wrestrict false positive (GCC PR 105651, fixed in 13): at -O3
  # (Release) `"text" + std::string&&` inlines basic_string::insert and GCC
  # reports a 2^63-byte overlapping memcpy inside libstdc++'s
  # char_traits.h. The pattern is everywhere (store, agent, workloads,
  # tests), so the warning is off for exactly that compiler and build type.
  target_compile_options(${target} PRIVATE
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>,$<CONFIG:Release>>:-Wno-restrict>)
  get_target_property(_type ${target} TYPE)
  if(NOT _type STREQUAL "EXECUTABLE")
    # Installed headers keep the repo-rooted paths under include/dlaunch/
    # ("comm/init.h"), see cmake/Install.cmake.
    target_include_directories(${target} PUBLIC
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/dlaunch>)
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
  set_property(GLOBAL APPEND PROPERTY DLAUNCH_PROGRAMS ${name})
endfunction()
