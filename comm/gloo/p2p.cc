// Point to point: isend/irecv, over Gloo's TCP pairs (P2pWork) or, between
// ranks on one host, shared memory (ShmP2pWork over the group's ShmP2p).

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/completions.h"
#include "comm/gloo/gloo_group.h"
#include "comm/gloo/shm_p2p.h"
#include "comm/say.h"

namespace dlaunch::comm::gloo {
namespace {

constexpr uint32_t kLastDType = static_cast<uint32_t>(DType::kI64);

// "send to rank 1 (tag 2) on group 'world' (rank 0 of 2)"
std::string op_text(const GroupState& g, bool is_send, int peer, int tag) {
  return std::string(is_send ? "send to rank " : "recv from rank ") +
         std::to_string(peer) + " (tag " + std::to_string(tag) + ") on " +
         g.where();
}

// Why a send and its recv do not match, from this side (both paths).
std::string mismatch_text(bool is_send, int peer, uint32_t their_dtype,
                          uint64_t their_nbytes, DType dtype, uint64_t numel) {
  auto theirs = static_cast<DType>(their_dtype);
  return std::string(is_send ? "the matching recv on rank "
                             : "the matching send on rank ") +
         std::to_string(peer) + " has " +
         describe(theirs, their_nbytes / dtype_size(theirs)) +
         ", this rank has " + describe(dtype, numel) +
         "; a send and its recv must have the same size and dtype";
}

// Frees the (peer, tag) slot of a finished operation for another one.
void release_slot(GroupState& g, bool is_send, int peer, int tag) {
  std::lock_guard lock(g.mu);
  auto& v = g.inflight;
  auto it = std::find(v.begin(), v.end(),
                      std::make_tuple(is_send ? 0 : 1, peer, tag));
  if (it == v.end()) return;
  *it = v.back();
  v.pop_back();
}

// A zero-length tensor still needs a valid pointer for Gloo.
char kEmpty[1];
void* data_or_dummy(const Tensor& t) {
  return t.data != nullptr ? t.data : static_cast<void*>(kEmpty);
}

// The handle of one isend/irecv. Each side posts, at once, its 16-byte
// header (byte count, dtype) to the other and its payload on a slot that
// encodes its own byte count and dtype: when both sides agree the payload
// moves as soon as both posted (one trip, as Gloo's own send/recv), with the
// header exchange in parallel. When they disagree the payload slots differ,
// so nothing overruns a buffer; each side learns the other's size from the
// header, the receiver drains the sender's payload into scratch, the sender
// completes the receiver's recv with zero bytes (its buffer untouched), and
// both report the mismatch, leaving nothing pending for later operations
// with the same tag. wait() with the group timeout drives this on the
// caller's thread; is_completed() or a shorter wait() hand it to a thread
// owned by the Work (Gloo has no callbacks and its own timed waits break the
// whole context), so neither blocks nor breaks anything.
class P2pWork : public Work, public PeerWaiter {
 public:
  struct Header {
    uint64_t nbytes = 0;
    uint32_t dtype = 0;
    uint32_t magic = kMagic;
  };
  static constexpr uint32_t kMagic = 0x444c5032;  // "DLP2"

  P2pWork(std::shared_ptr<GroupState> g, bool is_send, Tensor t, int peer,
          int tag)
      : g_(std::move(g)), is_send_(is_send), t_(t), peer_(peer), tag_(tag) {
    mine_.nbytes = t.nbytes();
    mine_.dtype = static_cast<uint32_t>(t.dtype);
    auto& ctx = g_->ctx;
    mine_buf_ = ctx->createUnboundBuffer(&mine_, sizeof(mine_));
    theirs_buf_ = ctx->createUnboundBuffer(&theirs_, sizeof(theirs_));
    payload_buf_ = ctx->createUnboundBuffer(data_or_dummy(t), t.nbytes());
    uint64_t out_slot = is_send ? p2p_slot(kP2pHeaderToReceiver, tag)
                                : p2p_slot(kP2pHeaderToSender, tag);
    uint64_t in_slot = is_send ? p2p_slot(kP2pHeaderToSender, tag)
                               : p2p_slot(kP2pHeaderToReceiver, tag);
    const uint64_t data_slot = payload_slot(tag, mine_.dtype, mine_.nbytes);
    // Posted from the caller's thread so that operations with equal tags
    // match in the order the caller issued them.
    try {
      theirs_buf_->recv(peer, in_slot);
      mine_buf_->send(peer, out_slot);
      if (is_send) {
        payload_buf_->send(peer, data_slot);
      } else {
        payload_buf_->recv(peer, data_slot);
      }
    } catch (const std::exception& e) {
      release();
      throw told<CommError>(op() + ": connection to rank " +
                            std::to_string(peer) + " is unusable: " + e.what());
    }
  }

  ~P2pWork() override {
    if (thread_.joinable()) {
      thread_.join();
    } else if (!driving_) {
      drive();  // bounded by the group timeout
    }
  }

  void wait(milliseconds timeout) override {
    std::unique_lock lock(mu_);
    if (!done_ && !driving_ && timeout >= g_->timeout) {
      // The common case (send/recv, wait(group timeout)): drive the
      // protocol on the caller's thread, no thread to start.
      driving_ = true;
      lock.unlock();
      drive();
      lock.lock();
    } else if (!driving_) {
      start_thread();
    }
    if (!cv_.wait_for(lock, addable_timeout(timeout), [&] { return done_; })) {
      throw CommTimeoutError(
          op() + ": timed out after " + ms_text(timeout) +
          " waiting for rank " + std::to_string(peer_) + " (" + stage_ +
          "); the Work stays valid and can be waited on again");
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() override {
    std::lock_guard lock(mu_);
    if (!done_ && !driving_) start_thread();
    return done_;
  }

 private:
  std::string op() const { return op_text(*g_, is_send_, peer_, tag_); }

  // A thread that drives the protocol while the caller polls or waits with
  // a shorter timeout (whose expiry must not break the group). mu_ held.
  void start_thread() {
    driving_ = true;
    thread_ = std::thread([this] { drive(); });
  }

  void set_stage(std::string s) {
    std::lock_guard lock(mu_);
    stage_ = std::move(s);
  }

  // Runs once, on thread_ or the caller's thread: every wait is bounded by
  // the group timeout.
  void drive() {
    std::exception_ptr error;
    const auto deadline = std::chrono::steady_clock::now() + g_->timeout;
    try {
      watched();
      wait_recv(*theirs_buf_, deadline);
      set_stage("payload of " + std::to_string(t_.nbytes()) +
                " bytes in transfer");
      std::string mismatch;
      if (theirs_.magic != kMagic || theirs_.dtype > kLastDType) {
        mismatch = "rank " + std::to_string(peer_) +
                   " sent a corrupt p2p header (is it a dlaunch build with "
                   "the same protocol?)";
      } else if (theirs_.nbytes != mine_.nbytes ||
                 theirs_.dtype != mine_.dtype) {
        mismatch = mismatch_text(is_send_, peer_, theirs_.dtype, theirs_.nbytes,
                                 t_.dtype, t_.numel);
      }
      const bool sizes_known = theirs_.magic == kMagic &&
                               theirs_.dtype <= kLastDType &&
                               theirs_.nbytes <= kMaxP2pBytes;
      if (!mismatch.empty() && sizes_known) {
        // Retire the peer's payload operation, which matches none of ours.
        const uint64_t their_slot =
            payload_slot(tag_, theirs_.dtype, theirs_.nbytes);
        if (is_send_) {
          set_fix_buf(g_->ctx->createUnboundBuffer(kEmpty, 1));
          fix_buf_->send(peer_, their_slot, 0, 0);
          wait_send(*fix_buf_, deadline);
        } else {
          drain_.resize(std::max<uint64_t>(theirs_.nbytes, 1));
          set_fix_buf(
              g_->ctx->createUnboundBuffer(drain_.data(), theirs_.nbytes));
          fix_buf_->recv(peer_, their_slot);
          wait_recv(*fix_buf_, deadline);
        }
      }
      if (mismatch.empty() || sizes_known) {
        if (is_send_) {
          wait_send(*payload_buf_, deadline);
        } else {
          wait_recv(*payload_buf_, deadline);
        }
      }
      wait_send(*mine_buf_, deadline);
      if (!mismatch.empty()) {
        error = std::make_exception_ptr(CommError(op() + ": " + mismatch));
      }
    } catch (const std::exception& e) {
      // A timeout is told from a failure by the deadline this operation
      // keeps, not by Gloo's wording.
      const bool timed_out = std::chrono::steady_clock::now() >= deadline;
      const std::string gloo = std::string(" [gloo: ") + e.what() + "]";
      const std::string what =
          timed_out ? op() + ": timed out after " + ms_text(g_->timeout) +
                          " (the group timeout) waiting for rank " +
                          std::to_string(peer_) + gloo
                    : op() + ": connection to rank " + std::to_string(peer_) +
                          " lost" + gloo;
      // Told now, as fail() does for collectives: the waiter may be
      // stopped before it prints the CommError.
      error = timed_out ? std::make_exception_ptr(told<CommTimeoutError>(what))
                        : std::make_exception_ptr(told<CommError>(what));
    }
    unwatched();
    release();
    {
      std::lock_guard lock(mu_);
      error_ = error;
      done_ = true;
    }
    cv_.notify_all();
  }

  int peer() const override { return peer_; }

  void abort() override {
    aborted_ = true;
    for (auto* b : {theirs_buf_.get(), mine_buf_.get(), payload_buf_.get(),
                    fix_buf_.get()}) {
      if (b) {
        b->abortWaitRecv();
        b->abortWaitSend();
      }
    }
  }

  // The connection watch's verdict: thrown when it aborted a wait (the
  // connection to the peer failed, possibly with bytes in transfer, which
  // Gloo does not report to the waiting buffer).
  struct Lost : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  // Registers with the group's connection watch for the waits to come.
  // When the peer's connection already failed, the waits return at once:
  // each takes what arrived before (the peer may have finished and left)
  // or throws Lost.
  void watched() {
    std::lock_guard lock(g_->mu);
    g_->waiters.insert(this);
    if (g_->lost.count(peer_)) abort();
  }
  void unwatched() {
    std::lock_guard lock(g_->mu);
    g_->waiters.erase(this);
  }
  void throw_if_lost() {  // g_->mu held
    auto it = g_->lost.find(peer_);
    if (it != g_->lost.end()) throw Lost(it->second);
  }
  // fix_buf_ is created during drive(): set it where abort() sees it.
  void set_fix_buf(std::unique_ptr<::gloo::transport::UnboundBuffer> b) {
    std::lock_guard lock(g_->mu);
    fix_buf_ = std::move(b);
    if (aborted_) throw_if_lost();
  }
  // Gloo's waits, turning an abort by the watch into Lost unless the
  // operation completed before it.
  void wait_recv(::gloo::transport::UnboundBuffer& b,
                 std::chrono::steady_clock::time_point deadline) {
    if (!b.waitRecv(nullptr, left_until(deadline)) && !recv_completed(b)) {
      lost();
    }
  }
  void wait_send(::gloo::transport::UnboundBuffer& b,
                 std::chrono::steady_clock::time_point deadline) {
    if (!b.waitSend(nullptr, left_until(deadline)) && !send_completed(b)) {
      lost();
    }
  }
  [[noreturn]] void lost() {
    std::lock_guard lock(g_->mu);
    throw_if_lost();
    throw Lost("the wait was aborted");  // not reached: aborts name a rank
  }

  void release() { release_slot(*g_, is_send_, peer_, tag_); }

  std::shared_ptr<GroupState> g_;
  const bool is_send_;
  const Tensor t_;
  const int peer_;
  const int tag_;
  Header mine_;
  Header theirs_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> mine_buf_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> theirs_buf_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> payload_buf_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> fix_buf_;  // mismatch
  std::vector<char> drain_;  // the sender's payload after a mismatch
  bool aborted_ = false;     // by the connection watch (under g_->mu)
  std::thread thread_;

  std::mutex mu_;  // guards the members below
  std::condition_variable cv_;
  bool driving_ = false;  // drive() started (inline or on thread_)
  bool done_ = false;
  std::exception_ptr error_;
  std::string stage_ = "no matching operation posted there yet";
};

// One isend/irecv between ranks on one host: its operation lives in the
// group's shared-memory engine (ShmP2p) from the constructor until it is
// done, and its (peer, tag) slot, claimed by the caller, is held until
// wait() returns or the destructor (which waits, bounded by the group
// timeout). Whoever waits makes progress; a wait shorter than the group
// timeout, or is_completed(), leaves it to the engine's thread, which fails
// it one group timeout later, as P2pWork's thread does. Blocking send/recv
// keep one on the stack (no allocation, no reference to the group's state
// taken); ShmP2pWork wraps one for isend/irecv.
class ShmCall {
 public:
  ShmCall(GroupState& g, bool is_send, Tensor t, int peer, int tag)
      : g_(g), numel_(t.numel), dtype_(t.dtype) {
    op_.is_send = is_send;
    op_.peer = peer;
    op_.tag = tag;
    op_.data = static_cast<char*>(t.data);
    op_.nbytes = t.nbytes();
    op_.dtype = static_cast<uint32_t>(t.dtype);
    std::string error;
    bool posted = false;
    try {
      posted = g_.p2p->post(op_, error);
    } catch (...) {  // bad_alloc: the op is not registered, the slot is ours
      release();
      throw;
    }
    if (!posted) {
      release();
      throw told<CommError>(op() + ": connection to rank " +
                            std::to_string(peer) + " is unusable: " + error);
    }
  }

  ~ShmCall() {
    // Bounded: at op_.deadline (armed by the first wait) a round fails the
    // op, memory or not. Until then a round that ran out of memory is
    // retried: the engine must not keep an op this frame no longer holds.
    while (!op_.done.load(std::memory_order_acquire)) {
      try {
        g_.p2p->wait(op_, milliseconds::max(), g_.timeout);
      } catch (...) {  // bad_alloc: nothing may leave a destructor
        std::this_thread::sleep_for(milliseconds(1));
      }
    }
    release();
  }
  ShmCall(const ShmCall&) = delete;
  ShmCall& operator=(const ShmCall&) = delete;

  void wait(milliseconds timeout) {
    ShmP2p& e = *g_.p2p;
    if (!op_.done.load(std::memory_order_acquire)) {
      const bool whole = timeout >= g_.timeout;
      if (!e.wait(op_, timeout, whole ? g_.timeout : milliseconds(0))) {
        e.arm(op_, ShmP2p::after(ShmP2p::Clock::now(), g_.timeout));
        e.detach(op_);
        throw CommTimeoutError(
            op() + ": timed out after " + ms_text(timeout) +
            " waiting for rank " + std::to_string(op_.peer) + " (" +
            e.stage(op_) +
            "); the Work stays valid and can be waited on again");
      }
    }
    release();
    // Told as they are raised, as fail() does for collectives.
    if (op_.timed_out) {
      throw told<CommTimeoutError>(
          op() + ": timed out after " + ms_text(g_.timeout) +
          " (the group timeout) waiting for rank " + std::to_string(op_.peer) +
          " (" + op_.failure + ")");
    }
    if (!op_.failure.empty()) throw told<CommError>(op() + ": " + op_.failure);
    if (op_.mismatch) {
      throw CommError(op() + ": " +
                      mismatch_text(op_.is_send, op_.peer, op_.their_dtype,
                                    op_.their_nbytes, dtype_, numel_));
    }
  }

  bool is_completed() {
    ShmP2p& e = *g_.p2p;
    if (e.test(op_)) return true;
    e.arm(op_, ShmP2p::after(ShmP2p::Clock::now(), g_.timeout));
    e.detach(op_);
    return false;
  }

 private:
  std::string op() const { return op_text(g_, op_.is_send, op_.peer, op_.tag); }
  void release() {
    if (released_) return;
    released_ = true;
    g_.p2p->release(op_.is_send, op_.peer, op_.tag);
  }

  GroupState& g_;
  const uint64_t numel_;
  const DType dtype_;
  ShmP2p::Op op_;
  bool released_ = false;
};

// The handle of one isend/irecv between ranks on one host: a ShmCall and
// the group's state it needs (the Work may outlive its group).
class ShmP2pWork : public Work {
 public:
  ShmP2pWork(std::shared_ptr<GroupState> g, bool is_send, Tensor t, int peer,
             int tag)
      : g_(std::move(g)), call_(*g_, is_send, t, peer, tag) {}

  void wait(milliseconds timeout) override { call_.wait(timeout); }
  bool is_completed() override { return call_.is_completed(); }

 private:
  std::shared_ptr<GroupState> g_;  // declared first: outlives call_
  ShmCall call_;
};

}  // namespace

std::unique_ptr<Work> GlooProcessGroup::isend(Tensor t, int dst, int tag) {
  return post(true, t, dst, tag);
}

std::unique_ptr<Work> GlooProcessGroup::irecv(Tensor t, int src, int tag) {
  return post(false, t, src, tag);
}

void GlooProcessGroup::send(Tensor t, int dst, int tag) {
  blocking(true, t, dst, tag);
}

void GlooProcessGroup::recv(Tensor t, int src, int tag) {
  blocking(false, t, src, tag);
}

// send/recv: over shared memory the operation lives on this stack frame
// (the latency path: no Work to allocate); over TCP through a P2pWork.
void GlooProcessGroup::blocking(bool is_send, Tensor t, int peer, int tag) {
  if (!admit(is_send, t, peer, tag)) {
    took("tcp");
    std::optional<P2pWork> w;
    try {
      w.emplace(g_, is_send, t, peer, tag);
    } catch (...) {
      unclaim(false, is_send, peer, tag);
      throw;
    }
    w->wait(g_->timeout);
    return;
  }
  took("shm-p2p");
  ShmCall(*g_, is_send, t, peer, tag).wait(g_->timeout);
}

std::unique_ptr<Work> GlooProcessGroup::post(bool is_send, Tensor t, int peer,
                                             int tag) {
  const bool shm = admit(is_send, t, peer, tag);
  took(shm ? "shm-p2p" : "tcp");
  try {
    if (shm) return std::make_unique<ShmP2pWork>(g_, is_send, t, peer, tag);
    return std::make_unique<P2pWork>(g_, is_send, t, peer, tag);
  } catch (...) {
    unclaim(shm, is_send, peer, tag);
    throw;
  }
}

// The slot admit() claimed, freed when no Work took it (its allocation or
// construction threw: bad_alloc, or an unusable connection, whose
// constructor freed it already; freeing twice is harmless, as one thread
// posts at a time).
void GlooProcessGroup::unclaim(bool shm, bool is_send, int peer, int tag) {
  if (shm) {
    g_->p2p->release(is_send, peer, tag);
  } else {
    release_slot(*g_, is_send, peer, tag);
  }
}

// Checks a point-to-point call's arguments and claims its (peer, tag) slot,
// throwing CommError naming the problem; whether it goes over shared memory
// (the slot in the engine, no lock) or TCP (in GroupState::inflight).
bool GlooProcessGroup::admit(bool is_send, const Tensor& t, int peer, int tag) {
  // Built only for an error: this is the latency path.
  auto what = [&] {
    return std::string(is_send ? "isend to rank " : "irecv from rank ") +
           std::to_string(peer) + " (tag " + std::to_string(tag) + ") on " +
           g_->where();
  };
  if (peer < 0 || peer >= size()) {
    throw CommError(what() + ": rank " + std::to_string(peer) +
                    " is out of range; valid ranks are 0.." +
                    std::to_string(size() - 1));
  }
  if (peer == rank()) {
    throw CommError(what() +
                    ": a rank cannot send to or receive from itself; "
                    "copy the tensor instead");
  }
  if (tag < 0 || tag > kMaxTag) {
    throw CommError(what() + ": tag must be in 0.." + std::to_string(kMaxTag));
  }
  if (std::string bad = check_tensor(t, "tensor"); !bad.empty()) {
    throw CommError(what() + ": " + bad);
  }
  if (t.nbytes() > kMaxP2pBytes) {
    throw CommError(what() + ": " + std::to_string(t.nbytes()) +
                    " bytes; point-to-point tensors are limited to 128 GiB "
                    "(split the tensor)");
  }
  auto busy = [&] {
    return CommError(
        what() + ": an earlier " + (is_send ? "isend to" : "irecv from") +
        " rank " + std::to_string(peer) + " with tag " + std::to_string(tag) +
        " is still in flight; wait() on its Work first or use another tag");
  };
  // g_->p2p is set once, at set-up.
  if (g_->p2p && g_->p2p->serves(peer)) {
    if (!g_->p2p->claim(is_send, peer, tag)) throw busy();
    return true;
  }
  std::lock_guard lock(g_->mu);
  auto& v = g_->inflight;
  const auto slot = std::make_tuple(is_send ? 0 : 1, peer, tag);
  if (std::find(v.begin(), v.end(), slot) != v.end()) throw busy();
  v.push_back(slot);
  return false;
}

// Point to point over shared memory for the pairs of ranks that share a
// host, set up with the group (a collective step: every rank creates its
// segment, maps its local peers', and all agree, or the group stays on TCP
// for point to point).
void GlooProcessGroup::setup_shm_p2p() {
  if (size() < 2 || g_->shm_min_bytes == SIZE_MAX) return;
  const auto& hosts = g_->hosts;
  std::vector<int> local;
  for (int j = 0; j < size(); ++j) {
    if (hosts[j] == g_->host) local.push_back(j);
  }
  // Every rank computes the same answer from every rank's host.
  bool any_pair = false;
  for (int i = 0; i < size() && !any_pair; ++i) {
    any_pair = std::count(hosts.begin(), hosts.end(), hosts[i]) > 1;
  }
  if (!any_pair) return;
  run("new_group", [&] {
    std::string error;
    std::unique_ptr<ShmP2p> e;
    if (local.size() > 1) {
      e = std::make_unique<ShmP2p>("/dlaunch-" + g_->shm_token + "-p-", rank(),
                                   local, g_->timeout, error);
    }
    if (!every_rank(!e || e->ok())) return;
    const bool ok = !e || e->open_peers(error);
    const bool everyone = every_rank(ok);
    if (e) e->unlink();  // every rank has mapped it or given up
    if (!everyone || !e) return;
    std::lock_guard lock(g_->mu);  // the connection watch reads it
    g_->p2p = std::move(e);
    std::vector<int> lost;
    for (const auto& [r, what] : g_->lost) lost.push_back(r);
    if (!lost.empty()) g_->p2p->peers_lost(lost);
  });
}

}  // namespace dlaunch::comm::gloo
