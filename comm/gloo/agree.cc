// Argument agreement: every collective first exchanges each rank's
// arguments (agree()), over Gloo messages or the shared-memory channel.

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "comm/gloo/gloo_group.h"

namespace dlaunch::comm::gloo {

void GlooProcessGroup::barrier() {
  // The argument check is an all-gather: no rank leaves before all came.
  agree("barrier", make_call(Op::kBarrier, DType::kF32, 0, -1, ReduceOp::kSum));
}

std::string GlooProcessGroup::check_tensor(const Tensor& t,
                                           std::string_view what, int index) {
  const bool on_cpu = t.device.type == DeviceType::kCpu;
  const bool known_dtype =
      static_cast<uint8_t>(t.dtype) <= static_cast<uint8_t>(DType::kI64);
  // At most 8 bytes an element: below 2^60 elements nbytes() cannot wrap.
  constexpr size_t kSurelyFits = size_t{1} << 60;
  if (on_cpu && known_dtype && t.numel < kSurelyFits &&
      (t.data != nullptr || t.numel == 0)) {
    return {};
  }
  // Built only for a bad tensor: a call that is fine formats nothing.
  std::string name(what);
  if (index >= 0) name += "[" + std::to_string(index) + "]";
  if (!known_dtype) {
    return name + " has no dtype this library knows (value " +
           std::to_string(static_cast<int>(t.dtype)) +
           "); use one of comm::DType's. ";
  }
  if (t.numel > SIZE_MAX / dtype_size(t.dtype)) {
    return name + " has " + std::to_string(t.numel) + " elements of " +
           std::string(dtype_name(t.dtype)) +
           ": more bytes than an address can span (a wrapped count?). ";
  }
  if (!on_cpu) {
    return "the gloo backend takes CPU tensors; " + name +
           " is on cuda:" + std::to_string(t.device.index) +
           " (use the nccl backend for GPU tensors). ";
  }
  if (t.data == nullptr && t.numel > 0) {
    return name + " has " + std::to_string(t.numel) +
           " elements but a null data pointer. ";
  }
  return {};
}

std::string GlooProcessGroup::check_root(int root) const {
  if (root < 0 || root >= size()) {
    return "root " + std::to_string(root) + " is out of range for " +
           g_->where() + " (valid: 0.." + std::to_string(size() - 1) + "). ";
  }
  return {};
}

std::string GlooProcessGroup::check_list(std::span<const Tensor> list,
                                         const char* what,
                                         const Tensor& like) const {
  if (list.size() != static_cast<size_t>(size())) {
    return std::string(what) + " must hold one tensor per rank (" +
           std::to_string(size()) + "), got " + std::to_string(list.size()) +
           ". ";
  }
  std::string err;
  for (size_t i = 0; i < list.size(); ++i) {
    err += check_tensor(list[i], what, static_cast<int>(i));
    if (list[i].numel != like.numel || list[i].dtype != like.dtype) {
      err += std::string(what) + "[" + std::to_string(i) + "] has " +
             describe(list[i].dtype, list[i].numel) + ", expected " +
             describe(like.dtype, like.numel) + " like this rank's tensor. ";
    }
  }
  return err;
}

// Throws if an earlier failure left the group unusable. Called first by
// every collective: a blocking one waits here for the asynchronous ones
// issued before it (no-op on the queue's thread or with none outstanding).
void GlooProcessGroup::check_usable(const char* op) {
  async_.drain(g_->timeout);
  std::lock_guard lock(g_->mu);
  if (!g_->broken.empty()) {
    throw CommError(std::string(op) + " on " + g_->where() +
                    ": the group is unusable after an earlier failure (" +
                    g_->broken + "); destroy it and create a new one");
  }
}

// Exchanges every rank's Call and throws the same CommError on every rank
// when any rank's arguments are bad or differ from rank 0's.
// With `offer`, its tensors' bytes travel with the arguments, one after
// another, when they fit fused_capacity() and this rank's arguments are
// valid (a bad tensor is never read): through the channel for every
// collective, over TCP for all_reduce's one tensor. They land at
// payload_of(j) for each peer j. offer[skip] stays behind (the channel
// only): a piece for this rank itself, which no peer reads.
void GlooProcessGroup::agree(const char* op, const Call& c,
                             std::span<const Tensor> offer, int skip) {
  check_usable(op);
  const size_t n = size();
  const size_t words = kFixedWords + 2 * n;
  // Members, so that a call allocates nothing once the group has run one.
  std::vector<uint64_t>& mine = mine_;
  mine.assign(words, 0);
  mine[0] = static_cast<uint64_t>(c.kind);
  mine[1] = static_cast<uint64_t>(c.dtype);
  mine[2] = c.numel;
  mine[3] = static_cast<uint64_t>(c.root);
  mine[4] = static_cast<uint64_t>(c.op);
  mine[5] = c.extra;
  mine[6] = c.local_error.empty() ? 0 : 1;
  for (size_t j = 0; j < c.sends.size() && j < n; ++j) {
    mine[kFixedWords + j] = c.sends[j].numel;
  }
  for (size_t j = 0; j < c.recvs.size() && j < n; ++j) {
    mine[kFixedWords + n + j] = c.recvs[j].numel;
  }
  std::vector<uint64_t>& all = agreed_;
  all.assign(words * n, 0);
  std::copy(mine.begin(), mine.end(), all.begin() + rank() * words);
  if (n > 1) {
    ensure_channel(op);  // fused_capacity() depends on it
    size_t offered = 0;
    // (A call with a bad tensor offers nothing: its nbytes() may abort.)
    for (size_t i = 0; i < offer.size() && c.local_error.empty(); ++i) {
      if (static_cast<int>(i) != skip) offered += offer[i].nbytes();
    }
    // Over TCP only an all_reduce's one tensor travels with the check.
    const bool send =
        !offer.empty() && c.local_error.empty() &&
        offered <= fused_capacity() &&
        (channel_ || (offer.size() == 1 && c.kind == Op::kAllReduce));
    if (channel_) {
      run(op, [&] {
        channel_exchange(mine, send ? offer : std::span<const Tensor>(), skip,
                         all);
      });
    } else {
      run(op,
          [&] { all_gather_words(mine, send ? offer.data() : nullptr, all); });
    }
  }
  auto word = [&](size_t r, size_t i) { return all[r * words + i]; };
  // Built only for an error: a call that agrees formats nothing.
  auto prefix = [&] { return std::string(op) + " on " + g_->where() + ": "; };
  if (!c.local_error.empty()) throw CommError(prefix() + c.local_error);
  for (size_t r = 0; r < n; ++r) {
    if (word(r, 0) != mine[0]) {
      throw CommError(prefix() + "rank " + std::to_string(r) + " called " +
                      std::string(op_name(static_cast<uint32_t>(word(r, 0)))) +
                      " while rank " + std::to_string(rank()) + " called " +
                      op +
                      "; every member must call the same collectives in "
                      "the same order");
    }
    if (word(r, 6) != 0) {
      throw CommError(prefix() + "rank " + std::to_string(r) +
                      " rejected its arguments (its error names the "
                      "problem); every rank fails this call");
    }
  }
  for (size_t r = 1; r < n; ++r) {
    auto vs = [&] { return "rank " + std::to_string(r) + " passed "; };
    if (word(r, 1) != word(0, 1) || word(r, 2) != word(0, 2)) {
      throw CommError(prefix() + vs() +
                      describe(static_cast<DType>(word(r, 1)), word(r, 2)) +
                      ", rank 0 passed " +
                      describe(static_cast<DType>(word(0, 1)), word(0, 2)) +
                      "; every rank must pass the same size and dtype");
    }
    if (word(r, 3) != word(0, 3)) {
      throw CommError(prefix() + vs() + "root " +
                      std::to_string(static_cast<int64_t>(word(r, 3))) +
                      ", rank 0 passed root " +
                      std::to_string(static_cast<int64_t>(word(0, 3))) +
                      "; every rank must name the same root");
    }
    if (word(r, 4) != word(0, 4)) {
      throw CommError(
          prefix() + vs() + "ReduceOp " +
          std::string(reduce_op_name(static_cast<ReduceOp>(word(r, 4)))) +
          ", rank 0 passed " +
          std::string(reduce_op_name(static_cast<ReduceOp>(word(0, 4)))) +
          "; every rank must use the same op");
    }
    if (word(r, 5) != word(0, 5)) {
      throw CommError(prefix() + "rank " + std::to_string(r) +
                      " passed a different rank list than rank 0; every "
                      "member must pass the same sorted ranks");
    }
  }
  if (c.kind == Op::kAllToAll) {
    for (size_t s = 0; s < n; ++s) {
      for (size_t d = 0; d < n; ++d) {
        uint64_t sent = word(s, kFixedWords + d);
        uint64_t expected = word(d, kFixedWords + n + s);
        if (sent != expected) {
          throw CommError(prefix() + "rank " + std::to_string(s) + " sends " +
                          std::to_string(sent) + " elements to rank " +
                          std::to_string(d) + ", which expects " +
                          std::to_string(expected) +
                          "; out[i] on each rank must match in[rank] on "
                          "rank i");
        }
      }
    }
  }
}

// All-gather of equal-sized word vectors: direct exchange, one message to
// and from every peer (the lowest latency for small payloads).
void GlooProcessGroup::all_gather_words(const std::vector<uint64_t>& mine,
                                        const Tensor* payload,
                                        std::vector<uint64_t>& all) {
  const size_t wb = mine.size() * sizeof(uint64_t);
  const size_t slot = check_slot_bytes();
  staging_.resize(wb + (payload ? payload->nbytes() : 0));
  std::memcpy(staging_.data(), mine.data(), wb);
  if (payload && payload->nbytes() > 0) {
    std::memcpy(staging_.data() + wb, payload->data, payload->nbytes());
  }
  auto& buf = scratch_;
  buf.resize(slot * size());
  const uint64_t this_slot = coll_slot(kCheckSlot, check_seq_++);
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  auto in = g_->ctx->createUnboundBuffer(staging_.data(), staging_.size());
  // One recv per peer, so that a timeout can say who did not arrive. Each
  // has room for a fused payload: a peer that (wrongly) sends one never
  // overruns it, and its arguments then fail the check.
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> from(size());
  for (int j = 0; j < size(); ++j) {
    if (j == rank()) continue;
    from[j] = g_->ctx->createUnboundBuffer(buf.data() + j * slot, slot);
    from[j]->recv(j, this_slot);
    in->send(j, this_slot);
  }
  for (int j = 0; j < size(); ++j) {
    if (j == rank()) continue;
    try {
      from[j]->waitRecv(left_until(deadline));
    } catch (const ::gloo::Exception& e) {
      // Late, by this check's own deadline (not by Gloo's wording)?
      if (std::chrono::steady_clock::now() < deadline) throw;
      // A recv that completed before the timeout still reports success;
      // the others now fail at once (Gloo closed the pairs).
      std::vector<int> missing{j};
      for (int k = j + 1; k < size(); ++k) {
        if (k == rank()) continue;
        try {
          from[k]->waitRecv(milliseconds(1));
        } catch (const ::gloo::Exception&) {
          missing.push_back(k);
        }
      }
      throw RanksMissing(missing, e.what());
    }
  }
  for (int j = 1; j < size(); ++j) in->waitSend(left_until(deadline));
  for (int j = 0; j < size(); ++j) {
    if (j == rank()) continue;
    std::memcpy(all.data() + j * mine.size(), buf.data() + j * slot, wb);
  }
}

// How many elements rank `from` sends rank `to` in the last all_to_all
// (from the agreed arguments).
uint64_t GlooProcessGroup::agreed_count(int from, int to) const {
  const size_t words = kFixedWords + 2 * size();
  return agreed_[from * words + kFixedWords + to];
}

size_t GlooProcessGroup::words_bytes() const {
  return (kFixedWords + 2 * size()) * sizeof(uint64_t);
}

size_t GlooProcessGroup::check_slot_bytes() const {
  return words_bytes() + tcp_fused_capacity();
}

// Whether `ok` holds on every rank (the same answer everywhere).
bool GlooProcessGroup::every_rank(bool ok) {
  auto all = control_exchange(ok);
  return std::all_of(all.begin(), all.end(), [](uint64_t w) { return w; });
}

// Every rank's `word`, in rank order: a small all-to-all that doubles as
// a barrier (Gloo errors propagate to run()).
std::vector<uint64_t> GlooProcessGroup::control_exchange(uint64_t word) {
  std::vector<uint64_t> all(size(), 0);
  all[rank()] = word;
  const uint64_t slot = coll_slot(kControlSlot, next_tag());
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  auto in = g_->ctx->createUnboundBuffer(&word, sizeof(word));
  auto out = g_->ctx->createUnboundBuffer(all.data(), all.size() * 8);
  for (int j = 0; j < size(); ++j) {
    if (j == rank()) continue;
    out->recv(j, slot, j * sizeof(uint64_t), sizeof(uint64_t));
    in->send(j, slot);
  }
  for (int j = 1; j < size(); ++j) out->waitRecv(left_until(deadline));
  for (int j = 1; j < size(); ++j) in->waitSend(left_until(deadline));
  return all;
}

// Largest all_reduce (bytes per rank) whose data travels with its
// arguments in one message to each peer: one round trip instead of the
// ring's 2(n-1), for (n-1) times the traffic, so small totals only.
// A multiple of 64 bytes, so that every slot's payload stays aligned for
// any dtype (the words before it are 8-byte multiples too).
size_t GlooProcessGroup::tcp_fused_capacity() const {
  return size() > 1 ? g_->fused_bytes / (size() - 1) / 64 * 64 : 0;
}

size_t GlooProcessGroup::fused_capacity() const {
  return channel_ ? channel_fused_capacity() : tcp_fused_capacity();
}

// Rank j's fused payload of the last check.
const char* GlooProcessGroup::payload_of(int j) {
  return channel_ ? channel_->slot(j) + words_bytes() : tcp_payload_of(j);
}

// Where rank j's fused payload lands in a check over Gloo messages.
char* GlooProcessGroup::tcp_payload_of(int j) {
  return scratch_.data() + j * check_slot_bytes() + words_bytes();
}

}  // namespace dlaunch::comm::gloo
