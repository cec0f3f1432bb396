// A stand-in libcuda.so.1 for dlaunch-cuda-devices' tests: cuInit returns
// $FAKE_CUINIT (default 0), cuDeviceGetCount reports $FAKE_CUDA_DEVICES.
#include <cstdlib>

extern "C" {

int cuInit(unsigned) {
  const char* rc = std::getenv("FAKE_CUINIT");
  return rc != nullptr ? std::atoi(rc) : 0;
}

int cuDeviceGetCount(int* n) {
  const char* count = std::getenv("FAKE_CUDA_DEVICES");
  *n = count != nullptr ? std::atoi(count) : 0;
  return 0;
}

int cuGetErrorName(int rc, const char** name) {
  *name = rc == 999 ? "CUDA_ERROR_UNKNOWN" : nullptr;
  return rc == 999 ? 0 : 1;
}

}  // extern "C"
