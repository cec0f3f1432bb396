// The reliability suite (issue 13): long restart series that must leak
// nothing, and an unlucky environment (no store, a port taken, Ctrl-C while
// waiting, a full /dev/shm, a full or read-only log disk) that must end in
// a clear error within its timeout, leaving nothing behind. Real processes,
// real sockets; disks are filled only inside private mount namespaces.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "tests/testing/bin.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

using testing::CommandResult;
using testing::free_port;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Subprocess;
using testing::TempDir;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kDlaunch = testing::bin("dlaunch");

// What an agent holds, read from /proc.
struct Holdings {
  int fds = 0;
  int threads = 0;
  int children = 0;     // live descendants
  int listening = 0;    // its listening TCP sockets
  int shm_entries = 0;  // files and folders under /dev/shm/dlaunch-RUN_ID-*

  std::string text() const {
    return "fds=" + std::to_string(fds) +
           " threads=" + std::to_string(threads) +
           " children=" + std::to_string(children) +
           " listening=" + std::to_string(listening) +
           " shm=" + std::to_string(shm_entries);
  }
};

int shm_entries(const std::string& run_id) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    if (e.path().filename().string().rfind("dlaunch-" + run_id + "-", 0) != 0)
      continue;
    ++n;
    for (auto it = fs::recursive_directory_iterator(e.path(), ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      ++n;
    }
  }
  return n;
}

Holdings holdings(pid_t pid, const std::string& run_id) {
  Holdings h;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::error_code ec;
  for (auto it = fs::directory_iterator(proc + "/fd", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    ++h.fds;
  }
  h.listening = static_cast<int>(testing::listening_ports(pid).size());
  std::ifstream status(proc + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) h.threads = std::stoi(line.substr(8));
  }
  h.children = static_cast<int>(testing::descendants(pid).size());
  h.shm_entries = shm_entries(run_id);
  return h;
}

// 50 worker failures in a row on a two-node c10d job: node 0's worker fails
// every attempt, node 1's is stopped each time. At the second and the last
// attempt node 0's worker holds still (blocked on a FIFO the test feeds)
// while the test reads both agents' holdings: nothing may have grown.
TEST(Reliability, FiftyRestartsLeakNothing) {
  constexpr int kRestarts = 50;
  TempDir dir;
  testing::Gate gate((dir / "go").string());
  const int port = free_port();
  const std::string id = "leak" + std::to_string(::getpid());
  const std::string script =
      "echo '{\"message\": \"planned\"}' > $TORCHELASTIC_ERROR_FILE; "
      "if [ $NODE = 1 ]; then echo UP$TORCHELASTIC_RESTART_COUNT; "
      "exec sleep 300; fi; "
      "rc=$TORCHELASTIC_RESTART_COUNT; "
      "if [ $rc = 1 ] || [ $rc = " +
      std::to_string(kRestarts) + " ]; then echo SNAP$rc; read x < " +
      gate.path() + "; fi; exit 1";
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Subprocess>(testing::CommandOptions{
        {kDlaunch, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         "127.0.0.1:" + std::to_string(port), "--rdzv-id", id, "--local-addr",
         "127.0.0." + std::to_string(i + 1), "--rdzv-conf",
         std::string("is_host=") + (i == 0 ? "true" : "false") +
             ",join_timeout=60",
         "--max-restarts", std::to_string(kRestarts), "sh", "-c", script},
        // Roles by node, not group rank (which follows the join order).
        {{"NODE", std::to_string(i)}},
        {"TMPDIR"},  // the run folders go to /dev/shm, where they are counted
        ""}));
  }
  std::map<int, std::vector<Holdings>> seen;
  for (int rc : {1, kRestarts}) {
    const std::string snap = "SNAP" + std::to_string(rc);
    ASSERT_TRUE(agents[0]->wait_for_output(snap, 120s))
        << agents[0]->out() << agents[0]->err();
    // Node 1's worker runs too before it is measured: both are in the
    // same state at both snapshots.
    ASSERT_TRUE(agents[1]->wait_for_output("UP" + std::to_string(rc), 60s))
        << agents[1]->out() << agents[1]->err();
    for (int i = 0; i < 2; ++i) {
      seen[i].push_back(holdings(agents[i]->pid(), id));
    }
    gate.open_once();
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = agents[i]->wait(120s);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    const Holdings& first = seen[i][0];
    const Holdings& last = seen[i][1];
    SCOPED_TRACE("agent " + std::to_string(i) + ": attempt 1 " + first.text() +
                 "; attempt " + std::to_string(kRestarts) + " " + last.text());
    EXPECT_LE(last.fds, first.fds);
    EXPECT_LE(last.threads, first.threads);
    EXPECT_LE(last.children, first.children);
    EXPECT_LE(last.listening, first.listening);
    EXPECT_LE(last.shm_entries, first.shm_entries);
    EXPECT_GT(first.children, 0);  // it was measured while its worker ran
  }
  EXPECT_EQ(seen[0][0].listening, 1);  // the agents' store
  EXPECT_THAT(agents[0]->err(),
              HasSubstr("restart " + std::to_string(kRestarts) + " of " +
                        std::to_string(kRestarts)));
  // Nothing is left of either agent.
  EXPECT_EQ(shm_entries(id), 0);
}

// The zombies among `pid`'s children.
int zombie_children(pid_t pid) {
  std::istringstream in(testing::read_proc_file("/proc/" + std::to_string(pid) +
                                                "/task/" + std::to_string(pid) +
                                                "/children"));
  int n = 0;
  for (pid_t c; in >> c;) n += testing::process_state(c) == 'Z' ? 1 : 0;
  return n;
}

// A worker's background children die with its group when it exits; the
// agent, their reaper, must reap them although they died before it could
// see their tag (a dead child's environment reads empty): every restart
// of a job whose rank 0 leaves children behind piled up zombies.
TEST(Reliability, ChildrenKilledWithTheirWorkerLeaveNoZombies) {
  TempDir dir;
  testing::Gate gate((dir / "go").string());
  Subprocess p(
      {{kDlaunch, "--nproc-per-node", "2", "--max-restarts", "3", "sh", "-c",
        "if [ $LOCAL_RANK = 0 ]; then for i in 1 2 3 4 5; do "
        "sleep 100 & done; exit 0; fi; "
        "if [ $TORCHELASTIC_RESTART_COUNT = 3 ]; then echo LAST; read "
        "x < " +
            gate.path() + "; exit 0; fi; sleep 0.3; exit 1"},
       {},
       {},
       ""});
  ASSERT_TRUE(p.wait_for_output("[default1]:LAST", 60s)) << p.err();
  // Rank 0 of the last attempt ends about now; its children's zombies, and
  // those of the three attempts before, must all be reaped.
  int zombies = -1;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(200ms);
    if ((zombies = zombie_children(p.pid())) == 0) break;
  }
  EXPECT_EQ(zombies, 0);
  gate.open_once();
  EXPECT_EQ(p.wait(60s).exit_code, 0) << p.err();
}

// Whether this process may make a private mount namespace (not in a
// chroot, not without CAP_SYS_ADMIN).
bool can_unshare_mounts() {
  return testing::run_command({{"unshare", "-m", "true"}, {}, {}, ""}, 10s)
             .exit_code == 0;
}

#define SKIP_WITHOUT_UNSHARE()                                            \
  if (!can_unshare_mounts()) {                                            \
    GTEST_SKIP() << "cannot make a private mount namespace (unshare -m)"; \
  }

// An agent that must join a store nobody serves gives up after its
// join_timeout, naming the endpoint, and leaves nothing.
TEST(Reliability, AnUnreachableStoreFailsAfterTheJoinTimeout) {
  const int port = free_port();  // nobody listens there
  const std::string id = "nostore" + std::to_string(::getpid());
  CommandResult r = testing::run_command(
      {{kDlaunch, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        "127.0.0.1:" + std::to_string(port), "--rdzv-id", id, "--rdzv-conf",
        "is_host=false,join_timeout=1", "true"},
       {},
       {"TMPDIR"},
       ""},
      60s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("cannot reach the agents' store: store 127.0.0.1:" +
                        std::to_string(port) +
                        " unreachable after 1 s (connection refused)"));
  EXPECT_THAT(r.err, HasSubstr("check --rdzv-endpoint"));
  EXPECT_EQ(shm_entries(id), 0);
}

// MASTER_PORT held by someone else: rank 0 says so at once, the group
// stops, nothing is left.
TEST(Reliability, ATakenMasterPortIsAClearErrorAtOnce) {
  int squatter = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(squatter, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(squatter, 16), 0);
  socklen_t len = sizeof a;
  ::getsockname(squatter, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  Subprocess p(
      {{kDlaunch, "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", port, testing::bin("dl-collectives")},
       {},
       {},
       ""});
  CommandResult r = p.wait(120s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out + r.err,
              HasSubstr("cannot serve the store on port " + port));
  EXPECT_THAT(r.out + r.err, HasSubstr("address already in use"));
  EXPECT_THAT(r.err, HasSubstr("root cause"));
  EXPECT_TRUE(testing::descendants(p.pid()).empty());
  ::close(squatter);
}

// Ctrl-C while the agent waits for the other nodes ends the wait at once
// (not at the join timeout of 10 minutes) with 130, leaving nothing.
TEST(Reliability, SigintDuringTheRendezvousEndsTheWait) {
  const int port = free_port();
  const std::string id = "sigint" + std::to_string(::getpid());
  Subprocess p({{kDlaunch, "--nnodes", "2", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port),
                 "--rdzv-id", id, "--rdzv-conf", "is_host=true", "true"},
                {},
                {"TMPDIR"},
                ""});
  ASSERT_TRUE(p.wait_for_output("waiting for nodes: 1/2 joined", 60s))
      << p.err();
  p.signal(SIGINT);
  CommandResult r = p.wait(60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("received SIGINT while waiting for the rendezvous"));
  EXPECT_THAT(r.err, HasSubstr("no worker was running"));
  EXPECT_EQ(shm_entries(id), 0);
}

// The same while the agent still tries to reach a store nobody serves yet.
TEST(Reliability, SigintWhileConnectingToTheStoreEndsTheWait) {
  const int port = free_port();
  const std::string id = "sigint2" + std::to_string(::getpid());
  TempDir dir;
  Subprocess p(
      {{kDlaunch, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        "127.0.0.1:" + std::to_string(port), "--rdzv-id", id, "--rdzv-conf",
        "is_host=false", "--log-dir", dir.path().string(), "true"},
       {},
       {},
       ""});
  // The agent catches SIGINT from just before it makes the run folder and
  // connects (the folder itself may come earlier: the launcher writes
  // job.yaml into it before the agent runs).
  auto catches_sigint = [&] {
    std::ifstream status("/proc/" + std::to_string(p.pid()) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.starts_with("SigCgt:")) {
        const unsigned long long caught =
            std::stoull(line.substr(7), nullptr, 16);
        return (caught >> (SIGINT - 1) & 1) != 0;
      }
    }
    return false;
  };
  for (int i = 0; i < 6000 && !catches_sigint(); ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(catches_sigint()) << "dlaunch never caught SIGINT";
  p.signal(SIGINT);
  CommandResult r = p.wait(60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no worker was running"));
}

// A full /dev/shm (no room, no inode left; a private tmpfs): the agent's
// run folder moves to /tmp and comm's collectives fall back to TCP; the
// job runs, and nothing is left in /dev/shm.
TEST(Reliability, AFullDevShmDoesNotStopTheJob) {
  SKIP_WITHOUT_UNSHARE();
  CommandResult r = testing::run_command(
      {{"unshare", "-m", "sh", "-c",
        "mount -t tmpfs -o size=256k,nr_inodes=3 dlaunch-test /dev/shm || "
        "exit 99; touch /dev/shm/a /dev/shm/b; head -c 300000 /dev/zero "
        "> /dev/shm/a 2>/dev/null; " +
            kDlaunch + " --nproc-per-node 2 " + testing::bin("dl-collectives") +
            "; echo exit=$?; ls -A /dev/shm"},
       {},
       {"TMPDIR"},
       ""},
      120s);
  ASSERT_NE(r.exit_code, 99) << r.err;
  EXPECT_THAT(r.out, HasSubstr("all collectives passed")) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exit=0")) << r.err;
  // Only the test's own files.
  EXPECT_THAT(r.out, HasSubstr("exit=0\na\nb\n"));
}

// Runs `dlaunch --log-dir DIR/logs --run-id ID` in a private mount
// namespace where DIR is a small tmpfs mounted with `options`, after
// `prepare` (shell); the job must not start.
void expect_log_dir_refused(const std::string& options,
                            const std::string& prepare, const std::string& id,
                            const std::string& why) {
  TempDir dir;
  const std::string d = dir.path().string();
  CommandResult r = testing::run_command(
      {{"unshare", "-m", "sh", "-c",
        "mount -t tmpfs -o " + options + " dlaunch-test " + d +
            " || exit 99; cd " + d + "; " + prepare + "; " + kDlaunch +
            " --log-dir " + d + "/logs --run-id " + id +
            " sh -c 'echo STARTED'; echo exit=$?"},
       {},
       {},
       ""},
      60s);
  ASSERT_NE(r.exit_code, 99) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exit=1"));
  EXPECT_THAT(r.out, Not(HasSubstr("STARTED")));
  EXPECT_THAT(r.err, HasSubstr("cannot create the run folder"));
  EXPECT_THAT(r.err, HasSubstr(why));
  EXPECT_THAT(r.err, HasSubstr(d + "/logs/" + id));
  EXPECT_THAT(r.err, HasSubstr("check --log-dir"));
  // That line alone: no warning that the job runs without job.yaml.
  EXPECT_THAT(r.err, Not(HasSubstr("the job runs without")));
}

// A log folder on a read-only disk: one clear line naming it, exit 1, no
// worker started.
TEST(Reliability, AReadOnlyLogDiskIsAClearError) {
  SKIP_WITHOUT_UNSHARE();
  expect_log_dir_refused("size=64k,ro", "true", "ro", "Read-only file system");
}

// A log folder on a disk with no inode left: the same.
TEST(Reliability, ALogDiskWithNoRoomLeftIsAClearError) {
  SKIP_WITHOUT_UNSHARE();
  expect_log_dir_refused("size=64k,nr_inodes=2", "touch a", "full",
                         "No space left on device");
}

}  // namespace
}  // namespace dlaunch
