// dlaunch-cuda-devices: prints how many CUDA devices this process can see
// (CUDA_VISIBLE_DEVICES honoured), 0 without a driver or a device. `dlaunch`
// is linked statically for start-up speed, and a static program cannot load
// the CUDA driver, so it asks this small dynamic one (launcher/cli.cc).
#include <dlfcn.h>

#include <cstdio>

int main() {
  int n = 0;
  // The driver API, loaded at run time: no CUDA is needed at build time.
  if (void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    using InitFn = int (*)(unsigned);
    using CountFn = int (*)(int*);
    auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
    auto count = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
    if (init == nullptr || count == nullptr || init(0) != 0 || count(&n) != 0) {
      n = 0;
    }
  }
  std::printf("%d\n", n);
  return 0;
}
