# All third-party packages, found once. scripts/setup installs every one of
# them from Debian 12's archive.

# dlaunch_found_option(NAME DOC NEEDS VAR... FIX TEXT): an option for an
# optional backend, ON by default exactly when every VAR is true (found).
# NAME=ON without them stops the configure with a message naming the VARs
# that are false, then TEXT (how to get them) and how to turn NAME off.
function(dlaunch_found_option name doc)
  cmake_parse_arguments(PARSE_ARGV 2 ARG "" "FIX" "NEEDS")
  set(missing "")
  foreach(var IN LISTS ARG_NEEDS)
    if(NOT ${var})
      list(APPEND missing ${var})
    endif()
  endforeach()
  if(missing)
    set(found OFF)
  else()
    set(found ON)
  endif()
  option(${name} "${doc}" ${found})
  if(${name} AND NOT found)
    list(JOIN missing ", " missing)
    message(FATAL_ERROR "${name}=ON but these are false (not found): "
      "${missing}; ${ARG_FIX}, or configure with -D${name}=OFF")
  endif()
endfunction()

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
dlaunch_found_option(DLAUNCH_WITH_NCCL "Build the NCCL (GPU) backend of comm"
  NEEDS CUDAToolkit_FOUND DLAUNCH_NCCL_INCLUDE_DIR DLAUNCH_NCCL_LIBRARY
  FIX "install the CUDA toolkit and NCCL under /usr/local/cuda")
if(DLAUNCH_WITH_NCCL)
  add_library(dlaunch_nccl INTERFACE)
  target_include_directories(dlaunch_nccl SYSTEM INTERFACE ${DLAUNCH_NCCL_INCLUDE_DIR})
  target_link_libraries(dlaunch_nccl INTERFACE ${DLAUNCH_NCCL_LIBRARY} CUDA::cudart)
endif()
message(STATUS "dlaunch: NCCL backend ${DLAUNCH_WITH_NCCL}")

# CUDA training (dl-sgd --device cuda): nvcc for workloads/cuda/kernels.cu,
# cuBLAS, and the NCCL backend for the gradients. ON by default exactly when
# all are found; nvcc is looked for where find_package(CUDAToolkit) found it
# (/usr/local/cuda/bin need not be on PATH).
set(DLAUNCH_CUBLAS_FOUND OFF)
if(TARGET CUDA::cublas)
  set(DLAUNCH_CUBLAS_FOUND ON)
endif()
if(DLAUNCH_WITH_NCCL AND DLAUNCH_CUBLAS_FOUND)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND
     CUDAToolkit_NVCC_EXECUTABLE)
    set(ENV{CUDACXX} ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  include(CheckLanguage)
  check_language(CUDA)
endif()
dlaunch_found_option(DLAUNCH_WITH_CUDA "Build CUDA training (dl-sgd --device cuda)"
  NEEDS DLAUNCH_WITH_NCCL DLAUNCH_CUBLAS_FOUND CMAKE_CUDA_COMPILER
  FIX "install the CUDA toolkit (nvcc, cuBLAS) and NCCL under /usr/local/cuda")
if(DLAUNCH_WITH_CUDA)
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
  pkg_check_modules(DLAUNCH_GRPC QUIET grpc++ protobuf-lite)
endif()
set(DLAUNCH_ETCD_RPC_PROTO_FOUND OFF)
if(EXISTS ${DLAUNCH_ETCD_PROTO_DIR}/etcdserver/etcdserverpb/rpc.proto)
  set(DLAUNCH_ETCD_RPC_PROTO_FOUND ON)
endif()
dlaunch_found_option(DLAUNCH_WITH_ETCD
  "Build the etcd rendezvous backend (dlaunch-rdzv-etcd)"
  NEEDS DLAUNCH_PROTOC DLAUNCH_GRPC_CPP_PLUGIN DLAUNCH_GRPC_FOUND
        DLAUNCH_ETCD_RPC_PROTO_FOUND
  FIX "run scripts/setup (protobuf-compiler-grpc, libgrpc++-dev, golang-etcd-server-dev)")
if(DLAUNCH_WITH_ETCD)
  # Static for the static helper: pkg-config's --static list, which the
  # linker resolves to the archives Debian ships.
  # etcd's messages are generated for protobuf-lite (strip_proto.cmake):
  # no descriptors or reflection to build at every helper's start.
  add_library(dlaunch_grpc INTERFACE)
  target_include_directories(dlaunch_grpc SYSTEM INTERFACE ${DLAUNCH_GRPC_INCLUDE_DIRS})
  target_compile_definitions(dlaunch_grpc INTERFACE GRPC_USE_PROTO_LITE)
  if(DLAUNCH_STATIC_RUNTIME)
    target_link_libraries(dlaunch_grpc INTERFACE ${DLAUNCH_GRPC_STATIC_LDFLAGS})
  else()
    target_link_libraries(dlaunch_grpc INTERFACE ${DLAUNCH_GRPC_LDFLAGS})
  endif()
endif()
message(STATUS "dlaunch: etcd rendezvous backend ${DLAUNCH_WITH_ETCD}")
