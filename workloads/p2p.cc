#include "workloads/p2p.h"

#include <chrono>
#include <cstdint>
#include <sstream>

#include "comm/gloo/process_group.h"
#include "workloads/op_buffer.h"

namespace dlaunch::workloads {
namespace {

// "blocking: rank 1 has data 1", with the path ranks 0 and 1 took on gloo
// (" (path shm-p2p)").
void report(comm::ProcessGroup& pg, const char* what, float v,
            std::ostream& out) {
  std::ostringstream line;
  line << what << " rank " << pg.rank() << " has data " << v;
  const std::string path = comm::gloo::last_path(pg);
  if (pg.rank() <= 1 && !path.empty()) line << " (path " << path << ")";
  line << "\n";
  out << line.str() << std::flush;
}

}  // namespace

float p2p_blocking(comm::ProcessGroup& pg, std::ostream& out) {
  std::vector<float> tensor = {0.0f};
  OpBuffer buf(pg, comm::Tensor::of(tensor));
  if (pg.rank() == 0) {
    tensor[0] += 1;
    buf.upload();
    pg.send(buf.tensor(), 1);
  } else if (pg.rank() == 1) {
    pg.recv(buf.tensor(), 0);
    buf.download();
  }
  report(pg, "blocking:", tensor[0], out);
  return tensor[0];
}

float p2p_nonblocking(comm::ProcessGroup& pg, std::ostream& out) {
  std::vector<float> tensor = {0.0f};
  OpBuffer buf(pg, comm::Tensor::of(tensor));
  std::unique_ptr<comm::Work> req;
  if (pg.rank() == 0) {
    tensor[0] += 1;
    buf.upload();
    req = pg.isend(buf.tensor(), 1);
    out << "non-blocking: rank 0 started sending\n" << std::flush;
  } else if (pg.rank() == 1) {
    req = pg.irecv(buf.tensor(), 0);
    out << "non-blocking: rank 1 started receiving\n" << std::flush;
  }
  if (req) req->wait(pg.timeout());
  if (pg.rank() == 1) buf.download();
  report(pg, "non-blocking:", tensor[0], out);
  return tensor[0];
}

std::vector<PingPongRow> ping_pong(comm::ProcessGroup& pg,
                                   const std::vector<size_t>& sizes, int iters,
                                   int warmup) {
  std::vector<PingPongRow> rows;
  const int rank = pg.rank();
  for (size_t bytes : sizes) {
    PingPongRow row;
    row.bytes = bytes;
    if (rank <= 1) {
      std::vector<uint8_t> buf(bytes), echo(bytes);
      for (size_t i = 0; i < bytes; ++i)
        buf[i] = static_cast<uint8_t>(i * 31 + 7);
      OpBuffer send_buf(pg, comm::Tensor::of(buf));
      OpBuffer back_buf(pg, comm::Tensor::of(echo));
      send_buf.upload();
      comm::Tensor send = send_buf.tensor();
      comm::Tensor back = back_buf.tensor();
      auto round = [&] {
        if (rank == 0) {
          pg.send(send, 1);
          pg.recv(back, 1);
        } else {
          pg.recv(back, 0);
          pg.send(back, 0);
        }
      };
      for (int i = 0; i < warmup; ++i) round();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) round();
      double us = std::chrono::duration<double, std::micro>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
      row.latency_us = us / std::max(iters, 1) / 2;
      row.bandwidth_gbs =
          row.latency_us > 0 ? static_cast<double>(bytes) / 1e3 / row.latency_us
                             : 0;
      back_buf.download();
      row.ok = echo == buf;
    }
    rows.push_back(row);
  }
  pg.barrier();
  return rows;
}

}  // namespace dlaunch::workloads
