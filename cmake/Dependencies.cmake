# All third-party packages, found once. scripts/setup installs every one of
# them from Debian 12's archive.
find_package(Threads REQUIRED)
# Static Boost libraries (libboost-filesystem1.81-dev ships PIC archives):
# see DLAUNCH_STATIC_RUNTIME.
set(Boost_USE_STATIC_LIBS ${DLAUNCH_STATIC_RUNTIME})
find_package(Boost 1.81.0 EXACT REQUIRED COMPONENTS filesystem CONFIG)
find_package(Gloo REQUIRED CONFIG)
find_package(yaml-cpp REQUIRED CONFIG)
# yaml-cpp's CMake config names only its shared library; a static dlaunch
# links the archive libyaml-cpp-dev ships beside it (compiled as PIE).
add_library(dlaunch_yaml_cpp INTERFACE)
if(DLAUNCH_STATIC_RUNTIME)
  find_library(DLAUNCH_YAML_CPP_ARCHIVE libyaml-cpp.a REQUIRED)
  get_target_property(_dlaunch_yaml_inc yaml-cpp INTERFACE_INCLUDE_DIRECTORIES)
  target_include_directories(dlaunch_yaml_cpp SYSTEM INTERFACE ${_dlaunch_yaml_inc})
  target_link_libraries(dlaunch_yaml_cpp INTERFACE ${DLAUNCH_YAML_CPP_ARCHIVE})
else()
  target_link_libraries(dlaunch_yaml_cpp INTERFACE yaml-cpp)
endif()
find_package(CLI11 REQUIRED CONFIG)
find_package(nlohmann_json 3.10 REQUIRED CONFIG)
find_package(fmt REQUIRED CONFIG)
find_package(spdlog REQUIRED CONFIG)
find_package(ZLIB REQUIRED)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(DLAUNCH_CBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread
  REQUIRED)
if(DLAUNCH_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
if(DLAUNCH_BUILD_BENCH)
  find_package(benchmark REQUIRED CONFIG)
endif()

# Boost.Process v2 is compiled into dlaunch::agent (see agent/CMakeLists.txt).

# NCCL: ON by default exactly when the CUDA toolkit and NCCL are both present.
find_package(CUDAToolkit QUIET)
find_path(DLAUNCH_NCCL_INCLUDE_DIR nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
find_library(DLAUNCH_NCCL_LIBRARY nccl
  HINTS ${CUDAToolkit_LIBRARY_ROOT}/lib /usr/local/cuda/lib /usr/local/cuda/lib64)
if(CUDAToolkit_FOUND AND DLAUNCH_NCCL_INCLUDE_DIR AND DLAUNCH_NCCL_LIBRARY)
  set(_dlaunch_nccl_default ON)
else()
  set(_dlaunch_nccl_default OFF)
endif()
option(DLAUNCH_WITH_NCCL "Build the NCCL (GPU) backend of comm"
  ${_dlaunch_nccl_default})
if(DLAUNCH_WITH_NCCL)
  if(NOT (CUDAToolkit_FOUND AND DLAUNCH_NCCL_INCLUDE_DIR AND DLAUNCH_NCCL_LIBRARY))
    message(FATAL_ERROR
      "DLAUNCH_WITH_NCCL=ON but the CUDA toolkit or NCCL was not found; "
      "install them under /usr/local/cuda or configure with -DDLAUNCH_WITH_NCCL=OFF")
  endif()
  add_library(dlaunch_nccl INTERFACE)
  target_include_directories(dlaunch_nccl SYSTEM INTERFACE ${DLAUNCH_NCCL_INCLUDE_DIR})
  target_link_libraries(dlaunch_nccl INTERFACE ${DLAUNCH_NCCL_LIBRARY} CUDA::cudart)
endif()
message(STATUS "dlaunch: NCCL backend ${DLAUNCH_WITH_NCCL}")

# CUDA training (dl-sgd --device cuda): nvcc for workloads/cuda/kernels.cu,
# cuBLAS, and the NCCL backend for the gradients. ON by default exactly when
# all are found; nvcc is looked for where find_package(CUDAToolkit) found it
# (/usr/local/cuda/bin need not be on PATH).
set(_dlaunch_cuda_default OFF)
if(DLAUNCH_WITH_NCCL AND TARGET CUDA::cublas)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND
     CUDAToolkit_NVCC_EXECUTABLE)
    set(ENV{CUDACXX} ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_dlaunch_cuda_default ON)
  endif()
endif()
option(DLAUNCH_WITH_CUDA "Build CUDA training (dl-sgd --device cuda)"
  ${_dlaunch_cuda_default})
if(DLAUNCH_WITH_CUDA)
  if(NOT _dlaunch_cuda_default)
    message(FATAL_ERROR
      "DLAUNCH_WITH_CUDA=ON but nvcc, cuBLAS or the NCCL backend is missing; "
      "install the CUDA toolkit and NCCL under /usr/local/cuda or configure "
      "with -DDLAUNCH_WITH_CUDA=OFF")
  endif()
  # Ampere and Hopper machine code, plus Hopper PTX that newer GPUs compile
  # at load time. Override with -DCMAKE_CUDA_ARCHITECTURES=...
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
  endif()
  enable_language(CUDA)
endif()
message(STATUS "dlaunch: CUDA training ${DLAUNCH_WITH_CUDA}")

# etcd rendezvous backend (agent/rendezvous/etcd): gRPC and protobuf
# (libgrpc++-dev, protobuf-compiler-grpc) and etcd's .proto files
# (golang-etcd-server-dev). ON by default exactly when all are present.
find_program(DLAUNCH_PROTOC protoc)
find_program(DLAUNCH_GRPC_CPP_PLUGIN grpc_cpp_plugin)
set(DLAUNCH_ETCD_PROTO_DIR /usr/share/gocode/src/go.etcd.io/etcd
  CACHE PATH "etcd 3.4's source tree with its .proto files")
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(DLAUNCH_GRPC QUIET grpc++ protobuf)
endif()
if(DLAUNCH_PROTOC AND DLAUNCH_GRPC_CPP_PLUGIN AND DLAUNCH_GRPC_FOUND AND
   EXISTS ${DLAUNCH_ETCD_PROTO_DIR}/etcdserver/etcdserverpb/rpc.proto)
  set(_dlaunch_etcd_default ON)
else()
  set(_dlaunch_etcd_default OFF)
endif()
option(DLAUNCH_WITH_ETCD "Build the etcd rendezvous backend (dlaunch-rdzv-etcd)"
  ${_dlaunch_etcd_default})
if(DLAUNCH_WITH_ETCD)
  if(NOT _dlaunch_etcd_default)
    message(FATAL_ERROR
      "DLAUNCH_WITH_ETCD=ON but protoc, grpc_cpp_plugin, grpc++ (pkg-config) "
      "or etcd's rpc.proto is missing; run scripts/setup or configure with "
      "-DDLAUNCH_WITH_ETCD=OFF")
  endif()
  # Static for the static helper: pkg-config's --static list, which the
  # linker resolves to the archives Debian ships.
  add_library(dlaunch_grpc INTERFACE)
  target_include_directories(dlaunch_grpc SYSTEM INTERFACE ${DLAUNCH_GRPC_INCLUDE_DIRS})
  if(DLAUNCH_STATIC_RUNTIME)
    target_link_libraries(dlaunch_grpc INTERFACE ${DLAUNCH_GRPC_STATIC_LDFLAGS})
  else()
    target_link_libraries(dlaunch_grpc INTERFACE ${DLAUNCH_GRPC_LDFLAGS})
  endif()
endif()
message(STATUS "dlaunch: etcd rendezvous backend ${DLAUNCH_WITH_ETCD}")
