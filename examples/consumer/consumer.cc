// All-reduces each rank's number over dlaunch's comm library: run it under
// `dlaunch --nproc-per-node N`, which sets RANK, WORLD_SIZE, MASTER_ADDR
// and MASTER_PORT. Every rank prints the sum 1 + 2 + ... + N and exits 0
// when it is right.
#include <cstdio>
#include <exception>
#include <vector>

#include "comm/init.h"

int main() {
  try {
    auto world = dlaunch::comm::init_process_group("gloo");
    const int n = world->size();
    std::vector<double> value{static_cast<double>(world->rank() + 1)};
    world->all_reduce(dlaunch::comm::Tensor::of(value));
    const double expected = n * (n + 1) / 2.0;
    std::printf("rank %d of %d: all_reduce sum %g (expected %g)\n",
                world->rank(), n, value[0], expected);
    return value[0] == expected ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
