// The shared-memory paths between ranks on one host: the channel that
// carries the argument check (and small all-reduces), and the chunked
// all-reduce through per-rank segments.

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "comm/gloo/gloo_group.h"
#include "comm/reduce.h"

namespace dlaunch::comm::gloo {

// The argument check through the shared-memory channel: post this rank's
// words (and payload but payload[skip]), wait for every peer's, read their
// words in place.
void GlooProcessGroup::channel_exchange(const std::vector<uint64_t>& mine,
                                        std::span<const Tensor> payload,
                                        int skip, std::vector<uint64_t>& all) {
  const size_t wb = mine.size() * sizeof(uint64_t);
  std::vector<std::span<const char>>& parts = parts_;  // no allocation
  parts.clear();
  for (size_t i = 0; i < payload.size(); ++i) {
    if (static_cast<int>(i) == skip) continue;
    parts.emplace_back(static_cast<const char*>(payload[i].data),
                       payload[i].nbytes());
  }
  channel_->post_parts({reinterpret_cast<const char*>(mine.data()), wb}, parts);
  channel_wait();
  for (int j = 0; j < size(); ++j) {
    if (j != rank()) {
      std::memcpy(all.data() + j * mine.size(), channel_->slot(j), wb);
    }
  }
}

// Waits for every peer's post of the current channel call, turning the
// channel's error into the ones run() reports.
void GlooProcessGroup::channel_wait() {
  try {
    channel_->wait(std::chrono::steady_clock::now() + timeout());
  } catch (const ShmChannel::WaitError& e) {
    channel_failed(e);
  }
}

void GlooProcessGroup::channel_failed(const ShmChannel::WaitError& e) {
  if (e.timed_out) {
    throw RanksMissing(e.ranks, "Timed out in shared memory after " +
                                    ms_text(timeout()) + " waiting for peers");
  }
  throw RanksGone(e.ranks);
}

// Sets up the channel on the group's first collective when every rank
// shares this host and shared memory is on; every rank ends with one or
// every rank without.
void GlooProcessGroup::ensure_channel(const char* op) {
  if (channel_tried_) return;
  channel_tried_ = true;
  if (size() < 2 || !g_->all_local || g_->shm_min_bytes == SIZE_MAX) return;
  run(op, [&] {
    std::string error;
    auto ch = std::make_unique<ShmChannel>(
        "/dlaunch-" + g_->shm_token + "-c-", rank(), size(),
        words_bytes() + (channel_fused_capacity() + 63) / 64 * 64, error);
    if (!every_rank(ch->ok())) return;
    bool ok = ch->open_peers(error);
    bool everyone = every_rank(ok);
    ch->unlink();  // every rank has mapped it or given up
    if (!everyone) return;
    channel_ = std::move(ch);
    // Agreed: a rank using single copy skips the channel posts the others
    // make (its ranks once drifted a post apart and hung or misread).
    cma_ = every_rank(cma_allowed());
  });
}

// A barrier between ranks on one host (the shared-memory all_reduce).
void GlooProcessGroup::local_barrier() {
  if (channel_) {
    channel_->post({}, {});
    channel_wait();
  } else {
    control_exchange(1);
  }
}

// Replaces the segments with ones of at least `bytes` (rounded up to
// 1 MiB). Every rank creates its own, all map all, then names are
// unlinked; a failure anywhere turns shared memory off on every rank.
bool GlooProcessGroup::shm_grow(size_t bytes) {
  const size_t cap = (bytes + (1 << 20) - 1) / (1 << 20) * (1 << 20);
  const std::string base =
      "/dlaunch-" + g_->shm_token + "-" + std::to_string(++shm_gen_) + "-";
  std::string error;
  ShmSegment mine =
      ShmSegment::create(base + std::to_string(rank()), cap, error);
  if (!every_rank(mine.ok())) {
    shm_off_ = true;
    return false;
  }
  std::vector<ShmSegment> peers(size());
  bool ok = true;
  for (int j = 0; j < size(); ++j) {
    if (j == rank()) continue;
    peers[j] = ShmSegment::open(base + std::to_string(j), cap, error);
    ok = ok && peers[j].ok();
  }
  bool everyone = every_rank(ok);
  mine.unlink();  // every rank has mapped it or given up
  if (!everyone) {
    shm_off_ = true;
    return false;
  }
  shm_mine_ = std::move(mine);
  shm_peers_ = std::move(peers);
  shm_cap_ = cap;
  return true;
}

// Through the channel the payload costs no traffic, only a copy: every
// all_reduce below the shared-memory threshold (up to
// kChannelPayloadBytes) goes with the check, unless fusing is off. The
// channel's slots round it up to 64 bytes (aligned payloads); rounded
// down, sizes just below a threshold that is no multiple of 64 went
// through the segments.
size_t GlooProcessGroup::channel_fused_capacity() const {
  if (g_->fused_bytes == 0 || g_->shm_min_bytes == 0) return 0;
  return std::min(g_->shm_min_bytes - 1, kChannelPayloadBytes);
}

// Whether `bytes` of data per rank travel with the argument check through
// the channel (agree()'s own test, given the agreed sizes).
bool GlooProcessGroup::with_check(size_t bytes) const {
  return channel_ && bytes <= channel_fused_capacity();
}

// Whether the data may move through shared-memory segments.
bool GlooProcessGroup::shm_ready() const { return channel_ && !shm_off_; }

}  // namespace dlaunch::comm::gloo
