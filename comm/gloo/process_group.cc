#include "comm/gloo/process_group.h"

#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/gloo/shm_channel.h"
#include "comm/gloo/shm_segment.h"
#include "comm/gloo/store_adapter.h"
#include "comm/reduce.h"

namespace dlaunch::comm::gloo {
namespace {

namespace tcp = ::gloo::transport::tcp;
using std::chrono::milliseconds;

// Slot prefixes (top byte of Gloo's 64-bit slot). Gloo's own collectives use
// 0x01..0x08; ours stay clear of them. P2P slots carry the user tag in bits
// 40..55 and, for payloads, the dtype (bits 37..39) and byte count (bits
// 0..36), so that a send only ever matches a recv of the same size and
// dtype; collective slots carry the group's tag counter in bits 24..55 and
// a sub-index in the low bits.
constexpr uint64_t kP2pHeaderToReceiver = 0xA0;
constexpr uint64_t kP2pHeaderToSender = 0xA1;
constexpr uint64_t kP2pPayload = 0xA2;
constexpr uint64_t kCheckSlot = 0xB0;
constexpr uint64_t kGatherSlot = 0xB1;
constexpr uint64_t kExchangeSlot = 0xB2;
constexpr uint64_t kReduceScatterSlot = 0xB3;
constexpr int kMaxTag = (1 << 16) - 1;
constexpr uint64_t kMaxP2pBytes = (uint64_t{1} << 37) - 1;  // 128 GiB
// An all_reduce whose bytes per rank times (size - 1) stay within this goes
// in one message per peer (see fused_capacity()); DLAUNCH_COMM_FUSED_BYTES
// overrides it (0 turns the fused path off). 512 KiB covers a 2-rank
// gradient all-reduce of dl-sgd's MLP (407 KB): 2.2x faster epochs than the
// check-then-ring path.
constexpr size_t kFusedTrafficBytes = 512 << 10;
// All-reduces of at least this many bytes between ranks that share a host
// go through shared memory (DLAUNCH_COMM_SHM_MIN_BYTES; "off" disables).
constexpr size_t kShmMinBytes = 1 << 20;
constexpr size_t kShmSliceBytes = 32 << 20;
// Between ranks on one host the argument check meets in shared memory
// (ShmChannel), and all_reduces below kShmMinBytes travel with it, up to
// this many bytes per rank (each rank's channel holds two slots).
constexpr size_t kChannelPayloadBytes = 1 << 20;
constexpr uint64_t kControlSlot = 0xB4;

uint64_t p2p_slot(uint64_t prefix, int tag) {
  return (prefix << 56) | (static_cast<uint64_t>(tag) << 40);
}
uint64_t payload_slot(int tag, uint32_t dtype, uint64_t nbytes) {
  return p2p_slot(kP2pPayload, tag) | (static_cast<uint64_t>(dtype) << 37) |
         (nbytes & kMaxP2pBytes);
}
uint64_t coll_slot(uint64_t prefix, uint32_t tag, uint32_t sub = 0) {
  return (prefix << 56) | (static_cast<uint64_t>(tag) << 24) | (sub & 0xffffff);
}

// Time left until `deadline`, at least 1 ms (Gloo reads 0 as "no timeout"
// in places): every wait of one operation shares one deadline.
milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(left, milliseconds(1));
}

std::string ms_text(milliseconds t) {
  if (t.count() % 1000 == 0) return std::to_string(t.count() / 1000) + " s";
  return std::to_string(t.count()) + " ms";
}

// "rank 2", "rank 0 and rank 2", "rank 0, rank 1 and rank 2": each rank
// named in full, so that messages can be searched for "rank N".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += "rank " + std::to_string(ranks[i]);
  }
  return out;
}

std::string describe(DType dtype, uint64_t numel) {
  return std::to_string(numel) + " elements of " +
         std::string(dtype_name(dtype));
}

// A byte count from the environment, or `fallback` when unset; "off" is
// the largest value (never).
size_t env_bytes(const char* name, size_t fallback) {
  const char* f = std::getenv(name);
  if (f == nullptr || *f == '\0') return fallback;
  if (std::string_view(f) == "off") return SIZE_MAX;
  char* end = nullptr;
  unsigned long long v = std::strtoull(f, &end, 10);
  if (end == f || *end != '\0' || v > (1ull << 40)) {
    throw CommError(std::string(name) + " is '" + f +
                    "'; expected a byte count (e.g. 1048576) or 'off'");
  }
  return static_cast<size_t>(v);
}

// This machine's boot id and host name: ranks with equal identities share
// /dev/shm.
std::string host_identity() {
  std::string id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f)) id = buf;
    std::fclose(f);
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return id + "/" + host;
}

std::string random_token() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%08x%08x", rd(), rd());
  return buf;
}

// A zero-length tensor still needs a valid pointer for Gloo.
char kEmpty[1];
void* data_or_dummy(const Tensor& t) {
  return t.data != nullptr ? t.data : static_cast<void*>(kEmpty);
}

// The state a group shares with its outstanding Works; the last owner
// closes the TCP pairs.
struct GroupState {
  std::string name;
  int rank = 0;
  int size = 0;
  milliseconds timeout{0};
  std::shared_ptr<SharedStore> store;
  std::string hostname;
  std::string iface;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> ctx;
  size_t fused_bytes = kFusedTrafficBytes;
  size_t shm_min_bytes = kShmMinBytes;
  bool all_local = false;  // every rank on this host (shared memory usable)
  std::string shm_token;   // names this group's segments, from rank 0

  std::mutex mu;  // guards the members below
  // (direction 0 send / 1 recv, peer, tag) of p2p operations in flight.
  std::set<std::tuple<int, int, int>> inflight;
  // First fatal error; non-empty: collectives refuse to run.
  std::string broken;

  std::string where() const {
    return "group '" + name + "' (rank " + std::to_string(rank) + " of " +
           std::to_string(size) + ")";
  }
  // Peers whose connection has failed. Gloo's errors name the socket
  // address, which for accepted connections is the peer's ephemeral port, so
  // ask each pair instead: posting on a failed pair throws at once. (A
  // posted probe on a healthy pair is harmless: the caller closes the
  // connections next.)
  std::vector<int> failed_peers() const {
    static char probe[1];
    std::vector<int> out;
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      try {
        auto b = ctx->createUnboundBuffer(probe, sizeof(probe));
        b->send(j, ~uint64_t{0}, 0, 0);
      } catch (const std::exception&) {
        out.push_back(j);
      }
    }
    return out;
  }
};

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
class P2pWork : public Work {
 public:
  struct Header {
    uint64_t nbytes = 0;
    uint32_t dtype = 0;
    uint32_t magic = kMagic;
  };
  static constexpr uint32_t kMagic = 0x444c5032;  // "DLP2"
  static constexpr uint32_t kLastDType = static_cast<uint32_t>(DType::kI64);

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
      throw CommError(op() + ": connection to rank " + std::to_string(peer) +
                      " is unusable: " + e.what());
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
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
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
  std::string op() const {
    return std::string(is_send_ ? "send to rank " : "recv from rank ") +
           std::to_string(peer_) + " (tag " + std::to_string(tag_) + ") on " +
           g_->where();
  }

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
    try {
      const auto deadline = std::chrono::steady_clock::now() + g_->timeout;
      theirs_buf_->waitRecv(left_until(deadline));
      set_stage("payload of " + std::to_string(t_.nbytes()) +
                " bytes in transfer");
      std::string mismatch;
      if (theirs_.magic != kMagic || theirs_.dtype > kLastDType) {
        mismatch = "rank " + std::to_string(peer_) +
                   " sent a corrupt p2p header (is it a dlaunch build with "
                   "the same protocol?)";
      } else if (theirs_.nbytes != mine_.nbytes ||
                 theirs_.dtype != mine_.dtype) {
        auto their_dtype = static_cast<DType>(theirs_.dtype);
        uint64_t their_numel = theirs_.nbytes / dtype_size(their_dtype);
        mismatch = std::string(is_send_ ? "the matching recv on rank "
                                        : "the matching send on rank ") +
                   std::to_string(peer_) + " has " +
                   describe(their_dtype, their_numel) + ", this rank has " +
                   describe(t_.dtype, t_.numel) +
                   "; a send and its recv must have the same size and dtype";
      }
      const bool sizes_known = theirs_.magic == kMagic &&
                               theirs_.dtype <= kLastDType &&
                               theirs_.nbytes <= kMaxP2pBytes;
      if (!mismatch.empty() && sizes_known) {
        // Retire the peer's payload operation, which matches none of ours.
        const uint64_t their_slot =
            payload_slot(tag_, theirs_.dtype, theirs_.nbytes);
        if (is_send_) {
          fix_buf_ = g_->ctx->createUnboundBuffer(kEmpty, 1);
          fix_buf_->send(peer_, their_slot, 0, 0);
          fix_buf_->waitSend(left_until(deadline));
        } else {
          drain_.resize(std::max<uint64_t>(theirs_.nbytes, 1));
          fix_buf_ =
              g_->ctx->createUnboundBuffer(drain_.data(), theirs_.nbytes);
          fix_buf_->recv(peer_, their_slot);
          fix_buf_->waitRecv(left_until(deadline));
        }
      }
      if (mismatch.empty() || sizes_known) {
        if (is_send_) {
          payload_buf_->waitSend(left_until(deadline));
        } else {
          payload_buf_->waitRecv(left_until(deadline));
        }
      }
      mine_buf_->waitSend(left_until(deadline));
      if (!mismatch.empty()) {
        error = std::make_exception_ptr(CommError(op() + ": " + mismatch));
      }
    } catch (const std::exception& e) {
      std::string what = e.what();
      bool timed_out = what.find("Timed out") != std::string::npos;
      error = std::make_exception_ptr(CommError(
          op() +
          (timed_out
               ? ": timed out after " + ms_text(g_->timeout) +
                     " (the group timeout) waiting for rank " +
                     std::to_string(peer_)
               : ": connection to rank " + std::to_string(peer_) + " lost") +
          " [gloo: " + what + "]"));
    }
    release();
    {
      std::lock_guard lock(mu_);
      error_ = error;
      done_ = true;
    }
    cv_.notify_all();
  }

  // Frees the (peer, tag) slot for another operation.
  void release() {
    std::lock_guard lock(g_->mu);
    g_->inflight.erase({is_send_ ? 0 : 1, peer_, tag_});
  }

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
  std::thread thread_;

  std::mutex mu_;  // guards the members below
  std::condition_variable cv_;
  bool driving_ = false;  // drive() started (inline or on thread_)
  bool done_ = false;
  std::exception_ptr error_;
  std::string stage_ = "no matching operation posted there yet";
};

// The argument check timed out: these ranks never sent theirs.
struct RanksMissing : std::runtime_error {
  RanksMissing(std::vector<int> m, const std::string& what)
      : std::runtime_error(what), missing(std::move(m)) {}
  std::vector<int> missing;
};

// Ranks seen to leave (fail, exit or destroy the group) while others waited
// for them in shared memory.
struct RanksGone : std::runtime_error {
  explicit RanksGone(std::vector<int> g)
      : std::runtime_error("peer left the shared-memory channel"),
        gone(std::move(g)) {}
  std::vector<int> gone;
};

enum class Kind : uint64_t {
  kBroadcast = 1,
  kReduce,
  kAllReduce,
  kScatter,
  kGather,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kNewGroup,
};

const char* kind_name(uint64_t k) {
  switch (static_cast<Kind>(k)) {
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduce:
      return "reduce";
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kScatter:
      return "scatter";
    case Kind::kGather:
      return "gather";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllToAll:
      return "all_to_all";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kNewGroup:
      return "new_group";
  }
  return "an unknown operation";
}

// What one rank passed to a collective; exchanged before the data moves so
// that every rank detects a mismatch identically (and Gloo never sees
// buffers of different sizes, which it cannot survive).
struct Call {
  Kind kind = Kind::kBarrier;
  DType dtype = DType::kF32;
  uint64_t numel = 0;
  int64_t root = -1;
  ReduceOp op = ReduceOp::kSum;
  uint64_t extra = 0;                 // new_group: hash of the ranks
  std::vector<uint64_t> send_counts;  // all_to_all: elements to each rank
  std::vector<uint64_t> recv_counts;  // all_to_all: elements from each rank
  std::string local_error;            // bad arguments on this rank
};

Call make_call(Kind kind, DType dtype, uint64_t numel, int64_t root,
               ReduceOp op) {
  Call c;
  c.kind = kind;
  c.dtype = dtype;
  c.numel = numel;
  c.root = root;
  c.op = op;
  return c;
}

constexpr size_t kFixedWords = 7;

// Dispatches on element size: Gloo's typed setters only use sizeof(T).
template <class F>
void by_element_size(DType d, F&& f) {
  switch (dtype_size(d)) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
  }
  DLAUNCH_CHECK(false, "unexpected element size");
}

// A ProcessGroup over one Gloo context (a full mesh of TCP pairs). Every
// collective first exchanges each rank's arguments (agree()), so that bad or
// mismatched arguments fail identically on every rank before any data moves;
// then it runs Gloo's algorithm or our own over unbound buffers, with tags
// from a per-group counter. A failure marks the group unusable and closes
// its pairs so that peers fail at once. One thread at a time (the
// ProcessGroup contract); Works may outlive the group.
class GlooProcessGroup : public ProcessGroup {
 public:
  explicit GlooProcessGroup(std::shared_ptr<GroupState> g) : g_(std::move(g)) {}

  int rank() const override { return g_->rank; }
  int size() const override { return g_->size; }
  std::string_view backend() const override { return "gloo"; }
  const std::string& name() const override { return g_->name; }
  milliseconds timeout() const override { return g_->timeout; }

  std::unique_ptr<Work> isend(Tensor t, int dst, int tag) override {
    return post(true, t, dst, tag);
  }
  std::unique_ptr<Work> irecv(Tensor t, int src, int tag) override {
    return post(false, t, src, tag);
  }

  void broadcast(Tensor t, int root) override {
    const char* op = "broadcast";
    Call c =
        make_call(Kind::kBroadcast, t.dtype, t.numel, root, ReduceOp::kSum);
    c.local_error = check_tensor(t, "t") + check_root(root);
    agree(op, c);
    if (size() == 1 || t.numel == 0) return;
    run(op, [&] {
      ::gloo::BroadcastOptions opts(g_->ctx);
      by_element_size(t.dtype, [&](auto x) {
        using T = decltype(x);
        opts.setOutput(static_cast<T*>(t.data), t.numel);
        if (rank() == root) opts.setInput(static_cast<T*>(t.data), t.numel);
      });
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      ::gloo::broadcast(opts);
    });
  }

  void reduce(Tensor t, int root, ReduceOp rop) override {
    const char* op = "reduce";
    Call c = make_call(Kind::kReduce, t.dtype, t.numel, root, rop);
    c.local_error =
        check_tensor(t, "t") + check_root(root) + reduce_op_error(t.dtype, rop);
    agree(op, c);
    if (size() == 1 || t.numel == 0) return;
    // Gloo's ring reduce uses the output as scratch on every rank; non-roots
    // reduce into a copy so that their `t` is left as sent.
    void* out = t.data;
    if (rank() != root) {
      out = work_buffer(0, t.nbytes());
    }
    run(op, [&] {
      ::gloo::ReduceOptions opts(g_->ctx);
      by_element_size(t.dtype, [&](auto x) {
        using T = decltype(x);
        opts.setInput(static_cast<T*>(t.data), t.numel);
        opts.setOutput(static_cast<T*>(out), t.numel);
      });
      opts.setRoot(root);
      opts.setReduceFunction(reduce_fn(t.dtype, rop));
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      ::gloo::reduce(opts);
    });
    if (rop == ReduceOp::kAvg && rank() == root) divide_in_place(t, size());
  }

  void all_reduce(Tensor t, ReduceOp rop) override {
    const char* op = "all_reduce";
    Call c = make_call(Kind::kAllReduce, t.dtype, t.numel, -1, rop);
    c.local_error = check_tensor(t, "t") + reduce_op_error(t.dtype, rop);
    agree(op, c, &t);
    if (size() == 1 || t.numel == 0) return;
    // agree()'s own test: whether the data came with the arguments.
    const bool fused = t.nbytes() <= fused_capacity();
    if (!fused && g_->all_local && !shm_off_ &&
        t.nbytes() >= g_->shm_min_bytes) {
      bool done = false;
      run(op, [&] { done = shm_all_reduce(t, rop); });
      if (done) {
        if (rop == ReduceOp::kAvg) divide_in_place(t, size());
        return;
      }
    }
    if (fused) {
      // Every rank's data came with its arguments: reduce locally, in rank
      // order, so that every rank computes bitwise the same result.
      ReduceFn fn = reduce_fn(t.dtype, rop);
      if (!channel_) {  // the channel already holds this rank's copy
        std::memcpy(tcp_payload_of(rank()), t.data, t.nbytes());
      }
      fn(t.data, payload_of(0), payload_of(1), t.numel);
      for (int j = 2; j < size(); ++j) {
        fn(t.data, t.data, payload_of(j), t.numel);
      }
      if (rop == ReduceOp::kAvg) divide_in_place(t, size());
      return;
    }
    run(op, [&] {
      ::gloo::AllreduceOptions opts(g_->ctx);
      by_element_size(t.dtype, [&](auto x) {
        using T = decltype(x);
        opts.setOutput(static_cast<T*>(t.data), t.numel);
      });
      opts.setReduceFunction(reduce_fn(t.dtype, rop));
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      ::gloo::allreduce(opts);
    });
    if (rop == ReduceOp::kAvg) divide_in_place(t, size());
  }

  void scatter(Tensor out, std::span<const Tensor> in, int root) override {
    const char* op = "scatter";
    Call c =
        make_call(Kind::kScatter, out.dtype, out.numel, root, ReduceOp::kSum);
    c.local_error = check_tensor(out, "out") + check_root(root);
    if (rank() == root) c.local_error += check_list(in, "in", out);
    agree(op, c);
    if (rank() == root) {
      copy(out, in[root]);
    }
    if (size() == 1 || out.numel == 0) return;
    exchange(op, kGatherSlot, [&](auto& post_send, auto& post_recv) {
      if (rank() == root) {
        for (int j = 0; j < size(); ++j) {
          if (j != root) post_send(j, in[j]);
        }
      } else {
        post_recv(root, out);
      }
    });
  }

  void gather(Tensor in, std::span<const Tensor> out, int root) override {
    const char* op = "gather";
    Call c = make_call(Kind::kGather, in.dtype, in.numel, root, ReduceOp::kSum);
    c.local_error = check_tensor(in, "in") + check_root(root);
    if (rank() == root) c.local_error += check_list(out, "out", in);
    agree(op, c);
    if (rank() == root) copy(out[root], in);
    if (size() == 1 || in.numel == 0) return;
    exchange(op, kGatherSlot, [&](auto& post_send, auto& post_recv) {
      if (rank() == root) {
        for (int j = 0; j < size(); ++j) {
          if (j != root) post_recv(j, out[j]);
        }
      } else {
        post_send(root, in);
      }
    });
  }

  void all_gather(std::span<const Tensor> out, Tensor in) override {
    const char* op = "all_gather";
    Call c =
        make_call(Kind::kAllGather, in.dtype, in.numel, -1, ReduceOp::kSum);
    c.local_error = check_tensor(in, "in") + check_list(out, "out", in);
    agree(op, c);
    copy(out[rank()], in);
    if (size() == 1 || in.numel == 0) return;
    exchange(op, kExchangeSlot, [&](auto& post_send, auto& post_recv) {
      for (int s = 1; s < size(); ++s) {
        int to = (rank() + s) % size();
        int from = (rank() - s + size()) % size();
        post_recv(from, out[from]);
        post_send(to, in);
      }
    });
  }

  void reduce_scatter(Tensor out, std::span<const Tensor> in,
                      ReduceOp rop) override {
    const char* op = "reduce_scatter";
    Call c = make_call(Kind::kReduceScatter, out.dtype, out.numel, -1, rop);
    c.local_error = check_tensor(out, "out") + check_list(in, "in", out) +
                    reduce_op_error(out.dtype, rop);
    agree(op, c);
    if (size() == 1) {
      copy(out, in[0]);
      return;
    }
    if (out.numel == 0) return;
    run(op, [&] { ring_reduce_scatter(out, in, rop); });
    if (rop == ReduceOp::kAvg) divide_in_place(out, size());
  }

  void all_to_all(std::span<const Tensor> out,
                  std::span<const Tensor> in) override {
    const char* op = "all_to_all";
    Call c = make_call(Kind::kAllToAll, DType::kF32, 0, -1, ReduceOp::kSum);
    DType dtype = in.empty() ? DType::kF32 : in[0].dtype;
    c.dtype = dtype;
    if (in.size() != static_cast<size_t>(size()) ||
        out.size() != static_cast<size_t>(size())) {
      c.local_error =
          "all_to_all takes one `in` and one `out` tensor per "
          "rank; got " +
          std::to_string(in.size()) + " and " + std::to_string(out.size()) +
          " for a group of " + std::to_string(size());
    } else {
      for (int j = 0; j < size(); ++j) {
        c.local_error += check_tensor(in[j], "in[" + std::to_string(j) + "]");
        c.local_error += check_tensor(out[j], "out[" + std::to_string(j) + "]");
        if (in[j].dtype != dtype || out[j].dtype != dtype) {
          c.local_error +=
              "all_to_all tensors must share one dtype; in[0] "
              "is " +
              std::string(dtype_name(dtype)) + ". ";
        }
        c.send_counts.push_back(in[j].numel);
        c.recv_counts.push_back(out[j].numel);
      }
      if (c.local_error.empty() && in[rank()].numel != out[rank()].numel) {
        c.local_error = "in[" + std::to_string(rank()) + "] has " +
                        std::to_string(in[rank()].numel) +
                        " elements but out[" + std::to_string(rank()) +
                        "] has " + std::to_string(out[rank()].numel) +
                        "; this rank's own block must fit";
      }
    }
    c.send_counts.resize(size());
    c.recv_counts.resize(size());
    agree(op, c);
    copy(out[rank()], in[rank()]);
    if (size() == 1) return;
    exchange(op, kExchangeSlot, [&](auto& post_send, auto& post_recv) {
      for (int s = 1; s < size(); ++s) {
        int to = (rank() + s) % size();
        int from = (rank() - s + size()) % size();
        if (out[from].numel > 0) post_recv(from, out[from]);
        if (in[to].numel > 0) post_send(to, in[to]);
      }
    });
  }

  void barrier() override {
    // The argument check is an all-gather: no rank leaves before all came.
    agree("barrier",
          make_call(Kind::kBarrier, DType::kF32, 0, -1, ReduceOp::kSum));
  }

  using ProcessGroup::new_group;
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          milliseconds timeout) override {
    const char* op = "new_group";
    Call c = make_call(Kind::kNewGroup, DType::kF32, ranks.size(), -1,
                       ReduceOp::kSum);
    uint64_t h = 1469598103934665603ull;
    for (int r : ranks) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ull;
    c.extra = h;
    if (ranks.empty()) c.local_error = "new_group needs at least one rank. ";
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size()) {
        c.local_error += "new_group rank " + std::to_string(ranks[i]) +
                         " is out of range for " + g_->where() +
                         " (valid: 0.." + std::to_string(size() - 1) + "). ";
      } else if (i > 0 && ranks[i] <= ranks[i - 1]) {
        c.local_error += "new_group ranks must be sorted and distinct; " +
                         std::to_string(ranks[i]) + " follows " +
                         std::to_string(ranks[i - 1]) + ". ";
      }
    }
    if (timeout.count() <= 0) {
      c.local_error += "new_group timeout must be positive, got " +
                       std::to_string(timeout.count()) + " ms. ";
    }
    agree(op, c);
    std::string child = g_->name + "/" + std::to_string(++children_);
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    if (it == ranks.end()) return nullptr;
    GroupOptions o;
    o.rank = static_cast<int>(it - ranks.begin());
    o.size = static_cast<int>(ranks.size());
    o.timeout = timeout;
    o.name = child;
    o.hostname = g_->hostname;
    o.iface = g_->iface;
    return joined(connect(o, g_->store));
  }

  static std::shared_ptr<GroupState> connect(const GroupOptions& o,
                                             std::shared_ptr<SharedStore> s);

  // The group over a connected mesh, returned once every rank has finished
  // connecting: a rank that destroyed its group the moment it was created
  // would otherwise close pairs that a slower rank is still setting up.
  static std::unique_ptr<ProcessGroup> joined(std::shared_ptr<GroupState> g) {
    auto pg = std::make_unique<GlooProcessGroup>(std::move(g));
    pg->barrier();
    return pg;
  }

 private:
  uint32_t next_tag() { return tag_++; }

  std::unique_ptr<Work> post(bool is_send, Tensor t, int peer, int tag) {
    std::string op =
        std::string(is_send ? "isend to rank " : "irecv from rank ") +
        std::to_string(peer) + " (tag " + std::to_string(tag) + ") on " +
        g_->where();
    if (peer < 0 || peer >= size()) {
      throw CommError(op + ": rank " + std::to_string(peer) +
                      " is out of range; valid ranks are 0.." +
                      std::to_string(size() - 1));
    }
    if (peer == rank()) {
      throw CommError(op +
                      ": a rank cannot send to or receive from itself; "
                      "copy the tensor instead");
    }
    if (tag < 0 || tag > kMaxTag) {
      throw CommError(op + ": tag must be in 0.." + std::to_string(kMaxTag));
    }
    std::string bad = check_tensor(t, "tensor");
    if (!bad.empty()) throw CommError(op + ": " + bad);
    if (t.nbytes() > kMaxP2pBytes) {
      throw CommError(op + ": " + std::to_string(t.nbytes()) +
                      " bytes; point-to-point tensors are limited to 128 GiB "
                      "(split the tensor)");
    }
    {
      std::lock_guard lock(g_->mu);
      if (!g_->inflight.insert({is_send ? 0 : 1, peer, tag}).second) {
        throw CommError(
            op + ": an earlier " + (is_send ? "isend to" : "irecv from") +
            " rank " + std::to_string(peer) + " with tag " +
            std::to_string(tag) +
            " is still in flight; wait() on its Work first or use another "
            "tag");
      }
    }
    return std::make_unique<P2pWork>(g_, is_send, t, peer, tag);
  }

  static std::string check_tensor(const Tensor& t, const std::string& what) {
    if (t.device.type != DeviceType::kCpu) {
      return "the gloo backend takes CPU tensors; " + what +
             " is on cuda:" + std::to_string(t.device.index) +
             " (use the nccl backend for GPU tensors). ";
    }
    if (t.data == nullptr && t.numel > 0) {
      return what + " has " + std::to_string(t.numel) +
             " elements but a null data pointer. ";
    }
    return {};
  }

  std::string check_root(int root) const {
    if (root < 0 || root >= size()) {
      return "root " + std::to_string(root) + " is out of range for " +
             g_->where() + " (valid: 0.." + std::to_string(size() - 1) + "). ";
    }
    return {};
  }

  std::string check_list(std::span<const Tensor> list, const char* what,
                         const Tensor& like) const {
    if (list.size() != static_cast<size_t>(size())) {
      return std::string(what) + " must hold one tensor per rank (" +
             std::to_string(size()) + "), got " + std::to_string(list.size()) +
             ". ";
    }
    std::string err;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string name = std::string(what) + "[" + std::to_string(i) + "]";
      err += check_tensor(list[i], name);
      if (list[i].numel != like.numel || list[i].dtype != like.dtype) {
        err += name + " has " + describe(list[i].dtype, list[i].numel) +
               ", expected " + describe(like.dtype, like.numel) +
               " like this rank's tensor. ";
      }
    }
    return err;
  }

  static void copy(const Tensor& dst, const Tensor& src) {
    if (dst.data != src.data && src.nbytes() > 0) {
      std::memcpy(dst.data, src.data, src.nbytes());
    }
  }

  // Throws if an earlier failure left the group unusable.
  void check_usable(const char* op) {
    std::lock_guard lock(g_->mu);
    if (!g_->broken.empty()) {
      throw CommError(std::string(op) + " on " + g_->where() +
                      ": the group is unusable after an earlier failure (" +
                      g_->broken + "); destroy it and create a new one");
    }
  }

  // Exchanges every rank's Call and throws the same CommError on every rank
  // when any rank's arguments are bad or differ from rank 0's.
  // With `offer`, its bytes travel with the arguments (the fused small
  // all_reduce) when they fit fused_capacity() and this rank's arguments
  // are valid (a bad tensor is never read); they land at payload_of(j) for
  // each peer j.
  void agree(const char* op, const Call& c, const Tensor* offer = nullptr) {
    check_usable(op);
    const size_t n = size();
    const size_t words = kFixedWords + 2 * n;
    std::vector<uint64_t> mine(words, 0);
    mine[0] = static_cast<uint64_t>(c.kind);
    mine[1] = static_cast<uint64_t>(c.dtype);
    mine[2] = c.numel;
    mine[3] = static_cast<uint64_t>(c.root);
    mine[4] = static_cast<uint64_t>(c.op);
    mine[5] = c.extra;
    mine[6] = c.local_error.empty() ? 0 : 1;
    for (size_t j = 0; j < c.send_counts.size() && j < n; ++j) {
      mine[kFixedWords + j] = c.send_counts[j];
      mine[kFixedWords + n + j] = c.recv_counts[j];
    }
    std::vector<uint64_t> all(words * n, 0);
    std::copy(mine.begin(), mine.end(), all.begin() + rank() * words);
    if (n > 1) {
      ensure_channel(op);  // fused_capacity() depends on it
      const Tensor* payload =
          offer && c.local_error.empty() && offer->nbytes() <= fused_capacity()
              ? offer
              : nullptr;
      if (channel_) {
        run(op, [&] { channel_exchange(mine, payload, all); });
      } else {
        run(op, [&] { all_gather_words(mine, payload, all); });
      }
    }
    auto word = [&](size_t r, size_t i) { return all[r * words + i]; };
    std::string prefix = std::string(op) + " on " + g_->where() + ": ";
    if (!c.local_error.empty()) throw CommError(prefix + c.local_error);
    for (size_t r = 0; r < n; ++r) {
      if (word(r, 0) != mine[0]) {
        throw CommError(prefix + "rank " + std::to_string(r) + " called " +
                        kind_name(word(r, 0)) + " while rank " +
                        std::to_string(rank()) + " called " + op +
                        "; every member must call the same collectives in "
                        "the same order");
      }
      if (word(r, 6) != 0) {
        throw CommError(prefix + "rank " + std::to_string(r) +
                        " rejected its arguments (its error names the "
                        "problem); every rank fails this call");
      }
    }
    for (size_t r = 1; r < n; ++r) {
      std::string vs = "rank " + std::to_string(r) + " passed ";
      if (word(r, 1) != word(0, 1) || word(r, 2) != word(0, 2)) {
        throw CommError(prefix + vs +
                        describe(static_cast<DType>(word(r, 1)), word(r, 2)) +
                        ", rank 0 passed " +
                        describe(static_cast<DType>(word(0, 1)), word(0, 2)) +
                        "; every rank must pass the same size and dtype");
      }
      if (word(r, 3) != word(0, 3)) {
        throw CommError(prefix + vs + "root " +
                        std::to_string(static_cast<int64_t>(word(r, 3))) +
                        ", rank 0 passed root " +
                        std::to_string(static_cast<int64_t>(word(0, 3))) +
                        "; every rank must name the same root");
      }
      if (word(r, 4) != word(0, 4)) {
        throw CommError(
            prefix + vs + "ReduceOp " +
            std::string(reduce_op_name(static_cast<ReduceOp>(word(r, 4)))) +
            ", rank 0 passed " +
            std::string(reduce_op_name(static_cast<ReduceOp>(word(0, 4)))) +
            "; every rank must use the same op");
      }
      if (word(r, 5) != word(0, 5)) {
        throw CommError(prefix + "rank " + std::to_string(r) +
                        " passed a different rank list than rank 0; every "
                        "member must pass the same sorted ranks");
      }
    }
    if (c.kind == Kind::kAllToAll) {
      for (size_t s = 0; s < n; ++s) {
        for (size_t d = 0; d < n; ++d) {
          uint64_t sent = word(s, kFixedWords + d);
          uint64_t expected = word(d, kFixedWords + n + s);
          if (sent != expected) {
            throw CommError(prefix + "rank " + std::to_string(s) + " sends " +
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
  void all_gather_words(const std::vector<uint64_t>& mine,
                        const Tensor* payload, std::vector<uint64_t>& all) {
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
        if (std::string(e.what()).find("Timed out") == std::string::npos) {
          throw;
        }
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

  // The argument check through the shared-memory channel: post this rank's
  // words (and payload), wait for every peer's, read their words in place.
  void channel_exchange(const std::vector<uint64_t>& mine,
                        const Tensor* payload, std::vector<uint64_t>& all) {
    const size_t wb = mine.size() * sizeof(uint64_t);
    channel_->post(
        {reinterpret_cast<const char*>(mine.data()), wb},
        payload ? std::span<const char>(static_cast<const char*>(payload->data),
                                        payload->nbytes())
                : std::span<const char>());
    channel_wait();
    for (int j = 0; j < size(); ++j) {
      if (j != rank()) {
        std::memcpy(all.data() + j * mine.size(), channel_->slot(j), wb);
      }
    }
  }

  // Waits for every peer's post of the current channel call, turning the
  // channel's error into the ones run() reports.
  void channel_wait() {
    try {
      channel_->wait(std::chrono::steady_clock::now() + timeout());
    } catch (const ShmChannel::WaitError& e) {
      if (e.timed_out) {
        throw RanksMissing(e.ranks, "Timed out in shared memory after " +
                                        ms_text(timeout()) +
                                        " waiting for peers");
      }
      throw RanksGone(e.ranks);
    }
  }

  // Sets up the channel on the group's first collective when every rank
  // shares this host and shared memory is on; every rank ends with one or
  // every rank without.
  void ensure_channel(const char* op) {
    if (channel_tried_) return;
    channel_tried_ = true;
    if (size() < 2 || !g_->all_local || g_->shm_min_bytes == SIZE_MAX) return;
    run(op, [&] {
      std::string error;
      auto ch = std::make_unique<ShmChannel>(
          "/dlaunch-" + g_->shm_token + "-c-", rank(), size(),
          words_bytes() + channel_fused_capacity(), error);
      if (!every_rank(ch->ok())) return;
      bool ok = ch->open_peers(error);
      bool everyone = every_rank(ok);
      ch->unlink();  // every rank has mapped it or given up
      if (everyone) channel_ = std::move(ch);
    });
  }

  // A barrier between ranks on one host (the shared-memory all_reduce).
  void local_barrier() {
    if (channel_) {
      channel_->post({}, {});
      channel_wait();
    } else {
      control_exchange(1);
    }
  }

  size_t words_bytes() const {
    return (kFixedWords + 2 * size()) * sizeof(uint64_t);
  }

  size_t check_slot_bytes() const {
    return words_bytes() + tcp_fused_capacity();
  }

  // Whether `ok` holds on every rank (the same answer everywhere).
  bool every_rank(bool ok) {
    auto all = control_exchange(ok);
    return std::all_of(all.begin(), all.end(), [](uint64_t w) { return w; });
  }

  // Every rank's `word`, in rank order: a small all-to-all that doubles as
  // a barrier (Gloo errors propagate to run()).
  std::vector<uint64_t> control_exchange(uint64_t word) {
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

  // All-reduce through shared memory between ranks on one host: each rank
  // copies its tensor into its segment, reduces its 1/n chunk reading every
  // segment (in rank order, so all ranks agree bitwise), publishes it in its
  // segment, and copies the others' chunks out. Three barriers, no bulk
  // data through the kernel. False (on every rank alike) when a segment
  // cannot be set up; the group then stays on TCP.
  bool shm_all_reduce(Tensor t, ReduceOp rop) {
    // Slices bound the shared memory a group holds (size() segments of at
    // most kShmSliceBytes).
    const size_t es = dtype_size(t.dtype);
    const size_t slice = std::max<size_t>(1, kShmSliceBytes / es);
    for (size_t off = 0; off < t.numel; off += slice) {
      Tensor part = t;
      part.data = static_cast<char*>(t.data) + off * es;
      part.numel = std::min(slice, t.numel - off);
      if (!shm_all_reduce_slice(part, rop)) {
        DLAUNCH_CHECK(off == 0, "shared memory turned off mid all_reduce");
        return false;
      }
    }
    return true;
  }

  bool shm_all_reduce_slice(Tensor t, ReduceOp rop) {
    const size_t bytes = t.nbytes();
    const int n = size();
    const int r = rank();
    if (shm_cap_ < bytes && !shm_grow(bytes)) return false;
    auto seg = [&](int j) {
      return j == r ? shm_mine_.data() : shm_peers_[j].data();
    };
    const size_t es = dtype_size(t.dtype);
    const size_t per = (t.numel + n - 1) / n;
    auto chunk = [&](int j) {
      size_t b = std::min(t.numel, per * j);
      return std::pair<size_t, size_t>(b, std::min(t.numel, b + per) - b);
    };
    std::memcpy(seg(r), t.data, bytes);
    local_barrier();  // every input is in place
    ReduceFn fn = reduce_fn(t.dtype, rop);
    auto [b, count] = chunk(r);
    if (count > 0) {
      char* out = static_cast<char*>(t.data) + b * es;
      fn(out, seg(0) + b * es, seg(1) + b * es, count);
      for (int j = 2; j < n; ++j) fn(out, out, seg(j) + b * es, count);
      std::memcpy(seg(r) + b * es, out, count * es);
    }
    local_barrier();  // every chunk is reduced
    for (int j = 0; j < n; ++j) {
      auto [jb, jc] = chunk(j);
      if (j != r && jc > 0) {
        std::memcpy(static_cast<char*>(t.data) + jb * es, seg(j) + jb * es,
                    jc * es);
      }
    }
    local_barrier();  // nobody reads the segments any more
    return true;
  }

  // Replaces the segments with ones of at least `bytes` (rounded up to
  // 1 MiB). Every rank creates its own, all map all, then names are
  // unlinked; a failure anywhere turns shared memory off on every rank.
  bool shm_grow(size_t bytes) {
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

  // Largest all_reduce (bytes per rank) whose data travels with its
  // arguments in one message to each peer: one round trip instead of the
  // ring's 2(n-1), for (n-1) times the traffic, so small totals only.
  // A multiple of 64 bytes, so that every slot's payload stays aligned for
  // any dtype (the words before it are 8-byte multiples too).
  size_t tcp_fused_capacity() const {
    return size() > 1 ? g_->fused_bytes / (size() - 1) / 64 * 64 : 0;
  }
  // Through the channel the payload costs no traffic, only a copy: every
  // all_reduce below the shared-memory threshold (up to
  // kChannelPayloadBytes) goes with the check, unless fusing is off.
  size_t channel_fused_capacity() const {
    if (g_->fused_bytes == 0 || g_->shm_min_bytes == 0) return 0;
    return std::min(g_->shm_min_bytes - 1, kChannelPayloadBytes) / 64 * 64;
  }
  size_t fused_capacity() const {
    return channel_ ? channel_fused_capacity() : tcp_fused_capacity();
  }
  // Scratch memory kept across calls (a fresh 64 MiB allocation per call
  // costs page faults on every call).
  char* work_buffer(int which, size_t bytes) {
    if (work_[which].size() < bytes) work_[which].resize(bytes);
    return work_[which].data();
  }

  // Rank j's fused payload of the last check.
  const char* payload_of(int j) {
    return channel_ ? channel_->slot(j) + words_bytes() : tcp_payload_of(j);
  }
  // Where rank j's fused payload lands in a check over Gloo messages.
  char* tcp_payload_of(int j) {
    return scratch_.data() + j * check_slot_bytes() + words_bytes();
  }

  // Posts point-to-point transfers chosen by `plan` on one fresh tag and
  // waits for all of them (gather, scatter, all_gather, all_to_all).
  template <class Plan>
  void exchange(const char* op, uint64_t prefix, Plan&& plan) {
    run(op, [&] {
      const uint32_t tag = next_tag();
      std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> sends;
      std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> recvs;
      auto post_send = [&](int to, const Tensor& t) {
        sends.push_back(g_->ctx->createUnboundBuffer(t.data, t.nbytes()));
        sends.back()->send(to, coll_slot(prefix, tag));
      };
      auto post_recv = [&](int from, const Tensor& t) {
        recvs.push_back(g_->ctx->createUnboundBuffer(t.data, t.nbytes()));
        recvs.back()->recv(from, coll_slot(prefix, tag));
      };
      plan(post_send, post_recv);
      const auto deadline = std::chrono::steady_clock::now() + timeout();
      for (auto& b : recvs) b->waitRecv(left_until(deadline));
      for (auto& b : sends) b->waitSend(left_until(deadline));
    });
  }

  // Ring reduce-scatter: at step s rank r forwards its partial sum of chunk
  // (r - s - 1) to r + 1 and receives chunk (r - s - 2) from r - 1, adding
  // its own contribution; after size() - 1 steps it holds chunk r reduced
  // over all ranks. Each rank sends (n - 1) / n of the data once.
  void ring_reduce_scatter(Tensor out, std::span<const Tensor> in,
                           ReduceOp rop) {
    const int n = size();
    const int r = rank();
    const size_t bytes = out.nbytes();
    const uint32_t tag = next_tag();
    ReduceFn fn = reduce_fn(out.dtype, rop);
    char* send_buf = work_buffer(0, bytes);
    char* recv_buf = work_buffer(1, bytes);
    auto sbuf = g_->ctx->createUnboundBuffer(send_buf, bytes);
    auto rbuf = g_->ctx->createUnboundBuffer(recv_buf, bytes);
    const int right = (r + 1) % n;
    const int left = (r - 1 + n) % n;
    std::memcpy(send_buf, in[(r - 1 + n) % n].data, bytes);
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (int s = 0; s < n - 1; ++s) {
      const int chunk = (r - s - 2 + 2 * n) % n;
      rbuf->recv(left, coll_slot(kReduceScatterSlot, tag, s));
      sbuf->send(right, coll_slot(kReduceScatterSlot, tag, s));
      rbuf->waitRecv(left_until(deadline));
      sbuf->waitSend(left_until(deadline));
      void* dst = (s == n - 2) ? out.data : send_buf;
      fn(dst, in[chunk].data, recv_buf, out.numel);
    }
  }

  // Runs Gloo work; on failure marks the group unusable, tells the store
  // and closes this rank's connections so that peers blocked on it fail now
  // rather than at their timeout, then throws a CommError naming the
  // operation, the group and the peer.
  template <class F>
  void run(const char* op, F&& f) {
    try {
      f();
    } catch (const RanksMissing& e) {
      fail(op, e.what(), e.missing);
    } catch (const RanksGone& e) {
      fail(op, e.what(), {}, e.gone);
    } catch (const ::gloo::Exception& e) {
      fail(op, e.what(), {});
    }
  }

  [[noreturn]] void fail(const char* op, const std::string& what,
                         const std::vector<int>& missing,
                         const std::vector<int>& gone = {}) {
    const bool timed_out = what.find("Timed out") != std::string::npos ||
                           what.find("timeout") != std::string::npos;
    const std::vector<int> failed = !gone.empty() ? gone
                                    : missing.empty() && !timed_out
                                        ? g_->failed_peers()
                                        : std::vector<int>{};
    const int peer = failed.size() == 1 ? failed[0] : -1;
    std::string msg = std::string(op) + " on " + g_->where() + " failed: ";
    if (!missing.empty()) {
      msg += "timed out after " + ms_text(timeout()) + " waiting for " +
             rank_list(missing) + " to call " + op + " (" +
             std::to_string(size() - 1 - missing.size()) + "/" +
             std::to_string(size() - 1) + " peers arrived)";
    } else if (!gone.empty()) {
      msg += rank_list(gone) + (gone.size() == 1 ? " has" : " have") +
             " left the group while this rank waited for it (it failed, "
             "exited or destroyed the group)";
    } else if (peer >= 0) {
      msg += "connection to rank " + std::to_string(peer) + " lost";
    } else if (!failed.empty()) {
      msg += "connections to " + rank_list(failed) + " lost";
    } else if (timed_out) {
      msg += "timed out after " + ms_text(timeout()) +
             " waiting for the other ranks (none reported a failure)";
    } else {
      msg += "transport error";
    }
    const std::string abort_key = g_->name + "/abort";
    std::string cause;
    try {
      std::lock_guard lock(g_->store->mu);
      auto& s = *g_->store->store;
      if (s.check({abort_key})) cause = s.get(abort_key);
      if (cause.empty()) {
        s.compare_set(abort_key, "",
                      "rank " + std::to_string(rank()) + ": " + msg);
      }
    } catch (const std::exception&) {
      // The store may have died with the failed peer; the message stands.
    }
    if (!cause.empty()) msg += " (first failure, " + cause + ")";
    msg += " [gloo: " + what + "]";
    {
      std::lock_guard lock(g_->mu);
      if (g_->broken.empty()) g_->broken = msg;
    }
    g_->ctx->closeConnections();
    if (channel_) channel_->close();  // peers waiting in shared memory too
    if (!missing.empty() || (timed_out && peer < 0)) {
      throw CommTimeoutError(msg);
    }
    throw CommError(msg);
  }

  std::shared_ptr<GroupState> g_;
  std::vector<char> staging_;  // this rank's arguments (+ fused payload)
  // Every rank's arguments (+ fused payload), one slot each.
  std::vector<char> scratch_;
  std::vector<char> work_[2];  // see work_buffer()
  // Shared-memory all_reduce (ranks on one host): this rank's segment, the
  // peers' (index = rank), their size and generation.
  ShmSegment shm_mine_;
  std::vector<ShmSegment> shm_peers_;
  size_t shm_cap_ = 0;
  uint32_t shm_gen_ = 0;
  bool shm_off_ = false;
  uint32_t check_seq_ = 0;  // number of the next argument check
  // The shared-memory meeting point of ranks on one host (ensure_channel).
  std::unique_ptr<ShmChannel> channel_;
  bool channel_tried_ = false;
  uint32_t tag_ = 1;
  int children_ = 0;
};

std::shared_ptr<GroupState> GlooProcessGroup::connect(
    const GroupOptions& o, std::shared_ptr<SharedStore> s) {
  auto g = std::make_shared<GroupState>();
  g->name = o.name;
  g->rank = o.rank;
  g->size = o.size;
  g->timeout = o.timeout;
  g->store = std::move(s);
  g->hostname = o.hostname;
  g->iface = o.iface;
  g->fused_bytes = env_bytes("DLAUNCH_COMM_FUSED_BYTES", kFusedTrafficBytes);
  g->shm_min_bytes = env_bytes("DLAUNCH_COMM_SHM_MIN_BYTES", kShmMinBytes);
  const std::string where = "creating " + g->where();
  try {
    tcp::attr attr;
    if (o.iface.empty()) {
      attr.hostname = o.hostname;
    } else {
      attr.iface = o.iface;
    }
    g->device = tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError(where + ": cannot listen on " +
                    (o.iface.empty() ? "host '" + o.hostname + "'"
                                     : "interface '" + o.iface + "'") +
                    " (set GLOO_SOCKET_IFNAME or MASTER_ADDR to an address "
                    "of this machine): " +
                    e.what());
  }
  g->ctx = std::make_shared<::gloo::rendezvous::Context>(o.rank, o.size);
  g->ctx->setTimeout(o.timeout);
  StoreAdapter adapter(g->store, o.name, o.timeout);
  try {
    g->ctx->connectFullMesh(adapter, g->device);
  } catch (const store::StoreTimeoutError& e) {
    throw CommTimeoutError(where + ": not every rank joined within " +
                           ms_text(o.timeout) + ": " + e.what());
  } catch (const std::exception& e) {
    throw CommError(where +
                    ": connecting to the other ranks failed: " + e.what());
  }
  // Rank 0's tuning holds for every rank (their choices must agree), and
  // ranks that all share this host get a token naming their shared memory.
  try {
    auto put = [&](const std::string& k, const std::string& v) {
      adapter.set(k, std::vector<char>(v.begin(), v.end()));
    };
    auto take = [&](const std::string& k) {
      auto v = adapter.get(k);
      return std::string(v.begin(), v.end());
    };
    const std::string me = host_identity();
    put("host/" + std::to_string(o.rank), me);
    if (o.rank == 0) {
      put("tuning", std::to_string(g->fused_bytes) + " " +
                        std::to_string(g->shm_min_bytes) + " " +
                        random_token());
    }
    std::string tuning = take("tuning");
    unsigned long long fused = 0, shm_min = 0;
    char token[64] = {};
    if (std::sscanf(tuning.c_str(), "%llu %llu %63s", &fused, &shm_min,
                    token) != 3) {
      throw CommError(where + ": rank 0 published bad tuning '" + tuning + "'");
    }
    g->fused_bytes = static_cast<size_t>(fused);
    g->shm_min_bytes = static_cast<size_t>(shm_min);
    g->shm_token = token;
    g->all_local = true;
    for (int j = 0; j < o.size; ++j) {
      if (j != o.rank && take("host/" + std::to_string(j)) != me) {
        g->all_local = false;
      }
    }
  } catch (const store::StoreError& e) {
    throw CommError(where +
                    ": exchanging host information failed: " + e.what());
  }
  return g;
}

}  // namespace

namespace {

// Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that
// just died raises SIGPIPE, whose default action kills the process without
// a word, before the error could be reported. Ignore it, as Python (and so
// torch) does, unless the program installed its own handling.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      sigaction(SIGPIPE, &ign, nullptr);
    }
  });
}

}  // namespace

std::unique_ptr<ProcessGroup> create_process_group(const GroupOptions& o) {
  ignore_sigpipe_once();
  if (!o.store) throw CommError("gloo::create_process_group: no store given");
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    throw CommError(
        "gloo::create_process_group: rank " + std::to_string(o.rank) +
        " is out of range for world size " + std::to_string(o.size) +
        " (need world size >= 1 and 0 <= rank < world size)");
  }
  if (o.timeout.count() <= 0) {
    throw CommError(
        "gloo::create_process_group: timeout must be positive, "
        "got " +
        std::to_string(o.timeout.count()) + " ms");
  }
  auto shared = std::make_shared<SharedStore>();
  shared->store = o.store;
  shared->thread_safe = o.store_thread_safe;
  shared->clone = o.store_clone;
  shared->owned = o.owned;
  return GlooProcessGroup::joined(
      GlooProcessGroup::connect(o, std::move(shared)));
}

}  // namespace dlaunch::comm::gloo
