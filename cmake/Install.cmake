# `cmake --install`: the programs with dlaunch(1) and dlaunch's bash
# completion (component `runtime`), and comm and the
# store for other CMake and pkg-config projects (component `dev`): headers
# under include/dlaunch/ with their repo-rooted paths ("comm/init.h"),
# static libraries, the dlaunch CMake package (dlaunch::comm,
# dlaunch::store) and dlaunch.pc. Paths follow GNUInstallDirs.
include(CMakePackageConfigHelpers)

set(DLAUNCH_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/dlaunch
  CACHE STRING "Where the dlaunch CMake package is installed")
# Benchmark helpers with generic names stay out of the user's PATH.
set(DLAUNCH_INSTALL_LIBEXECDIR ${CMAKE_INSTALL_LIBEXECDIR}/dlaunch)

# dlaunch finds dlaunch-watchdog, dlaunch-cuda-devices and dlaunch-rdzv-etcd
# beside itself (/proc/self/exe): all go to the same folder.
set(DLAUNCH_INSTALLED_PROGRAMS dlaunch dlaunch-watchdog dlaunch-cuda-devices
  dl-store dl-sgd dl-p2p dl-collectives dl-ring-allreduce dl-bench)
if(DLAUNCH_WITH_ETCD)
  list(APPEND DLAUNCH_INSTALLED_PROGRAMS dlaunch-rdzv-etcd)
endif()
if(DLAUNCH_BUILD_BENCH)
  list(APPEND DLAUNCH_INSTALLED_PROGRAMS dl-store-bench)
  install(TARGETS allreduce_bench forkexec8 launch-fail-once
    RUNTIME DESTINATION ${DLAUNCH_INSTALL_LIBEXECDIR} COMPONENT runtime)
endif()
install(TARGETS ${DLAUNCH_INSTALLED_PROGRAMS}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
# dlaunch(1) and the bash completion: launcher/CMakeLists.txt, where they
# are generated.

# The libraries, named dlaunch::comm and dlaunch::store once imported.
set_target_properties(dlaunch_comm PROPERTIES EXPORT_NAME comm)
set_target_properties(dlaunch_store PROPERTIES EXPORT_NAME store)
set(_dlaunch_exported dlaunch_comm dlaunch_store)
if(DLAUNCH_WITH_NCCL)
  set_target_properties(dlaunch_nccl PROPERTIES EXPORT_NAME nccl)
  list(APPEND _dlaunch_exported dlaunch_nccl)
endif()
install(TARGETS ${_dlaunch_exported} EXPORT dlaunchTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/comm/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dlaunch/comm COMPONENT dev
  FILES_MATCHING PATTERN "*.h"
  # Implementation details shared by a path's .cc files: no installed
  # header includes them, and the store's pulls in Boost.Asio.
  PATTERN "*_internal.h" EXCLUDE)
install(EXPORT dlaunchTargets NAMESPACE dlaunch::
  DESTINATION ${DLAUNCH_INSTALL_CMAKEDIR} COMPONENT dev)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dlaunchConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dlaunchConfig.cmake
  INSTALL_DESTINATION ${DLAUNCH_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dlaunchConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dlaunchConfig.cmake
  ${PROJECT_BINARY_DIR}/dlaunchConfigVersion.cmake
  DESTINATION ${DLAUNCH_INSTALL_CMAKEDIR} COMPONENT dev)

# pkg-config: `pkg-config --cflags --libs dlaunch` (comm and the store;
# both static, so Gloo and threads come with the link line).
# The prefix is found relative to the .pc file, so that `cmake --install
# --prefix DIR` anywhere gives a working file.
file(RELATIVE_PATH DLAUNCH_PC_PREFIX_FROM_PCDIR
  ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" DLAUNCH_PC_PREFIX_FROM_PCDIR
  "${DLAUNCH_PC_PREFIX_FROM_PCDIR}")
file(RELATIVE_PATH DLAUNCH_PC_INCLUDEDIR
  ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_INCLUDEDIR})
file(RELATIVE_PATH DLAUNCH_PC_LIBDIR
  ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_LIBDIR})
# With the nccl backend, comm's static library needs NCCL and the CUDA
# runtime at link time.
set(DLAUNCH_PC_EXTRA_LIBS "")
if(DLAUNCH_WITH_NCCL)
  get_filename_component(_dlaunch_nccl_dir "${DLAUNCH_NCCL_LIBRARY}" DIRECTORY)
  set(DLAUNCH_PC_EXTRA_LIBS
    " -L${_dlaunch_nccl_dir} -L${CUDAToolkit_LIBRARY_DIR} -lnccl -lcudart")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/dlaunch.pc.in
  ${PROJECT_BINARY_DIR}/dlaunch.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/dlaunch.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
