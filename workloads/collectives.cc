#include "workloads/collectives.h"

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "workloads/op_runner.h"

namespace dlaunch::workloads {
namespace {

using comm::DType;
using comm::ReduceOp;

struct Case {
  BenchOp op;
  DType dtype;
  ReduceOp redop;
};

// The operations checked on each group: each collective once in float, the
// reductions with every op (bitwise ones on int32, except over nccl, which
// has none), and one integer and one half-precision all-reduce.
std::vector<Case> cases(const comm::ProcessGroup& world) {
  std::vector<Case> out;
  for (ReduceOp r : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                     ReduceOp::kMax, ReduceOp::kAvg}) {
    out.push_back({BenchOp::kAllReduce, DType::kF32, r});
  }
  if (world.backend() != "nccl") {
    for (ReduceOp r : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
      out.push_back({BenchOp::kAllReduce, DType::kI32, r});
    }
  }
  out.push_back({BenchOp::kAllReduce, DType::kI64, ReduceOp::kSum});
  out.push_back({BenchOp::kAllReduce, DType::kF16, ReduceOp::kSum});
  out.push_back({BenchOp::kBroadcast, DType::kF32, ReduceOp::kSum});
  out.push_back({BenchOp::kReduce, DType::kF32, ReduceOp::kSum});
  out.push_back({BenchOp::kReduce, DType::kF32, ReduceOp::kMax});
  out.push_back({BenchOp::kScatter, DType::kF32, ReduceOp::kSum});
  out.push_back({BenchOp::kGather, DType::kF32, ReduceOp::kSum});
  out.push_back({BenchOp::kAllGather, DType::kF32, ReduceOp::kSum});
  out.push_back({BenchOp::kReduceScatter, DType::kF32, ReduceOp::kSum});
  out.push_back({BenchOp::kAllToAll, DType::kF32, ReduceOp::kSum});
  out.push_back({BenchOp::kSendRecv, DType::kF32, ReduceOp::kSum});
  return out;
}

std::string case_name(const Case& c) {
  std::string s(bench_op_name(c.op));
  if (op_reduces(c.op))
    s += "(" + std::string(comm::reduce_op_name(c.redop)) + ")";
  s += " " + std::string(comm::dtype_name(c.dtype));
  return s;
}

// Runs every case on `group` (a member's view), reporting failures over
// `world` so every world rank agrees on the verdict. Non-members pass
// group == nullptr and only join the world-wide tallies.
int check_group(comm::ProcessGroup& world, comm::ProcessGroup* group,
                const std::string& label, std::ostream& out) {
  int failed = 0;
  for (const Case& c : cases(world)) {
    if (c.op == BenchOp::kSendRecv && group && group->size() == 1) continue;
    std::vector<double> bad = {0};
    std::string held, error;
    if (group) {
      // Two elements per rank: enough to catch a swapped or shifted chunk.
      size_t count = 2 * static_cast<size_t>(group->size());
      // Rooted ops use the group's last rank as root, so root != 0 is
      // exercised too.
      int root = group->size() - 1;
      try {
        OpRunner runner(*group, c.op, count, c.dtype, c.redop, root);
        runner.fill();
        runner.run();
        bad[0] = static_cast<double>(runner.wrong());
        held = runner.describe();
      } catch (const comm::CommError& e) {
        // A failed call on one rank usually fails its peers too; count it
        // and let the world-wide tally below report it.
        bad[0] = 1;
        error = e.what();
      }
      std::ostringstream line;
      line << "rank " << world.rank() << " " << label << " " << case_name(c)
           << ": " << (error.empty() ? held : "error: " + error) << "\n";
      out << line.str() << std::flush;
    }
    all_reduce_host(world, comm::Tensor::of(bad));
    bool ok = bad[0] == 0;
    if (!ok) ++failed;
    if (world.rank() == 0) {
      out << (ok ? "PASS " : "FAIL ") << case_name(c) << " on " << label;
      if (!ok) out << " (" << bad[0] << " wrong values over all ranks)";
      out << "\n" << std::flush;
    }
  }
  // Barrier: every member leaves together.
  std::vector<double> bad = {0};
  if (group) {
    try {
      group->barrier();
    } catch (const comm::CommError& e) {
      bad[0] = 1;
      out << "rank " << world.rank() << " " << label
          << " barrier: error: " << e.what() << "\n";
    }
  }
  all_reduce_host(world, comm::Tensor::of(bad));
  if (bad[0] != 0) ++failed;
  if (world.rank() == 0) {
    out << (bad[0] == 0 ? "PASS " : "FAIL ") << "barrier on " << label << "\n"
        << std::flush;
  }
  return failed;
}

}  // namespace

int run_collectives(comm::ProcessGroup& world, std::ostream& out) {
  int failed = check_group(world, &world,
                           "world(" + std::to_string(world.size()) + ")", out);
  // The seeds' sub-group: ranks 0 and 1 (just rank 0 in a world of one).
  std::vector<int> members = {0};
  if (world.size() > 1) members.push_back(1);
  std::unique_ptr<comm::ProcessGroup> sub = world.new_group(members);
  std::string label = world.size() > 1 ? "group{0,1}" : "group{0}";
  failed += check_group(world, sub.get(), label, out);
  return failed;
}

}  // namespace dlaunch::workloads
