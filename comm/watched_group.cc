#include "comm/watched_group.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/fault_spec.h"
#include "comm/op.h"
#include "comm/progress.h"
#include "comm/say.h"

namespace dlaunch::comm {

namespace {

// One DLAUNCH_COMM_FAULTS entry that applies to this rank and attempt.
struct CommFault {
  enum class Action { kFail, kExit, kKill, kStall };
  Action action = Action::kFail;
  Op op = Op::kNone;
  uint64_t call = 1;  // 1-based
  int code = 1;
  int signal = SIGKILL;
  std::optional<std::chrono::milliseconds> stall;  // unset: for ever
  std::string spec;
};

Op op_by_name(const FaultSpec& s, const std::string& name) {
  if (std::optional<Op> op = op_from_name(name)) return *op;
  s.fail("op='" + name +
         "' is not an operation; use send, recv, broadcast, reduce, "
         "all_reduce, scatter, gather, all_gather, reduce_scatter, "
         "all_to_all, barrier, wait or new_group");
}

// Parses `text`; nullopt when it is for another rank or attempt. A rank
// outside a world of `size` is an error in the attempt the fault is for.
std::optional<CommFault> parse_comm_fault(const std::string& text, int rank,
                                          int size, int attempt) {
  FaultSpec s(text);
  CommFault f;
  f.spec = text;
  const std::string& kind = s.kind();
  if (kind == "fail") {
    f.action = CommFault::Action::kFail;
    s.allow({"rank", "op", "call", "attempt"});
  } else if (kind == "exit") {
    f.action = CommFault::Action::kExit;
    s.allow({"rank", "op", "call", "attempt", "code"});
  } else if (kind == "kill") {
    f.action = CommFault::Action::kKill;
    s.allow({"rank", "op", "call", "attempt", "signal"});
  } else if (kind == "stall") {
    f.action = CommFault::Action::kStall;
    s.allow({"rank", "op", "call", "attempt", "for"});
  } else {
    s.fail("unknown kind '" + kind +
           "' in DLAUNCH_COMM_FAULTS; use fail, exit, kill or stall");
  }
  s.require("rank", kind + ":rank=1:op=all_reduce:call=3");
  s.require("op", kind + ":rank=1:op=all_reduce:call=3");
  const int want_rank = *s.integer("rank", 0, 1 << 24);
  f.op = op_by_name(s, *s.value("op"));
  f.call = static_cast<uint64_t>(s.integer("call", 1, 1 << 30).value_or(1));
  const int want_attempt = s.integer("attempt", 0, 1 << 20).value_or(0);
  f.code = s.integer("code", 1, 255).value_or(1);
  f.signal = s.signal("signal").value_or(SIGKILL);
  f.stall = s.seconds("for");
  if (want_attempt == attempt && want_rank >= size) {
    s.fail("rank " + std::to_string(want_rank) +
           " is out of range: " + std::to_string(size) + " workers (ranks 0.." +
           std::to_string(size - 1) + "); give a rank of the job");
  }
  if (want_rank != rank || want_attempt != attempt) return std::nullopt;
  return f;
}

}  // namespace

class WatchState {
 public:
  WatchState(ProgressRecord* record, std::vector<CommFault> faults)
      : record_(record), faults_(std::move(faults)) {}
  ~WatchState() {
    if (record_ != nullptr) ::munmap(record_, kProgressFileSize);
  }

  // Called as `op` starts: its fault (if this call has one), then the
  // record. Throws CommError for a fail fault.
  void enter(Op op) {
    if (!faults_.empty()) check(op);
    if (record_ != nullptr) {
      record_->op.store(static_cast<uint32_t>(op), std::memory_order_relaxed);
      record_->entered.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void leave() {
    if (record_ != nullptr) {
      record_->left.fetch_add(1, std::memory_order_relaxed);
    }
  }

 private:
  void check(Op op) {
    const CommFault* hit = nullptr;
    uint64_t n = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = ++calls_[static_cast<size_t>(op)];
      for (const CommFault& f : faults_) {
        if (f.op == op && f.call == n) hit = &f;
      }
    }
    if (hit == nullptr) return;
    const std::string where = "fault injected: " + hit->spec + " (call " +
                              std::to_string(n) + " of " +
                              std::string(op_name(op)) + ")";
    std::string action;
    switch (hit->action) {
      case CommFault::Action::kFail:
        action = "failing it";
        break;
      case CommFault::Action::kExit:
        action = "exiting with " + std::to_string(hit->code);
        break;
      case CommFault::Action::kKill:
        action = "raising SIG" + FaultSpec::signal_text(hit->signal);
        break;
      case CommFault::Action::kStall:
        action = "stalling " +
                 (hit->stall ? FaultSpec::seconds_text(*hit->stall) + " s"
                             : std::string("for ever"));
        break;
    }
    say(where + ": " + action);
    // Before it acts: an exit or a kill leaves no later moment.
    note_fired(hit->spec, action);
    switch (hit->action) {
      case CommFault::Action::kFail:
        throw CommError("DLAUNCH_COMM_FAULTS: " + where);
      case CommFault::Action::kExit:
        std::_Exit(hit->code);
      case CommFault::Action::kKill:
        ::kill(::getpid(), hit->signal);
        return;
      case CommFault::Action::kStall:
        // The stall is the fault: this thread stops making progress as a
        // rank stuck in the operation would, signals still act on it.
        if (hit->stall) {
          std::this_thread::sleep_for(*hit->stall);
        } else {
          while (true) ::pause();
        }
        return;
    }
  }

  // Tells the agent (through the record) which fault fired and what it
  // did, for its failure report and summary.json.
  void note_fired(const std::string& spec, const std::string& action) {
    if (record_ == nullptr) return;
    auto put = [](char* to, const std::string& text) {
      const size_t n = std::min(text.size(), kProgressFaultBytes - 1);
      std::memcpy(to, text.data(), n);
      to[n] = '\0';
    };
    record_->fault_time_ns.store(0, std::memory_order_relaxed);
    put(record_->fault_spec, spec);
    put(record_->fault_action, action);
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    record_->fault_time_ns.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(),
        std::memory_order_release);
  }

  ProgressRecord* record_;
  std::vector<CommFault> faults_;
  std::mutex mu_;
  std::array<uint64_t, kNumOps> calls_{};
};

namespace {

// A Work whose wait() is recorded as an operation of its own.
class WatchedWork : public Work {
 public:
  WatchedWork(std::unique_ptr<Work> inner, std::shared_ptr<WatchState> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}
  void wait(std::chrono::milliseconds timeout) override {
    state_->enter(Op::kWait);
    struct Leave {
      WatchState& s;
      ~Leave() { s.leave(); }
    } leave{*state_};
    inner_->wait(timeout);
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  std::unique_ptr<Work> inner_;
  std::shared_ptr<WatchState> state_;
};

class WatchedGroup : public ProcessGroup {
 public:
  WatchedGroup(std::unique_ptr<ProcessGroup> inner,
               std::shared_ptr<WatchState> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  const std::string& name() const override { return inner_->name(); }
  std::chrono::milliseconds timeout() const override {
    return inner_->timeout();
  }

  std::unique_ptr<Work> isend(Tensor t, int dst, int tag) override {
    return async(Op::kSend, [&] { return inner_->isend(t, dst, tag); });
  }
  std::unique_ptr<Work> irecv(Tensor t, int src, int tag) override {
    return async(Op::kRecv, [&] { return inner_->irecv(t, src, tag); });
  }
  void broadcast(Tensor t, int root) override {
    run(Op::kBroadcast, [&] { inner_->broadcast(t, root); });
  }
  void reduce(Tensor t, int root, ReduceOp op) override {
    run(Op::kReduce, [&] { inner_->reduce(t, root, op); });
  }
  void all_reduce(Tensor t, ReduceOp op) override {
    run(Op::kAllReduce, [&] { inner_->all_reduce(t, op); });
  }
  void scatter(Tensor out, std::span<const Tensor> in, int root) override {
    run(Op::kScatter, [&] { inner_->scatter(out, in, root); });
  }
  void gather(Tensor in, std::span<const Tensor> out, int root) override {
    run(Op::kGather, [&] { inner_->gather(in, out, root); });
  }
  void all_gather(std::span<const Tensor> out, Tensor in) override {
    run(Op::kAllGather, [&] { inner_->all_gather(out, in); });
  }
  void reduce_scatter(Tensor out, std::span<const Tensor> in,
                      ReduceOp op) override {
    run(Op::kReduceScatter, [&] { inner_->reduce_scatter(out, in, op); });
  }
  void all_to_all(std::span<const Tensor> out,
                  std::span<const Tensor> in) override {
    run(Op::kAllToAll, [&] { inner_->all_to_all(out, in); });
  }
  void barrier() override {
    run(Op::kBarrier, [&] { inner_->barrier(); });
  }

  std::unique_ptr<Work> ibroadcast(Tensor t, int root) override {
    return async(Op::kBroadcast, [&] { return inner_->ibroadcast(t, root); });
  }
  std::unique_ptr<Work> ireduce(Tensor t, int root, ReduceOp op) override {
    return async(Op::kReduce, [&] { return inner_->ireduce(t, root, op); });
  }
  std::unique_ptr<Work> iall_reduce(Tensor t, ReduceOp op) override {
    return async(Op::kAllReduce, [&] { return inner_->iall_reduce(t, op); });
  }
  std::unique_ptr<Work> iscatter(Tensor out, std::span<const Tensor> in,
                                 int root) override {
    return async(Op::kScatter, [&] { return inner_->iscatter(out, in, root); });
  }
  std::unique_ptr<Work> igather(Tensor in, std::span<const Tensor> out,
                                int root) override {
    return async(Op::kGather, [&] { return inner_->igather(in, out, root); });
  }
  std::unique_ptr<Work> iall_gather(std::span<const Tensor> out,
                                    Tensor in) override {
    return async(Op::kAllGather, [&] { return inner_->iall_gather(out, in); });
  }
  std::unique_ptr<Work> ireduce_scatter(Tensor out, std::span<const Tensor> in,
                                        ReduceOp op) override {
    return async(Op::kReduceScatter,
                 [&] { return inner_->ireduce_scatter(out, in, op); });
  }
  std::unique_ptr<Work> iall_to_all(std::span<const Tensor> out,
                                    std::span<const Tensor> in) override {
    return async(Op::kAllToAll, [&] { return inner_->iall_to_all(out, in); });
  }
  std::unique_ptr<Work> ibarrier() override {
    return async(Op::kBarrier, [&] { return inner_->ibarrier(); });
  }

  std::unique_ptr<ProcessGroup> new_group(
      const std::vector<int>& ranks,
      std::chrono::milliseconds timeout) override {
    std::unique_ptr<ProcessGroup> g;
    run(Op::kNewGroup, [&] { g = inner_->new_group(ranks, timeout); });
    if (!g) return g;
    return std::make_unique<WatchedGroup>(std::move(g), state_);
  }

 private:
  template <typename Fn>
  void run(Op op, Fn&& fn) {
    state_->enter(op);
    struct Leave {
      WatchState& s;
      ~Leave() { s.leave(); }
    } leave{*state_};
    fn();
  }
  template <typename Fn>
  std::unique_ptr<Work> async(Op op, Fn&& fn) {
    std::unique_ptr<Work> w;
    run(op, [&] { w = fn(); });
    return std::make_unique<WatchedWork>(std::move(w), state_);
  }

  std::unique_ptr<ProcessGroup> inner_;
  std::shared_ptr<WatchState> state_;
};

}  // namespace

std::shared_ptr<WatchState> watch_state_from_env(int rank, int size) {
  const char* progress = std::getenv("DLAUNCH_PROGRESS_FILE");
  const char* faults = std::getenv("DLAUNCH_COMM_FAULTS");
  if ((progress == nullptr || *progress == '\0') &&
      (faults == nullptr || *faults == '\0')) {
    return nullptr;
  }
  int attempt = 0;
  if (const char* a = std::getenv("TORCHELASTIC_RESTART_COUNT")) {
    attempt = std::atoi(a);
  }
  std::vector<CommFault> parsed;
  if (faults != nullptr) {
    try {
      for (const std::string& t : split_fault_list(faults)) {
        if (auto f = parse_comm_fault(t, rank, size, attempt))
          parsed.push_back(*f);
      }
    } catch (const FaultSpecError& e) {
      throw CommError(std::string("DLAUNCH_COMM_FAULTS: ") + e.what());
    }
  }
  ProgressRecord* record = nullptr;
  if (progress != nullptr && *progress != '\0') {
    // The agent made the file; a worker started by hand with a stale
    // variable goes on unrecorded rather than failing.
    int fd = ::open(progress, O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
      void* m = ::mmap(nullptr, kProgressFileSize, PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0);
      ::close(fd);
      if (m != MAP_FAILED) record = static_cast<ProgressRecord*>(m);
    }
  }
  if (record == nullptr && parsed.empty()) return nullptr;
  return std::make_shared<WatchState>(record, std::move(parsed));
}

std::unique_ptr<ProcessGroup> watch_group(std::unique_ptr<ProcessGroup> inner,
                                          std::shared_ptr<WatchState> state) {
  if (!state || !inner) return inner;
  return std::make_unique<WatchedGroup>(std::move(inner), std::move(state));
}

}  // namespace dlaunch::comm
