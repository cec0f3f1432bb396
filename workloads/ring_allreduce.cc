#include "workloads/ring_allreduce.h"

#include <algorithm>
#include <vector>

#include "comm/check.h"

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
  for (int i = 0; i < size - 1; ++i) {
    // Even steps pass on send_buff and receive into recv_buff; odd steps the
    // other way round, so what was just received is what goes on next.
    std::vector<float>& out = i % 2 == 0 ? send_buff : recv_buff;
    std::vector<float>& in = i % 2 == 0 ? recv_buff : send_buff;
    auto req = pg.isend(comm::Tensor::of(out), right);
    pg.recv(comm::Tensor::of(in), left);
    for (size_t k = 0; k < accum.size(); ++k) accum[k] += in[k];
    req->wait(pg.timeout());
  }
  std::copy(accum.begin(), accum.end(), recv.begin());
}

}  // namespace dlaunch::workloads
