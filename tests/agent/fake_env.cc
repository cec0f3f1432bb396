#include "tests/agent/fake_env.h"

#include <fstream>

namespace dlaunch::agent::testing {
std::string env_value(const ProcessSpec& spec, const std::string& key) {
  for (const auto& kv : spec.env) {
    if (kv.compare(0, key.size() + 1, key + "=") == 0)
      return kv.substr(key.size() + 1);
  }
  return "<unset>";
}

namespace {

struct FakeWorkerState {
  int pid = 0;
  bool alive = true;
  bool cancelled = false;
  bool frozen = false;  // SIGSTOPped: only SIGKILL ends it
  Behaviour b;
  std::string error_file;
  Env::ExitCallback on_exit;
};

class FakeProcess : public Process {
 public:
  FakeProcess(FakeEnv& env, std::shared_ptr<FakeWorkerState> s)
      : env_(env), s_(std::move(s)) {}
  ~FakeProcess() override { s_->cancelled = true; }
  int pid() const override { return s_->pid; }
  std::string log_error() const override { return ""; }
  void signal_group(int sig) override {
    env_.signals_sent.push_back({env_.virtual_now(), s_->pid, sig});
    if (!s_->alive || s_->b.stuck) return;
    if (sig == SIGSTOP) {
      s_->frozen = true;
      return;
    }
    if (sig == SIGKILL) {
      exit_after(env_, s_, FakeEnv::ms(0), ExitStatus{0, SIGKILL});
    } else if (sig != SIGUSR1 && sig != SIGUSR2 && !s_->b.ignores_stop &&
               !s_->frozen) {
      exit_after(env_, s_, s_->b.stop_delay, ExitStatus{0, sig});
    }
  }

  static void exit_after(FakeEnv& env, std::shared_ptr<FakeWorkerState> s,
                         FakeEnv::ms delay, ExitStatus status) {
    env.schedule(delay, [s, status] {
      if (!s->alive || (s->frozen && status.signal != SIGKILL)) return;
      s->alive = false;
      if (!s->b.error_file_text.empty()) {
        std::ofstream(s->error_file) << s->b.error_file_text;
      }
      if (!s->cancelled) s->on_exit(status);
    });
  }

 private:
  FakeEnv& env_;
  std::shared_ptr<FakeWorkerState> s_;
};

class FakeTimer : public Timer {
 public:
  explicit FakeTimer(std::shared_ptr<bool> live) : live_(std::move(live)) {}
  ~FakeTimer() override { *live_ = false; }

 private:
  std::shared_ptr<bool> live_;
};

}  // namespace

std::shared_ptr<bool> FakeEnv::schedule(ms delay, std::function<void()> fn) {
  auto live = std::make_shared<bool>(true);
  queue_.emplace(std::make_pair(now_ + delay, seq_++),
                 std::make_pair(live, std::move(fn)));
  return live;
}

std::unique_ptr<Process> FakeEnv::spawn(const ProcessSpec& spec,
                                        ExitCallback on_exit) {
  if (fail_spawn(spec))
    throw SpawnError("fake: cannot execute " + spec.executable);
  int index = static_cast<int>(spawned.size());
  spawned.push_back(spec);
  auto s = std::make_shared<FakeWorkerState>();
  s->pid = next_pid_++;
  s->b = behave(spec, index);
  s->error_file = env_value(spec, "TORCHELASTIC_ERROR_FILE");
  if (s->error_file == "<unset>") s->error_file.clear();
  s->on_exit = std::move(on_exit);
  if (!s->b.never_exits)
    FakeProcess::exit_after(*this, s, s->b.runs_for, s->b.exit);
  return std::make_unique<FakeProcess>(*this, s);
}

std::unique_ptr<Timer> FakeEnv::start_timer(ms delay,
                                            std::function<void()> fn) {
  return std::make_unique<FakeTimer>(schedule(delay, std::move(fn)));
}

void FakeEnv::run() {
  stopped_ = false;
  while (!stopped_) {
    if (queue_.empty()) {
      throw std::logic_error(
          "FakeEnv: no event left but the agent did not stop (it would hang)");
    }
    auto it = queue_.begin();
    now_ = it->first.first;
    auto [live, fn] = std::move(it->second);
    queue_.erase(it);
    if (*live) fn();
  }
}

}  // namespace dlaunch::agent::testing
