#include "comm/gloo/connection_watch.h"

#include <gloo/common/error.h>

#include <chrono>
#include <exception>

namespace dlaunch::comm::gloo {

std::vector<int> failed_peers(::gloo::rendezvous::Context& ctx, int rank,
                              int size) {
  static char probe[1];
  std::vector<int> out;
  for (int j = 0; j < size; ++j) {
    if (j == rank) continue;
    try {
      auto b = ctx.createUnboundBuffer(probe, sizeof(probe));
      b->send(j, ~uint64_t{0}, 0, 0);
    } catch (const std::exception&) {
      out.push_back(j);
    }
  }
  return out;
}

ConnectionWatch::ConnectionWatch(
    std::shared_ptr<::gloo::rendezvous::Context> ctx, int rank, int size,
    uint64_t slot, OnLost on_lost)
    : ctx_(std::move(ctx)),
      rank_(rank),
      size_(size),
      slot_(slot),
      on_lost_(std::move(on_lost)) {
  thread_ = std::thread([this] { loop(); });
}

ConnectionWatch::~ConnectionWatch() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    // Ends the wait, or makes the next one return at once.
    if (buf_) buf_->abortWaitRecv();
  }
  thread_.join();
}

void ConnectionWatch::loop() {
  std::vector<bool> lost(size_, false);
  lost[rank_] = true;
  for (;;) {
    ::gloo::transport::UnboundBuffer* buf = nullptr;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      buf_ = ctx_->createUnboundBuffer(&byte_, sizeof(byte_));
      buf = buf_.get();
      for (int j = 0; j < size_; ++j) {
        if (lost[j]) continue;
        try {
          buf->recv(j, slot_);
        } catch (const std::exception&) {
          // Already failed: the probe below reports it.
        }
      }
    }
    std::string what;
    try {
      // No deadline: this waits for no one, only for a failure, and the
      // destructor ends it. (Gloo breaks every connection when a wait
      // expires, so the bound is one no group outlives.)
      if (buf->waitRecv(nullptr, std::chrono::hours(24 * 365 * 100))) {
        continue;  // a peer sent on the watch slot: re-arm
      }
      return;  // aborted by the destructor
    } catch (const std::exception& e) {
      what = e.what();
    }
    std::vector<int> now_lost;
    for (int j : failed_peers(*ctx_, rank_, size_)) {
      if (!lost[j]) now_lost.push_back(j);
      lost[j] = true;
    }
    if (!now_lost.empty()) on_lost_(now_lost, what);
    bool any_left = false;
    for (bool l : lost) any_left = any_left || !l;
    if (!any_left) {
      std::lock_guard lock(mu_);
      buf_.reset();
      return;
    }
  }
}

}  // namespace dlaunch::comm::gloo
