// A worker for the multi-process comm tests: joins the world with
// init_process_group (env:// by default, or the init method in argv[2] with
// RANK / WORLD_SIZE from the environment) and runs one scenario.
//
//   comm_test_worker collectives [INIT]     every collective once, checked
//   comm_test_worker allreduce-loop [INIT]  all_reduce until an error
//   comm_test_worker concurrent-groups [INIT]  sub-groups made on 2 threads
//   comm_test_worker big-allreduce [INIT]   one 4 MiB all_reduce, checked
//   comm_test_worker p2p-from-last [INIT]   the last rank sends 64 MiB to
//                                           every other rank (once a line
//                                           comes from $DLT_SEND_GATE, if set)
//   comm_test_worker op-loop OP BYTES       collective OP on BYTES until an
//                                           error ("rank R ready" after one)
//   comm_test_worker allreduce-until-stopped  all_reduce until an error, then
//                                           silent until SIGTERM (exit 143)
//
// Exit 0 on success, 1 on a wrong result, 3 on a CommError (printed).
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/process_group.h"
#include "comm/init.h"

namespace {

using dlaunch::comm::CommError;
using dlaunch::comm::InitOptions;
using dlaunch::comm::ProcessGroup;
using dlaunch::comm::ReduceOp;
using dlaunch::comm::Tensor;

int g_rank = -1;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: WRONG RESULT: %s\n", g_rank, what.c_str());
    std::exit(1);
  }
}

void collectives(ProcessGroup& pg) {
  const int r = pg.rank();
  const int n = pg.size();
  const double rank_sum = n * (n - 1) / 2.0;

  std::vector<float> f(1000, static_cast<float>(r));
  pg.all_reduce(Tensor::of(f));
  check(f[999] == static_cast<float>(rank_sum), "all_reduce sum");

  std::vector<int32_t> bits{1 << r};
  pg.all_reduce(Tensor::of(bits), ReduceOp::kBor);
  check(bits[0] == (1 << n) - 1, "all_reduce bor");

  std::vector<double> avg{static_cast<double>(r)};
  pg.all_reduce(Tensor::of(avg), ReduceOp::kAvg);
  check(avg[0] == rank_sum / n, "all_reduce avg");

  std::vector<int64_t> b{r == n - 1 ? 77 : 0};
  pg.broadcast(Tensor::of(b), n - 1);
  check(b[0] == 77, "broadcast");

  std::vector<int64_t> red{r + 1};
  pg.reduce(Tensor::of(red), 0, ReduceOp::kProduct);
  int64_t fact = 1;
  for (int i = 1; i <= n; ++i) fact *= i;
  check(r != 0 || red[0] == fact, "reduce prod");

  std::vector<std::vector<int32_t>> parts(n, std::vector<int32_t>(3));
  std::vector<Tensor> part_views;
  for (int i = 0; i < n; ++i) {
    parts[i] = {i, i * 10, i * 100};
    part_views.push_back(Tensor::of(parts[i]));
  }
  std::vector<int32_t> mine(3);
  pg.scatter(Tensor::of(mine), part_views, 0);
  check(mine[2] == r * 100, "scatter");

  std::vector<std::vector<int32_t>> gathered(n, std::vector<int32_t>(3));
  std::vector<Tensor> gathered_views;
  for (auto& g : gathered) gathered_views.push_back(Tensor::of(g));
  pg.gather(Tensor::of(mine), gathered_views, n - 1);
  check(r != n - 1 || gathered[n - 1][1] == (n - 1) * 10, "gather");

  for (auto& g : gathered) g.assign(3, -1);
  pg.all_gather(gathered_views, Tensor::of(mine));
  for (int i = 0; i < n; ++i) check(gathered[i][0] == i, "all_gather");

  std::vector<std::vector<float>> rs_in(n, std::vector<float>(2));
  std::vector<Tensor> rs_views;
  for (int i = 0; i < n; ++i) {
    rs_in[i] = {static_cast<float>(i), 1.0f};
    rs_views.push_back(Tensor::of(rs_in[i]));
  }
  std::vector<float> rs_out(2);
  pg.reduce_scatter(Tensor::of(rs_out), rs_views);
  check(rs_out[0] == static_cast<float>(r * n) && rs_out[1] == n,
        "reduce_scatter");

  std::vector<std::vector<int64_t>> a2a_in(n, std::vector<int64_t>(1));
  std::vector<std::vector<int64_t>> a2a_out(n, std::vector<int64_t>(1));
  std::vector<Tensor> in_views, out_views;
  for (int i = 0; i < n; ++i) {
    a2a_in[i][0] = r * 1000 + i;
    in_views.push_back(Tensor::of(a2a_in[i]));
    out_views.push_back(Tensor::of(a2a_out[i]));
  }
  pg.all_to_all(out_views, in_views);
  for (int i = 0; i < n; ++i)
    check(a2a_out[i][0] == i * 1000 + r, "all_to_all");

  pg.barrier();

  if (n > 1) {
    std::vector<int32_t> token{r}, got{-1};
    auto s = pg.isend(Tensor::of(token), (r + 1) % n);
    auto q = pg.irecv(Tensor::of(got), (r - 1 + n) % n);
    s->wait(pg.timeout());
    q->wait(pg.timeout());
    check(got[0] == (r - 1 + n) % n, "isend/irecv ring");
  }

  std::vector<int> evens;
  for (int i = 0; i < n; i += 2) evens.push_back(i);
  auto sub = pg.new_group(evens);
  if (sub) {
    std::vector<int32_t> v{r};
    sub->all_reduce(Tensor::of(v));
    int want = 0;
    for (int e : evens) want += e;
    check(v[0] == want, "new_group all_reduce");
  }
  std::printf("rank %d of %d: all collectives ok\n", r, n);
}

// Two threads each create a sub-group of a different parent at the same
// time and all_reduce on it. Even ranks start with parent `a`, odd ranks
// with `b`, so each rank's first rendezvous waits for a peer that is busy
// with the other one: a rendezvous holding a per-process store lock while it
// waits would deadlock here.
void concurrent_groups(ProcessGroup& world) {
  std::vector<int> all(world.size());
  for (int i = 0; i < world.size(); ++i) all[i] = i;
  auto a = world.new_group(all);
  auto b = world.new_group(all);
  int64_t got[2] = {0, 0};
  std::exception_ptr err[2];
  auto body = [&](ProcessGroup* parent, int which, bool late) {
    try {
      if (late) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      for (int round = 0; round < 3; ++round) {
        auto g = parent->new_group(all);
        std::vector<int64_t> v{world.rank() + 1};
        g->all_reduce(Tensor::of(v));
        got[which] = v[0];
      }
    } catch (...) {
      err[which] = std::current_exception();
    }
  };
  const bool even = world.rank() % 2 == 0;
  std::thread t1(body, a.get(), 0, !even);
  std::thread t2(body, b.get(), 1, even);
  t1.join();
  t2.join();
  for (auto& e : err) {
    if (e) std::rethrow_exception(e);
  }
  const int64_t want = world.size() * (world.size() + 1) / 2;
  check(got[0] == want && got[1] == want, "concurrent sub-groups");
  std::printf("rank %d of %d: concurrent groups ok\n", world.rank(),
              world.size());
}

// A 4 MiB all_reduce (the shared-memory path between local ranks), checked.
void big_allreduce(ProcessGroup& pg) {
  std::vector<float> v(1 << 20);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(i % 1000 + pg.rank());
  }
  pg.all_reduce(Tensor::of(v));
  const int n = pg.size();
  for (size_t i = 0; i < v.size(); i += 4097) {
    check(v[i] == static_cast<float>(n * (i % 1000) + n * (n - 1) / 2),
          "big all_reduce");
  }
  std::printf("rank %d of %d: big all_reduce ok (%s)\n", pg.rank(), n,
              dlaunch::comm::gloo::last_path(pg).c_str());
}

// The last rank isends 64 MiB to every other rank, which irecv it; each
// prints "rank R waiting (PATH)" (receivers) or "rank R sending (PATH)" once
// its operations are posted, then waits on them.
void p2p_from_last(ProcessGroup& pg) {
  const int last = pg.size() - 1;
  std::vector<uint8_t> v(64 << 20, static_cast<uint8_t>(pg.rank()));
  std::vector<std::unique_ptr<dlaunch::comm::Work>> works;
  if (pg.rank() == last) {
    // The test may hold the sends until the receivers are stopped (a FIFO
    // it writes one line to): posted earlier, a receiver still running
    // could take its whole payload first.
    if (const char* gate = std::getenv("DLT_SEND_GATE")) {
      std::ifstream in(gate);
      std::string line;
      std::getline(in, line);
    }
    for (int j = 0; j < last; ++j) works.push_back(pg.isend(Tensor::of(v), j));
  } else {
    works.push_back(pg.irecv(Tensor::of(v), last));
  }
  std::printf("rank %d %s (%s)\n", pg.rank(),
              pg.rank() == last ? "sending" : "waiting",
              dlaunch::comm::gloo::last_path(pg).c_str());
  std::fflush(stdout);
  for (auto& w : works) w->wait(pg.timeout());
  check(pg.rank() == last || v[12345] == static_cast<uint8_t>(last),
        "p2p payload");
  std::printf("rank %d: p2p ok\n", pg.rank());
}

int allreduce_loop(ProcessGroup& pg) {
  std::vector<float> v(1 << 20, 1.0f);
  pg.all_reduce(Tensor::of(v));
  std::printf("rank %d ready\n", pg.rank());
  std::fflush(stdout);
  auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 1000000; ++i) pg.all_reduce(Tensor::of(v));
  } catch (const CommError& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    std::fprintf(stderr, "rank %d failed after %lld ms: %s\n", pg.rank(),
                 static_cast<long long>(ms), e.what());
    return 3;
  }
  return 0;
}

sigset_t sigterm_set() {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  return term;
}

// all_reduce until it fails; then, printing nothing, waits for SIGTERM
// (blocked in every thread since main started, so held pending) and exits
// 143: a worker its agent stops before it could print its error, as when a
// peer that failed first made the agent end the group. Whatever tells the
// failure must come from comm.
[[noreturn]] void allreduce_until_stopped(ProcessGroup& pg) {
  std::vector<float> v(256, 1.0f);
  try {
    for (;;) pg.all_reduce(Tensor::of(v));
  } catch (const CommError&) {
  }
  const sigset_t term = sigterm_set();
  int sig = 0;
  sigwait(&term, &sig);
  std::_Exit(128 + SIGTERM);
}

// Runs collective `op` on f32 tensors of `bytes` until it fails.
int op_loop(ProcessGroup& pg, const std::string& op, size_t bytes) {
  const int n = pg.size();
  std::vector<std::vector<float>> bufs(n + 1,
                                       std::vector<float>(bytes / 4, 1.0f));
  std::vector<Tensor> list;
  for (int j = 0; j < n; ++j) list.push_back(Tensor::of(bufs[j]));
  Tensor t = Tensor::of(bufs[n]);
  auto once = [&] {
    if (op == "broadcast") return pg.broadcast(t, 0);
    if (op == "reduce") return pg.reduce(t, 0);
    if (op == "all_reduce") return pg.all_reduce(t);
    if (op == "scatter") return pg.scatter(t, list, 0);
    if (op == "gather") return pg.gather(t, list, 0);
    if (op == "all_gather") return pg.all_gather(list, t);
    if (op == "reduce_scatter") return pg.reduce_scatter(t, list);
    if (op == "all_to_all") return pg.all_to_all(list, list);
    if (op == "barrier") return pg.barrier();
    std::fprintf(stderr, "unknown op '%s'\n", op.c_str());
    std::exit(2);
  };
  once();
  std::printf("rank %d ready\n", pg.rank());
  std::fflush(stdout);
  try {
    for (int i = 0; i < 100000000; ++i) once();
  } catch (const CommError& e) {
    std::fprintf(stderr, "rank %d failed: %s\n", pg.rank(), e.what());
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: comm_test_worker collectives|allreduce-loop "
                 "[INIT_METHOD]\n");
    return 2;
  }
  const std::string mode = argv[1];
  // Test hook: a file-size limit makes this rank's shared-memory segments
  // impossible (ftruncate fails with EFBIG), as a full /dev/shm would.
  // With COMM_TEST_FSIZE_KILLS=1 SIGXFSZ keeps its default action: the rank
  // dies inside its first segment's ftruncate, the name made, not unlinked.
  if (const char* limit = std::getenv("COMM_TEST_FSIZE_LIMIT")) {
    const char* kills = std::getenv("COMM_TEST_FSIZE_KILLS");
    if (kills == nullptr || std::string(kills) != "1") {
      std::signal(SIGXFSZ, SIG_IGN);
    }
    struct rlimit rl {};
    rl.rlim_cur = rl.rlim_max = std::strtoull(limit, nullptr, 10);
    setrlimit(RLIMIT_FSIZE, &rl);
  }
  if (mode == "allreduce-until-stopped") {
    // Before any thread starts: threads inherit the mask.
    const sigset_t term = sigterm_set();
    pthread_sigmask(SIG_BLOCK, &term, nullptr);
  }
  InitOptions opts;
  if (argc > 2 && mode != "op-loop") {
    opts.init_method = argv[2];
    const char* rank = std::getenv("RANK");
    const char* world = std::getenv("WORLD_SIZE");
    if (!rank || !world) {
      std::fprintf(stderr, "RANK and WORLD_SIZE must be set with INIT\n");
      return 2;
    }
    opts.rank = std::atoi(rank);
    opts.world_size = std::atoi(world);
  }
  try {
    auto pg = dlaunch::comm::init_process_group("gloo", opts);
    g_rank = pg->rank();
    if (mode == "collectives") {
      collectives(*pg);
      return 0;
    }
    if (mode == "allreduce-loop") return allreduce_loop(*pg);
    if (mode == "allreduce-until-stopped") allreduce_until_stopped(*pg);
    if (mode == "op-loop" && argc == 4) {
      return op_loop(*pg, argv[2], std::strtoull(argv[3], nullptr, 10));
    }
    if (mode == "big-allreduce") {
      big_allreduce(*pg);
      return 0;
    }
    if (mode == "p2p-from-last") {
      p2p_from_last(*pg);
      return 0;
    }
    if (mode == "new-group") {
      std::vector<int> all(pg->size());
      for (int i = 0; i < pg->size(); ++i) all[i] = i;
      auto g = pg->new_group(all);
      std::printf("rank %d: new group ok\n", pg->rank());
      return 0;
    }
    if (mode == "concurrent-groups") {
      concurrent_groups(*pg);
      return 0;
    }
    std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    return 2;
  } catch (const CommError& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    return 3;
  }
}
