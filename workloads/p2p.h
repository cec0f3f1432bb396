#pragma once

#include <cstddef>
#include <ostream>
#include <vector>

#include "comm/process_group.h"

namespace dlaunch::workloads {

// The seeds' blocking point-to-point example: rank 0 adds 1 to a zero
// tensor and sends it to rank 1 (send/recv); every rank writes
// "Rank R has data V" to `out`. Ranks above 1 take no part. Returns the
// value this rank holds.
float p2p_blocking(comm::ProcessGroup& pg, std::ostream& out);

// The same with isend/irecv and wait(), as the seeds' non-blocking example.
float p2p_nonblocking(comm::ProcessGroup& pg, std::ostream& out);

// One ping-pong measurement: rank 0 sends `bytes` to rank 1, which sends
// them back, `iters` times after `warmup` untimed round trips.
struct PingPongRow {
  size_t bytes = 0;
  double latency_us = 0;     // half a round trip
  double bandwidth_gbs = 0;  // bytes / latency, in GB/s (1e9 B)
  bool ok = false;           // the echoed bytes matched what was sent
};

// Ping-pong between ranks 0 and 1 for each size; other ranks only wait at
// the final barrier. Rows are meaningful on ranks 0 and 1.
std::vector<PingPongRow> ping_pong(comm::ProcessGroup& pg,
                                   const std::vector<size_t>& sizes, int iters,
                                   int warmup);

}  // namespace dlaunch::workloads
