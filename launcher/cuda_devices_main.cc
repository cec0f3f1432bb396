// dlaunch-cuda-devices: prints how many CUDA devices this process can see
// (CUDA_VISIBLE_DEVICES honoured). No driver (libcuda.so.1 absent, or the
// toolkit's stub) and CUDA_ERROR_NO_DEVICE mean 0 devices; any other driver
// error is printed as "error: ..." with exit status 1, so a broken driver is
// never mistaken for a machine without GPUs. `dlaunch` is linked statically
// for start-up speed, and a static program cannot load the CUDA driver, so
// it asks this small dynamic one (launcher/cli.cc).
#include <dlfcn.h>

#include <cstdio>

namespace {

// From cuda.h (the driver API), which is not needed at build time.
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorStubLibrary = 34;
constexpr int kCudaErrorNoDevice = 100;

using InitFn = int (*)(unsigned);
using CountFn = int (*)(int*);
using ErrorNameFn = int (*)(int, const char**);

int fail(void* lib, const char* call, int rc) {
  const char* name = nullptr;
  auto error_name =
      reinterpret_cast<ErrorNameFn>(::dlsym(lib, "cuGetErrorName"));
  if (error_name == nullptr || error_name(rc, &name) != kCudaSuccess ||
      name == nullptr) {
    name = "unknown CUDA error";
  }
  std::printf("error: %s failed with %s (%d); check the NVIDIA driver\n", call,
              name, rc);
  return 1;
}

}  // namespace

int main() {
  // The driver API, loaded at run time: no CUDA is needed at build time.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("0\n");  // no driver installed
    return 0;
  }
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
  if (init == nullptr || count == nullptr) {
    std::printf("error: libcuda.so.1 lacks cuInit or cuDeviceGetCount\n");
    return 1;
  }
  int rc = init(0);
  if (rc == kCudaErrorNoDevice || rc == kCudaErrorStubLibrary) {
    std::printf("0\n");
    return 0;
  }
  if (rc != kCudaSuccess) return fail(lib, "cuInit", rc);
  int n = 0;
  rc = count(&n);
  if (rc != kCudaSuccess) return fail(lib, "cuDeviceGetCount", rc);
  std::printf("%d\n", n);
  return 0;
}
