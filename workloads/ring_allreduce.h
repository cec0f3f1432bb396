#pragma once

#include <span>

#include "comm/process_group.h"

namespace dlaunch::workloads {

// The seeds' hand-made ring all-reduce: in size()-1 steps each rank isends a
// buffer to its right neighbour, receives one from its left and adds it to
// its accumulator, alternating two buffers so a send never reads a buffer
// being received into. `recv` ends as the sum of every rank's `send`. Every
// rank calls it with buffers of the same size.
void ring_all_reduce(comm::ProcessGroup& pg, std::span<const float> send,
                     std::span<float> recv);

}  // namespace dlaunch::workloads
