# Debian packages through CPack (`scripts/package` builds them): two
# packages from the install components,
#   dlaunch      the programs (component runtime): dlaunch,
#                dlaunch-watchdog, dlaunch-cuda-devices, dl-store, the workloads, benchmarks;
#   dlaunch-dev  comm and the store for other projects (component dev):
#                headers, static libraries, CMake package, dlaunch.pc.
# Dependencies are Debian 12 package names: the shared libraries the
# programs load come from dpkg-shlibdeps, the rest is declared here.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dlaunch)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# Each package's description: its first line is the summary (no global
# CPACK_PACKAGE_DESCRIPTION_SUMMARY, which CPack would put on both).
set(CPACK_PACKAGE_CONTACT "dlaunch maintainers <dlaunch@localhost>")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME dlaunch)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# dl-sgd trains on Debian's Fashion-MNIST (workloads/idx.cc).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "dataset-fashion-mnist")
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
  "torchrun equivalent in C++: launch, watch and restart distributed workers
dlaunch starts one worker per GPU or CPU slot with torchrun's worker
environment, watches them and restarts the group on failure. This package
has the dlaunch command, dl-store and the bundled workloads (dl-sgd,
dl-collectives, dl-p2p, dl-ring-allreduce, dl-bench).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME dlaunch-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The CMake package finds Gloo (find_dependency), and comm's headers
# include Gloo's.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "dlaunch (= ${PROJECT_VERSION}), libgloo-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION
  "dlaunch's comm library for C++ programs (development files)
Headers and static libraries of comm (torch.distributed's operations over
Gloo) and its TCP store, with a CMake package (find_package(dlaunch) gives
dlaunch::comm and dlaunch::store) and a pkg-config file (dlaunch).")

include(CPack)
