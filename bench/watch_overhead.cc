// watch_overhead: what hang detection's progress records cost per
// operation (docs/reliability.md). One process, a one-rank gloo group, so
// that a call is as cheap as comm gets and the record's two counter bumps
// and the decorator's extra call are what differs: 8-byte all_reduce and
// barrier, unwatched (no DLAUNCH_PROGRESS_FILE) against watched, interleaved,
// best of 7 rounds of 200000 calls each.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/init.h"
#include "comm/progress.h"
#include "comm/store/hash_store.h"

namespace {

using Clock = std::chrono::steady_clock;

double ns_per_call(dlaunch::comm::ProcessGroup& pg, bool barrier, int calls) {
  std::vector<float> v(2, 1.0f);
  auto t = dlaunch::comm::Tensor::of(v);
  auto start = Clock::now();
  for (int i = 0; i < calls; ++i) {
    if (barrier) {
      pg.barrier();
    } else {
      pg.all_reduce(t);
    }
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - start)
             .count() /
         calls;
}

std::unique_ptr<dlaunch::comm::ProcessGroup> group() {
  return dlaunch::comm::make_process_group(
      "gloo", std::make_shared<dlaunch::comm::store::HashStore>(), 0, 1,
      std::chrono::seconds(30));
}

}  // namespace

int main() {
  char path[] = "/tmp/watch-overhead-XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0 || ::ftruncate(fd, dlaunch::comm::kProgressFileSize) != 0) {
    std::perror("watch_overhead: temporary progress file");
    return 1;
  }
  ::close(fd);
  ::unsetenv("DLAUNCH_PROGRESS_FILE");
  ::unsetenv("DLAUNCH_COMM_FAULTS");
  auto plain = group();
  ::setenv("DLAUNCH_PROGRESS_FILE", path, 1);
  auto watched = group();
  ::unlink(path);
  constexpr int kCalls = 200000;
  for (bool barrier : {false, true}) {
    double best_plain = 1e30, best_watched = 1e30;
    for (int round = 0; round < 7; ++round) {
      best_plain = std::min(best_plain, ns_per_call(*plain, barrier, kCalls));
      best_watched =
          std::min(best_watched, ns_per_call(*watched, barrier, kCalls));
    }
    std::printf(
        "%-10s unwatched %8.1f ns/call  watched %8.1f ns/call  "
        "cost %+6.1f ns\n",
        barrier ? "barrier" : "all_reduce", best_plain, best_watched,
        best_watched - best_plain);
  }
  return 0;
}
