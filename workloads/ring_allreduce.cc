#include "workloads/ring_allreduce.h"

#include <algorithm>
#include <vector>

#include "comm/check.h"
#include "workloads/op_buffer.h"

namespace dlaunch::workloads {

void ring_all_reduce(comm::ProcessGroup& pg, std::span<const float> send,
                     std::span<float> recv) {
  DLAUNCH_CHECK(send.size() == recv.size(),
                "ring_all_reduce with send and recv of different sizes");
  const int rank = pg.rank(), size = pg.size();
  std::vector<float> send_buff(send.begin(), send.end());
  std::vector<float> recv_buff(send.begin(), send.end());
  std::vector<float> accum(send.begin(), send.end());
  const int left = (rank - 1 + size) % size;
  const int right = (rank + 1) % size;
  // For nccl the two buffers live on the device too; the sum stays on the
  // host.
  OpBuffer dev_send(pg, comm::Tensor::of(send_buff));
  OpBuffer dev_recv(pg, comm::Tensor::of(recv_buff));
  dev_send.upload();
  for (int i = 0; i < size - 1; ++i) {
    // Even steps pass on send_buff and receive into recv_buff; odd steps the
    // other way round, so what was just received is what goes on next.
    OpBuffer& out = i % 2 == 0 ? dev_send : dev_recv;
    OpBuffer& in = i % 2 == 0 ? dev_recv : dev_send;
    std::vector<float>& in_host = i % 2 == 0 ? recv_buff : send_buff;
    auto req = pg.isend(out.tensor(), right);
    auto got = pg.irecv(in.tensor(), left);
    got->wait(pg.timeout());
    in.download();
    for (size_t k = 0; k < accum.size(); ++k) accum[k] += in_host[k];
    req->wait(pg.timeout());
  }
  std::copy(accum.begin(), accum.end(), recv.begin());
}

}  // namespace dlaunch::workloads
