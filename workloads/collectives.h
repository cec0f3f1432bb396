#pragma once

#include <ostream>

#include "comm/process_group.h"

namespace dlaunch::workloads {

// dl-collectives: every collective (broadcast, reduce, all_reduce with every
// ReduceOp that applies, scatter, gather, all_gather, reduce_scatter,
// all_to_all, barrier) over the world group and over the seeds' sub-group
// {0, 1}, each checked against the expected values. Every rank writes what it
// holds to `out`; rank 0 also writes one "PASS"/"FAIL" line per operation
// (failures counted over all ranks). Returns the number of failed
// operations, the same on every rank.
int run_collectives(comm::ProcessGroup& world, std::ostream& out);

}  // namespace dlaunch::workloads
