// dl-ring-allreduce: the seeds' ring all-reduce, checked against all_reduce.
#include <iostream>
#include <sstream>
#include <vector>

#include "comm/cli_checks.h"
#include "comm/gloo/process_group.h"
#include "workloads/op_buffer.h"
#include "workloads/ring_allreduce.h"
#include "workloads/worker.h"

int main(int argc, char** argv) {
  using namespace dlaunch::workloads;
  CLI::App app(
      "The seeds' hand-made ring all-reduce over isend/recv, checked against "
      "the library's all_reduce. Run it under dlaunch, e.g. "
      "build/bin/dlaunch --nproc-per-node 2 build/bin/dl-ring-allreduce",
      "dl-ring-allreduce");
  size_t count = 8;
  std::string backend = "gloo";
  app.add_option("--count", count, "floats per rank (default 8)")
      ->check(dlaunch::comm::whole_number<size_t>(1));
  app.add_option("--backend", backend, "gloo or nccl (default gloo)");
  return run_main(app, argc, argv, [&]() -> int {
    auto pg = init_world(backend, "dl-ring-allreduce");
    const int rank = pg->rank();
    // Small integers: every summation order gives the same float.
    std::vector<float> send(count), ring(count), ref(count);
    for (size_t i = 0; i < count; ++i) {
      send[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 5));
    }
    ring_all_reduce(*pg, send, ring);
    const std::string path = dlaunch::comm::gloo::last_path(*pg);
    ref = send;
    all_reduce_host(*pg, dlaunch::comm::Tensor::of(ref));
    std::vector<double> wrong = {ring == ref ? 0.0 : 1.0};
    std::ostringstream line;
    line << "rank " << rank << " ring all-reduce [";
    for (size_t i = 0; i < count && i < 8; ++i)
      line << (i ? ", " : "") << ring[i];
    line << (count > 8 ? ", ...]" : "]")
         << (wrong[0] == 0 ? " matches all_reduce" : " DIFFERS from all_reduce")
         << (path.empty() ? "" : " (send/recv path " + path + ")") << "\n";
    std::cout << line.str() << std::flush;
    all_reduce_host(*pg, dlaunch::comm::Tensor::of(wrong));
    if (rank == 0) {
      std::cout << (wrong[0] == 0 ? "PASS" : "FAIL") << " ring all-reduce on "
                << pg->size() << " ranks" << std::endl;
    }
    return wrong[0] == 0 ? 0 : 1;
  });
}
