#pragma once

// Internal to the gloo backend (not a public header): the GlooProcessGroup
// class and what its files share. Which file holds which path: see
// comm/README.md ("Inside the gloo backend").

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "comm/check.h"
#include "comm/gloo/connection_watch.h"
#include "comm/gloo/process_group.h"
#include "comm/gloo/shm_channel.h"
#include "comm/gloo/shm_p2p.h"
#include "comm/gloo/shm_segment.h"
#include "comm/gloo/store_adapter.h"
#include "comm/op.h"
#include "comm/process_group.h"
#include "comm/store/text.h"
#include "comm/work_queue.h"

namespace dlaunch::comm::gloo {

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
// Collectives with at least this many bytes per rank between ranks that
// share a host go through shared-memory segments, smaller ones travel with
// the argument check (DLAUNCH_COMM_SHM_MIN_BYTES; "off" disables).
constexpr size_t kShmMinBytes = 1 << 20;
// Between ranks on one host the argument check meets in shared memory
// (ShmChannel), and collectives below kShmMinBytes travel with it, up to
// this many bytes per rank (each rank's channel holds two slots).
constexpr size_t kChannelPayloadBytes = 1 << 20;
constexpr uint64_t kControlSlot = 0xB4;
constexpr uint64_t kWatchSlot = 0xB5;  // see ConnectionWatch
// Above the channel's payload, collectives between ranks on one host move
// their data through per-rank segments in pipelined steps: each step moves
// up to this many bytes per piece (small enough to stay in the cache between
// a rank's write and its peers' reads), and a segment holds this many steps
// (a writer runs at most that far ahead of its slowest reader).
constexpr size_t kShmChunkBytes = 256 << 10;
constexpr size_t kShmDepth = 4;

inline uint64_t p2p_slot(uint64_t prefix, int tag) {
  return (prefix << 56) | (static_cast<uint64_t>(tag) << 40);
}
inline uint64_t payload_slot(int tag, uint32_t dtype, uint64_t nbytes) {
  return p2p_slot(kP2pPayload, tag) | (static_cast<uint64_t>(dtype) << 37) |
         (nbytes & kMaxP2pBytes);
}
inline uint64_t coll_slot(uint64_t prefix, uint32_t tag, uint32_t sub = 0) {
  return (prefix << 56) | (static_cast<uint64_t>(tag) << 24) | (sub & 0xffffff);
}

// Time left until `deadline`, at least 1 ms (Gloo reads 0 as "no timeout"
// in places): every wait of one operation shares one deadline. Rounded up,
// so that a wait Gloo ends at its timeout ends at or after the deadline,
// which is how callers tell a timeout from a failure.
inline milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::ceil<milliseconds>(deadline -
                                              std::chrono::steady_clock::now());
  return std::max(left, milliseconds(1));
}

// "250 ms", "30 s": the store's wording (comm/store/text.h), one helper.
inline std::string ms_text(milliseconds t) { return store::format_duration(t); }

// "rank 2", "rank 0 and rank 2", "rank 0, rank 1 and rank 2": each rank
// named in full, so that messages can be searched for "rank N".
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += "rank " + std::to_string(ranks[i]);
  }
  return out;
}

inline std::string describe(DType dtype, uint64_t numel) {
  return std::to_string(numel) + " elements of " +
         std::string(dtype_name(dtype));
}

// An operation waiting on one peer, which the connection watch can stop.
class PeerWaiter {
 public:
  virtual ~PeerWaiter() = default;
  virtual int peer() const = 0;
  // Makes the operation's waits return at once (under GroupState::mu).
  virtual void abort() = 0;
};

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
  std::string host;        // this rank's host identity
  std::vector<std::string> hosts;  // every rank's, index = rank
  std::string shm_token;           // names this group's segments, from rank 0

  std::mutex mu;  // guards the members below
  // (direction 0 send / 1 recv, peer, tag) of p2p operations over TCP in
  // flight (over shared memory the engine keeps them, ShmP2p::claim):
  // a few at a time, kept in a vector so that an operation allocates
  // nothing here (a set's node was a malloc and a free per message).
  std::vector<std::tuple<int, int, int>> inflight;
  // First fatal error; non-empty: collectives refuse to run.
  std::string broken;

  std::string where() const {
    return "group '" + name + "' (rank " + std::to_string(rank) + " of " +
           std::to_string(size) + ")";
  }
  // Peers whose connection has failed (see gloo::failed_peers).
  std::vector<int> failed_peers() const {
    return gloo::failed_peers(*ctx, rank, size);
  }

  // Called by `watch` when connections fail: remembers the ranks and aborts
  // the point-to-point operations waiting on them.
  void connections_lost(const std::vector<int>& ranks,
                        const std::string& what) {
    std::lock_guard lock(mu);
    for (int r : ranks) lost.emplace(r, what);
    for (PeerWaiter* w : waiters) {
      if (lost.count(w->peer())) w->abort();
    }
    if (p2p) p2p->peers_lost(ranks);  // takes no lock
  }

  // Ranks whose connection failed, with Gloo's message (under mu).
  std::map<int, std::string> lost;
  // Point-to-point operations now waiting (under mu).
  std::set<PeerWaiter*> waiters;
  // Point to point between ranks on this host (set once at set-up, under
  // mu; null: every pair over TCP).
  std::unique_ptr<ShmP2p> p2p;
  // Tells connections_lost() at once when a connection fails. Last, so
  // that it stops before anything it uses goes away.
  std::unique_ptr<ConnectionWatch> watch;
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

// What one rank passed to a collective; exchanged before the data moves so
// that every rank detects a mismatch identically (and Gloo never sees
// buffers of different sizes, which it cannot survive).
struct Call {
  Op kind = Op::kBarrier;
  DType dtype = DType::kF32;
  uint64_t numel = 0;
  int64_t root = -1;
  ReduceOp op = ReduceOp::kSum;
  uint64_t extra = 0;  // new_group: hash of the ranks
  // all_to_all: the tensors to and from each rank (their numel is
  // exchanged); views, so that a call allocates nothing.
  std::span<const Tensor> sends;
  std::span<const Tensor> recvs;
  std::string local_error;  // bad arguments on this rank
};

inline Call make_call(Op kind, DType dtype, uint64_t numel, int64_t root,
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

// A copy within one rank (a collective's own piece); src.size() bytes.
struct LocalCopy {
  std::span<char> dst;
  std::span<const char> src;
};

// One pipelined pass through the shared-memory segments: at step k every
// rank that produces writes its share into its area for step k, then each
// rank reads the areas of `sources` for step k once their writers are done.
struct ShmSteps {
  size_t count = 0;          // number of steps
  size_t per_step = 0;       // elements of a piece moved per step
  size_t piece_bytes = 0;    // where piece j of an area starts: j * this
  size_t area_bytes = 0;     // bytes a rank's area holds per step
  bool produces = false;     // whether this rank writes its area
  std::vector<int> sources;  // ranks whose areas this rank reads
  std::function<void(size_t k, char* area)> produce;
  // area[j]: rank j's area for step k (read only those of `sources`).
  std::function<void(size_t k, const std::vector<const char*>& area)> consume;
};

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

  // tcp_collectives.cc: the collectives and their TCP paths.
  void broadcast(Tensor t, int root) override;
  void reduce(Tensor t, int root, ReduceOp rop) override;
  void all_reduce(Tensor t, ReduceOp rop) override;
  void scatter(Tensor out, std::span<const Tensor> in, int root) override;
  void gather(Tensor in, std::span<const Tensor> out, int root) override;
  void all_gather(std::span<const Tensor> out, Tensor in) override;
  void reduce_scatter(Tensor out, std::span<const Tensor> in,
                      ReduceOp rop) override;
  void all_to_all(std::span<const Tensor> out,
                  std::span<const Tensor> in) override;

  // agree.cc: the argument check every collective starts with.
  void barrier() override;

  // process_group.cc: group set-up and failure handling.
  using ProcessGroup::new_group;
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          milliseconds timeout) override;

  // `host`: this rank's host identity (a sub-group's parent's); empty:
  // this machine's. `abandon`: see StoreAdapter (a sub-group's: a member
  // gone from the parent).
  static std::shared_ptr<GroupState> connect(
      const GroupOptions& o, std::shared_ptr<SharedStore> s,
      const std::string& host = "", std::function<std::string()> abandon = {});
  static std::unique_ptr<ProcessGroup> joined(std::shared_ptr<GroupState> g);

  // The path the group's last operation took (see last_path()).
  const char* path() const { return path_; }
  // The ranks whose connection failed (see lost_peers()).
  std::vector<int> lost_peers() const {
    std::lock_guard lock(g_->mu);
    std::vector<int> out;
    for (const auto& [r, what] : g_->lost) out.push_back(r);
    return out;
  }

  // p2p.cc: point to point (shared memory between ranks on one host).
  // The base's default tag, so that calls through this type compile as
  // through ProcessGroup.
  std::unique_ptr<Work> isend(Tensor t, int dst, int tag = 0) override;
  std::unique_ptr<Work> irecv(Tensor t, int src, int tag = 0) override;
  void send(Tensor t, int dst, int tag = 0) override;
  void recv(Tensor t, int src, int tag = 0) override;

  // async.cc: the asynchronous collectives, run in call order on async_
  // (started by the first); the destructor runs what is queued first.
  ~GlooProcessGroup() override;
  std::unique_ptr<Work> ibroadcast(Tensor t, int root) override;
  std::unique_ptr<Work> ireduce(Tensor t, int root, ReduceOp rop) override;
  std::unique_ptr<Work> iall_reduce(Tensor t, ReduceOp rop) override;
  std::unique_ptr<Work> iscatter(Tensor out, std::span<const Tensor> in,
                                 int root) override;
  std::unique_ptr<Work> igather(Tensor in, std::span<const Tensor> out,
                                int root) override;
  std::unique_ptr<Work> iall_gather(std::span<const Tensor> out,
                                    Tensor in) override;
  std::unique_ptr<Work> ireduce_scatter(Tensor out, std::span<const Tensor> in,
                                        ReduceOp rop) override;
  std::unique_ptr<Work> iall_to_all(std::span<const Tensor> out,
                                    std::span<const Tensor> in) override;
  std::unique_ptr<Work> ibarrier() override;

 private:
  uint32_t next_tag() { return tag_++; }
  void took(const char* path) { path_ = path; }

  // p2p.cc
  std::unique_ptr<Work> post(bool is_send, Tensor t, int peer, int tag);
  void blocking(bool is_send, Tensor t, int peer, int tag);
  bool admit(bool is_send, const Tensor& t, int peer, int tag);
  void unclaim(bool shm, bool is_send, int peer, int tag);
  void setup_shm_p2p();

  // agree.cc
  // What is wrong with `t` ("" when nothing), naming it `what` (with
  // "[index]" appended when index >= 0); formats text only for a bad one.
  static std::string check_tensor(const Tensor& t, std::string_view what,
                                  int index = -1);
  std::string check_root(int root) const;
  std::string check_list(std::span<const Tensor> list, const char* what,
                         const Tensor& like) const;
  void check_usable(const char* op);
  void agree(const char* op, const Call& c, std::span<const Tensor> offer = {},
             int skip = -1);
  void all_gather_words(const std::vector<uint64_t>& mine,
                        const Tensor* payload, std::vector<uint64_t>& all);
  size_t words_bytes() const;
  size_t check_slot_bytes() const;
  bool every_rank(bool ok);
  std::vector<uint64_t> control_exchange(uint64_t word);
  size_t tcp_fused_capacity() const;
  size_t fused_capacity() const;
  const char* payload_of(int j);
  char* tcp_payload_of(int j);

  // shm_collectives.cc: the shared-memory paths (ranks on one host).
  void channel_exchange(const std::vector<uint64_t>& mine,
                        std::span<const Tensor> payload, int skip,
                        std::vector<uint64_t>& all);
  void channel_wait();
  [[noreturn]] void channel_failed(const ShmChannel::WaitError& e);
  void ensure_channel(const char* op);
  void local_barrier();
  bool shm_grow(size_t bytes);
  size_t channel_fused_capacity() const;
  bool with_check(size_t bytes) const;
  bool shm_ready() const;

  // shm_ops.cc: every collective between ranks on one host (false when the
  // group is not on one host or its segments cannot be set up; the caller
  // then takes the TCP path).
  bool shm_broadcast(Tensor t, int root);
  bool shm_reduce(Tensor t, int root, ReduceOp rop);
  bool shm_all_reduce(Tensor t, ReduceOp rop);
  bool shm_scatter(Tensor out, std::span<const Tensor> in, int root);
  bool shm_gather(Tensor in, std::span<const Tensor> out, int root);
  bool shm_reduce_scatter(Tensor out, std::span<const Tensor> in, ReduceOp rop);
  bool shm_all_to_all(std::span<const Tensor> out, std::span<const Tensor> in);
  bool shm_steps(const ShmSteps& s);

  // shm_cma.cc: single copy through the kernel between ranks on one host.
  // srcs[d]: this rank's bytes for rank d; dsts[s]: where it wants rank s's
  // (both empty where none); `local`: this rank's own piece, copied while
  // peers copy. False, on every rank alike, when the call is to take the
  // segment steps instead (`local` then not copied).
  bool shm_cma(std::span<const std::span<const char>> srcs,
               std::span<const std::span<char>> dsts, LocalCopy local = {});
  static bool cma_allowed();
  uint64_t agreed_count(int from, int to) const;

  // hierarchical.cc: groups spanning hosts, some holding several ranks.
  bool hier_all_reduce(Tensor t, ReduceOp rop);
  bool ensure_hierarchy();

  // tcp_collectives.cc
  static void copy(const Tensor& dst, const Tensor& src);
  char* work_buffer(int which, size_t bytes);
  template <class Plan>
  void exchange(const char* op, uint64_t prefix, Plan&& plan);
  void ring_reduce_scatter(Tensor out, std::span<const Tensor> in,
                           ReduceOp rop);

  // Runs Gloo work; on failure marks the group unusable, tells the store
  // and closes this rank's connections so that peers blocked on it fail now
  // rather than at their timeout, then throws a CommError naming the
  // operation, the group and the peer.
  // A Gloo error counts as a timeout when the group timeout has passed since
  // `f` started (every wait inside shares a deadline at least that far).
  template <class F>
  void run(const char* op, F&& f) {
    const auto start = std::chrono::steady_clock::now();
    try {
      f();
    } catch (const RanksMissing& e) {
      fail(op, e.what(), e.missing, {}, true);
    } catch (const RanksGone& e) {
      fail(op, e.what(), {}, e.gone, false);
    } catch (const ::gloo::Exception& e) {
      fail(op, e.what(), {}, {},
           std::chrono::steady_clock::now() - start >= timeout());
    }
  }

  // process_group.cc
  [[noreturn]] void fail(const char* op, const std::string& what,
                         const std::vector<int>& missing,
                         const std::vector<int>& gone, bool timed_out);

  std::shared_ptr<GroupState> g_;
  std::vector<char> staging_;  // this rank's arguments (+ fused payload)
  // Every rank's arguments (+ fused payload), one slot each.
  std::vector<char> scratch_;
  std::vector<char> work_[2];     // see work_buffer()
  std::vector<uint64_t> agreed_;  // every rank's words of the last check
  std::vector<uint64_t> mine_;    // this rank's words of the last check
  std::vector<std::span<const char>> parts_;  // see channel_exchange()
  const char* path_ = "none";                 // see last_path()
  // Shared-memory segment steps (ranks on one host): this rank's segment,
  // the peers' (index = rank), their size and generation.
  ShmSegment shm_mine_;
  std::vector<ShmSegment> shm_peers_;
  size_t shm_cap_ = 0;
  uint32_t shm_gen_ = 0;
  bool shm_off_ = false;
  // Single copy (shm_cma) may be tried: DLAUNCH_COMM_CMA is "on" and no
  // copy was refused yet.
  bool cma_ = false;
  uint32_t check_seq_ = 0;  // number of the next argument check
  // The shared-memory meeting point of ranks on one host (ensure_channel).
  std::unique_ptr<ShmChannel> channel_;
  bool channel_tried_ = false;
  uint32_t tag_ = 1;
  int children_ = 0;
  // The hierarchy (ensure_hierarchy): this rank's host's group, and the
  // group of one leader per host (null on the other ranks).
  bool hier_tried_ = false;
  std::unique_ptr<ProcessGroup> local_;
  std::unique_ptr<ProcessGroup> leaders_;
  std::vector<int> local_ranks_, leader_ranks_;  // their members, world ranks
  // The ranks the failure named late to the call (fail()); the hierarchy
  // names a sub-group's in the world's ranks.
  std::vector<int> failed_missing_;
  // async.cc
  std::unique_ptr<Work> enqueue(const char* op, std::function<void()> fn);
  uint64_t async_seq_ = 0;  // number of the next asynchronous operation
  // Runs the asynchronous collectives; a blocking call first drains it
  // (check_usable), so that all run in call order.
  WorkQueue async_;
};

}  // namespace dlaunch::comm::gloo
