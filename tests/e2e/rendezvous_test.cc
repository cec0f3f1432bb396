// Multi-node rendezvous over real processes: every agent is its own
// `dlaunch` advertising its own 127.0.0.x, the first one hosting the
// agents' store (is_host=true), the others connecting (is_host=false).
// Waits are bounded and on observed output, never on sleeps.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;
using testing::Subprocess;
using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN_DIR "/dlaunch";
const std::string kScripts = DLAUNCH_SOURCE_DIR "/tests/e2e/py/";

// Each worker prints its whole env contract on one line.
const std::string kShowEnv =
    "echo \"ENV node=$NODE rank=$RANK local=$LOCAL_RANK ws=$WORLD_SIZE "
    "lws=$LOCAL_WORLD_SIZE gr=$GROUP_RANK gws=$GROUP_WORLD_SIZE "
    "master=$MASTER_ADDR:$MASTER_PORT rc=$TORCHELASTIC_RESTART_COUNT "
    "id=$TORCHELASTIC_RUN_ID\"";

using testing::free_port;

struct EnvLine {
  int node, rank, local, ws, lws, gr, gws, rc;
  std::string master, id;
};

// Every ENV line in `out`.
std::vector<EnvLine> env_lines(const std::string& out) {
  std::vector<EnvLine> v;
  std::regex re(
      "ENV node=(\\d+) rank=(\\d+) local=(\\d+) ws=(\\d+) lws=(\\d+) "
      "gr=(\\d+) gws=(\\d+) master=(\\S+) rc=(\\d+) id=(\\S+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re);
       it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    v.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]),
                 std::stoi(m[4]), std::stoi(m[5]), std::stoi(m[6]),
                 std::stoi(m[7]), std::stoi(m[9]), m[8], m[10]});
  }
  return v;
}

class Rendezvous : public ::testing::Test {
 protected:
  // Starts agent `i` (0 hosts the store) advertising 127.0.0.(i+1).
  // `stderr_fd` >= 0: the agent's stderr instead of a captured pipe.
  Subprocess& start(int i, const std::vector<std::string>& flags,
                    const std::string& script, std::string host = "",
                    int stderr_fd = -1) {
    std::vector<std::string> argv = {
        kDlaunch,
        "--rdzv-endpoint",
        "127.0.0.1:" + std::to_string(port_),
        "--rdzv-id",
        id_,
        "--local-addr",
        "127.0.0." + std::to_string(i + 1),
        "--rdzv-conf",
        "is_host=" +
            (host.empty() ? std::string(i == 0 ? "true" : "false") : host) +
            "," + conf_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (std::find(flags.begin(), flags.end(), "--rdzv-backend") ==
        flags.end()) {
      argv.insert(argv.end(), {"--rdzv-backend", "c10d"});
    }
    argv.insert(argv.end(), {"sh", "-c", script});
    agents_[i] = std::make_unique<Subprocess>(testing::CommandOptions{
        argv, {{"NODE", std::to_string(i)}}, {}, "", -1, stderr_fd});
    return *agents_[i];
  }
  CommandResult finish(int i) { return agents_[i]->wait(120s); }
  // Agents 0..n-1 finish with exit 0, their last group of `gws` nodes
  // started with restart count `rc`.
  void expect_last_group(int n, int gws, int rc) {
    for (int i = 0; i < n; ++i) {
      CommandResult r = finish(i);
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
      auto lines = env_lines(r.out);
      ASSERT_FALSE(lines.empty()) << r.out;
      EXPECT_EQ(lines.back().gws, gws);
      EXPECT_EQ(lines.back().rc, rc);
    }
  }
  // Whether each of agents 0..n-1 prints `text` within a minute.
  ::testing::AssertionResult all_print(int n, const std::string& text) {
    for (int i = 0; i < n; ++i) {
      if (!agents_[i]->wait_for_output(text, 60s)) {
        return ::testing::AssertionFailure()
               << "agent " << i << " never printed '" << text << "'\n"
               << agents_[i]->out() << agents_[i]->err();
      }
    }
    return ::testing::AssertionSuccess();
  }

  int port_ = free_port();
  std::string id_ = "job" + std::to_string(::getpid());
  // --rdzv-conf. The last call is 5 s: a round of --nnodes 2:3 closes only
  // when the third node is that late (1 s, a loaded machine could start it
  // later, and a round of two would run instead of the test's round of 3).
  std::string conf_ = "join_timeout=60,last_call_timeout=5";
  std::map<int, std::unique_ptr<Subprocess>> agents_;
};

TEST_F(Rendezvous, ThreeNodesWithDifferentNprocFormOneWorld) {
  for (int i = 0; i < 3; ++i) {
    start(i, {"--nnodes", "3", "--nproc-per-node", std::to_string(i + 1)},
          kShowEnv);
  }
  std::vector<EnvLine> all;
  std::map<int, int> group_rank_of_node;
  for (int i = 0; i < 3; ++i) {
    CommandResult r = finish(i);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), static_cast<size_t>(i + 1)) << r.out;
    for (const EnvLine& l : lines) {
      EXPECT_EQ(l.node, i);
      EXPECT_EQ(l.lws, i + 1);
      group_rank_of_node[i] = l.gr;
      all.push_back(l);
    }
  }
  std::set<int> ranks, group_ranks;
  std::map<int, int> local_size_of_group_rank;
  for (const EnvLine& l : all) {
    ranks.insert(l.rank);
    group_ranks.insert(l.gr);
    local_size_of_group_rank[l.gr] = l.lws;
    EXPECT_EQ(l.ws, 6);
    EXPECT_EQ(l.gws, 3);
    EXPECT_EQ(l.rc, 0);
    EXPECT_EQ(l.id, id_);
    EXPECT_EQ(l.master, all[0].master);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(group_ranks, (std::set<int>{0, 1, 2}));
  // RANK = local world sizes of the nodes before + LOCAL_RANK.
  for (const EnvLine& l : all) {
    int before = 0;
    for (int g = 0; g < l.gr; ++g) before += local_size_of_group_rank[g];
    EXPECT_EQ(l.rank, before + l.local);
  }
  // MASTER_ADDR is group rank 0's advertised address.
  int node0 = -1;
  for (auto [node, gr] : group_rank_of_node) {
    if (gr == 0) node0 = node;
  }
  EXPECT_EQ(all[0].master.substr(0, all[0].master.find(':')),
            "127.0.0." + std::to_string(node0 + 1));
}

TEST_F(Rendezvous, StaticBackendUsesNodeRanks) {
  for (int i = 0; i < 2; ++i) {
    // Node rank 1 starts first: ranks come from --node-rank, not order.
    int node_rank = 1 - i;
    start(i,
          {"--rdzv-backend", "static", "--nnodes", "2", "--node-rank",
           std::to_string(node_rank), "--master-addr", "127.0.0.1"},
          kShowEnv);
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = finish(i);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    EXPECT_EQ(lines[0].gr, 1 - i);
    EXPECT_EQ(lines[0].rank, 1 - i);
    EXPECT_EQ(lines[0].gws, 2);
  }
}

// A second node given a --node-rank another joiner holds is refused; the
// round waits for the right node (both rank-0 nodes once failed, and the
// rank-1 node waited out its join timeout alone).
TEST_F(Rendezvous, ANodeGivenATakenNodeRankIsRefusedAndTheJobRuns) {
  auto flags = [](int node_rank) {
    return std::vector<std::string>{"--rdzv-backend", "static",
                                    "--nnodes",       "2",
                                    "--node-rank",    std::to_string(node_rank),
                                    "--master-addr",  "127.0.0.1"};
  };
  start(0, flags(0), kShowEnv);
  ASSERT_TRUE(agents_[0]->wait_for_output("waiting for nodes", 60s))
      << agents_[0]->err();
  start(1, flags(0), kShowEnv);
  CommandResult twin = finish(1);
  EXPECT_EQ(twin.exit_code, 1) << twin.err;
  EXPECT_THAT(twin.err,
              HasSubstr("node 127.0.0.1 joined round 0 of job '" + id_ +
                        "' with --node-rank 0 before this node (127.0.0.2); "
                        "give each of the 2 nodes its own --node-rank, 0..1"));
  start(2, flags(1), kShowEnv);
  for (int i : {0, 2}) {
    CommandResult r = finish(i);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    EXPECT_EQ(lines[0].gws, 2);
    EXPECT_EQ(lines[0].gr, i == 0 ? 0 : 1);
  }
}

// A node giving another --nnodes than the round's joiners is refused
// before it joins (c10d); the job runs without it (a node given 3 beside
// nodes given 2 ran with a world of 2).
TEST_F(Rendezvous, ANodeGivingAnotherNnodesIsRefusedAndTheJobRuns) {
  start(0, {"--nnodes", "2"}, kShowEnv);
  ASSERT_TRUE(agents_[0]->wait_for_output("waiting for nodes", 60s))
      << agents_[0]->err();
  start(1, {"--nnodes", "1:3"}, kShowEnv);
  CommandResult odd = finish(1);
  EXPECT_EQ(odd.exit_code, 1) << odd.err;
  EXPECT_THAT(odd.err, HasSubstr("this node (127.0.0.2) gives --nnodes 1:3, "
                                 "node 127.0.0.1 of the same job --nnodes 2; "
                                 "give every node of the job the same "
                                 "--nnodes"));
  start(2, {"--nnodes", "2"}, kShowEnv);
  for (int i : {0, 2}) {
    CommandResult r = finish(i);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    EXPECT_EQ(lines[0].gws, 2);
  }
}

// Round 0 (three nodes) blocks until stopped, with a child that left the
// worker's process group (setsid): nothing of a lost node may survive it.
// A round of two finishes.
const std::string kBlockWhileThree =
    kShowEnv +
    "; if [ $GROUP_WORLD_SIZE = 3 ]; then setsid sleep 300 & echo RUNNING; "
    "exec sleep 300; fi";

void lose_a_node(Rendezvous* t, std::map<int, std::unique_ptr<Subprocess>>& a,
                 int sig) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a[i]->wait_for_output("RUNNING", 60s))
        << a[i]->out() << a[i]->err();
  }
  // The worker, its setsid child and the agent's watchdog.
  std::vector<pid_t> workers = testing::descendants(a[2]->pid());
  ASSERT_GE(workers.size(), 3u);
  a[2]->signal(sig);
  CommandResult gone = a[2]->wait(60s);
  if (sig == SIGINT) {
    EXPECT_EQ(gone.exit_code, 130) << gone.err;
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = a[i]->wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("node 127.0.0.3/"));
    EXPECT_THAT(r.err, HasSubstr("re-forming the worker group"));
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), 2u) << r.out;
    // Survivors keep their order (group rank 0 stays put; a rank above
    // the lost node's moves down by one); no restart spent.
    EXPECT_TRUE(lines[1].gr == lines[0].gr ||
                (lines[0].gr > 0 && lines[1].gr == lines[0].gr - 1))
        << lines[0].gr << " -> " << lines[1].gr;
    EXPECT_EQ(lines[1].gws, 2);
    EXPECT_EQ(lines[1].rc, 0);
  }
  // Nothing of the lost node is left.
  for (pid_t p : workers) {
    EXPECT_TRUE(
        testing::eventually([p] { return !testing::process_alive(p); }, 30s))
        << "worker " << p << " survived";
  }
  (void)t;
}

TEST_F(Rendezvous, KilledAgentLeavesAndTheOthersGoOn) {
  for (int i = 0; i < 3; ++i) start(i, {"--nnodes", "2:3"}, kBlockWhileThree);
  lose_a_node(this, agents_, SIGKILL);
}

TEST_F(Rendezvous, InterruptedAgentLeavesGracefullyAndTheOthersGoOn) {
  for (int i = 0; i < 3; ++i) start(i, {"--nnodes", "2:3"}, kBlockWhileThree);
  lose_a_node(this, agents_, SIGINT);
}

// Slow last calls and keep-alives: only the losses the tests cause end
// a wait early.
const std::string kPatientConf =
    "join_timeout=60,last_call_timeout=600,keep_alive_interval=10,"
    "keep_alive_max_attempt=30";

TEST_F(Rendezvous, ANodeLostWhileARoundFormsEndsTheWaitAtOnce) {
  // Round 0 has four nodes. Node 3 freezes, node 2 dies: round 1 waits for
  // nodes 0, 1 and 3. When node 3 dies too, 0 and 1 go on at once, without
  // the last call (600 s).
  conf_ = kPatientConf;
  const std::string script =
      kShowEnv +
      "; if [ $GROUP_WORLD_SIZE = 4 ]; then echo RUNNING; exec sleep 300; fi";
  for (int i = 0; i < 4; ++i) start(i, {"--nnodes", "2:4"}, script);
  ASSERT_TRUE(all_print(4, "RUNNING"));
  agents_[3]->signal(SIGSTOP);
  agents_[2]->signal(SIGKILL);
  ASSERT_TRUE(all_print(2, "waiting for nodes: 2/3 joined"));
  agents_[3]->signal(SIGKILL);
  for (int i = 0; i < 2; ++i) {
    CommandResult r = finish(i);
    ASSERT_FALSE(r.timed_out) << "round 1 still waits for node 3\n" << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = env_lines(r.out);
    ASSERT_FALSE(lines.empty()) << r.out;
    EXPECT_EQ(lines.back().gws, 2);
    EXPECT_EQ(lines.back().rc, 0);
  }
}

TEST_F(Rendezvous, AFailureAndANodeLossInOneRoundEndTheBudgetEverywhere) {
  // --max-restarts 0. On node 1, local rank 0 dies; local rank 1 ignores
  // SIGTERM, so node 1 stays busy stopping and reports the failure only
  // when the test kills rank 1. Meanwhile node 2 dies: node 0 sees only
  // that loss and re-forms. The failure must still spend the job's one
  // budget on every node: both give up, neither runs a second round.
  conf_ = kPatientConf;
  const std::string script =
      kShowEnv +
      "; [ $GROUP_WORLD_SIZE = 3 ] || exit 0; if [ $NODE$LOCAL_RANK = 11 ]; "
      "then trap '' TERM; sleep 300 & trap 'echo STOPPING' TERM; "
      "echo \"RUNNING 1 $$\"; wait $!; wait $!; exit 0; fi; "
      "echo \"RUNNING $LOCAL_RANK $$\"; exec sleep 300";
  testing::TempDir dir;
  for (int i = 0; i < 3; ++i) {
    start(i,
          {"--nnodes", "2:3", "--max-restarts", "0", "--nproc-per-node",
           i == 1 ? "2" : "1", "--log-dir", (dir / std::to_string(i)).string()},
          script);
  }
  ASSERT_TRUE(all_print(3, "RUNNING 0"));
  ASSERT_TRUE(agents_[1]->wait_for_output("RUNNING 1", 60s));
  auto pid_of = [&](int local_rank) {
    std::smatch m;
    const std::string out = agents_[1]->out();
    std::regex re("RUNNING " + std::to_string(local_rank) + " (\\d+)");
    return std::regex_search(out, m, re) ? std::stoi(m[1]) : -1;
  };
  const pid_t rank0 = pid_of(0), rank1 = pid_of(1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(::kill(rank0, SIGKILL), 0);
  // Node 1 has seen its failure: it is stopping rank 1.
  ASSERT_TRUE(agents_[1]->wait_for_output("STOPPING", 60s))
      << agents_[1]->out() << agents_[1]->err();
  agents_[2]->signal(SIGKILL);
  ASSERT_TRUE(agents_[0]->wait_for_output("waiting for nodes: 1/2 joined", 60s))
      << agents_[0]->err();
  ASSERT_EQ(::kill(-rank1, SIGKILL), 0);  // its process group
  CommandResult r0 = finish(0);
  CommandResult r1 = finish(1);
  EXPECT_EQ(r1.exit_code, 137) << r1.err;
  EXPECT_EQ(r0.exit_code, 1) << r0.err;
  EXPECT_THAT(r0.err, HasSubstr("a worker on node 127.0.0.2/"));
  EXPECT_THAT(r0.err, HasSubstr("no restarts left (0 of 0 used)"));
  for (int i = 0; i < 2; ++i) {
    auto summary = nlohmann::json::parse(
        testing::read_file(dir / std::to_string(i) / id_ / "summary.json"));
    EXPECT_EQ(summary["attempts"].size(), 1u) << "node " << i;
  }
}

// A frozen agent (SIGSTOP: the keep-alive path) is dropped once silent for
// keep_alive_interval x keep_alive_max_attempt; the others re-form and
// finish. Woken (SIGCONT), it learns it was dropped and stops its workers
// instead of running on. The silence allowed is 10 s: a live agent that a
// loaded machine leaves unscheduled for under a second (0.2 x 3 here once
// dropped one on CI) must not be dropped too.
TEST_F(Rendezvous, AFrozenAgentIsDroppedAndStopsItsWorkersWhenItWakes) {
  conf_ += ",keep_alive_interval=1,keep_alive_max_attempt=10";
  for (int i = 0; i < 3; ++i) start(i, {"--nnodes", "2:3"}, kBlockWhileThree);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(agents_[i]->wait_for_output("RUNNING", 60s))
        << agents_[i]->out() << agents_[i]->err();
  }
  std::vector<pid_t> workers = testing::descendants(agents_[2]->pid());
  ASSERT_FALSE(workers.empty());
  agents_[2]->signal(SIGSTOP);
  // The survivors notice it is gone, re-form without it and finish.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(agents_[i]->wait_for_output("re-forming the worker group", 60s))
        << agents_[i]->err();
  }
  agents_[2]->signal(SIGCONT);
  for (int i = 0; i < 2; ++i) {
    CommandResult r = finish(i);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("node 127.0.0.3/"));
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), 2u) << r.out;
    EXPECT_EQ(lines[1].gws, 2);
    EXPECT_EQ(lines[1].rc, 0);
  }
  CommandResult frozen = finish(2);
  EXPECT_EQ(frozen.exit_code, 1) << frozen.err;
  EXPECT_THAT(frozen.err, HasSubstr("declared this node lost"));
  EXPECT_THAT(frozen.err, HasSubstr("stopping 1 worker(s)"));
  for (pid_t p : workers) {
    EXPECT_TRUE(
        testing::eventually([p] { return !testing::process_alive(p); }, 30s))
        << "worker " << p << " survived";
  }
}

// The exit barrier: a node whose workers finished first waits for the
// others' (node 1's worker runs until the test lets it go).
// The store's host frozen (no FIN: as a host powered off): the other
// node's keep-alive finds it silent and ends the job there (it once gave up
// without a word while its watcher waited on a silent connection for 24 h,
// and held interrupt() for the read timeout).
TEST_F(Rendezvous, AFrozenStoreHostEndsTheJobOnTheOtherNodes) {
  conf_ += ",keep_alive_interval=1,read_timeout=3";
  for (int i = 0; i < 2; ++i) {
    start(i, {"--nnodes", "2"}, kShowEnv + "; echo RUNNING; exec sleep 300");
  }
  ASSERT_TRUE(all_print(2, "RUNNING"));
  std::vector<pid_t> workers = testing::descendants(agents_[1]->pid());
  ASSERT_FALSE(workers.empty());
  agents_[0]->signal(SIGSTOP);
  CommandResult r = finish(1);
  agents_[0]->signal(SIGKILL);
  agents_[0]->signal(SIGCONT);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("lost the agents' store at 127.0.0.1:" +
                               std::to_string(port_) + " (keep-alive: "));
  for (pid_t p : workers) {
    EXPECT_TRUE(
        testing::eventually([p] { return !testing::process_alive(p); }, 30s))
        << "worker " << p << " survived";
  }
}

TEST_F(Rendezvous, ANodeFinishingEarlyWaitsForTheOthers) {
  testing::TempDir dir;
  testing::Gate gate((dir / "go").string());
  const std::string script = "if [ $NODE = 1 ]; then echo HELD; read x < " +
                             gate.path() + "; fi; echo DONE";
  for (int i = 0; i < 2; ++i) start(i, {"--nnodes", "2"}, script);
  ASSERT_TRUE(agents_[1]->wait_for_output("HELD", 60s)) << agents_[1]->err();
  ASSERT_TRUE(agents_[0]->wait_for_output("waiting up to 300 s", 60s))
      << agents_[0]->err();
  EXPECT_THAT(agents_[0]->err(), HasSubstr("for the other nodes to finish"));
  // Still there: its barrier holds until node 1 is done.
  EXPECT_TRUE(testing::process_alive(agents_[0]->pid()));
  gate.open_once();
  for (int i = 0; i < 2; ++i) {
    CommandResult r = finish(i);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("DONE"));
  }
}

// A failure on a node releases the ones waiting in the barrier at once
// (the barrier's 5 minutes would fail the test's bound).
TEST_F(Rendezvous, AFailedNodeReleasesTheBarrierAtOnce) {
  testing::TempDir dir;
  testing::Gate gate((dir / "go").string());
  const std::string script = "if [ $NODE = 1 ]; then read x < " + gate.path() +
                             "; exit 7; fi; echo DONE";
  for (int i = 0; i < 2; ++i) start(i, {"--nnodes", "2"}, script);
  ASSERT_TRUE(agents_[0]->wait_for_output("for the other nodes to finish", 60s))
      << agents_[0]->err();
  gate.open_once();
  CommandResult r0 = agents_[0]->wait(60s);
  EXPECT_FALSE(r0.timed_out);
  EXPECT_EQ(r0.exit_code, 1) << r0.err;
  EXPECT_THAT(r0.err, HasSubstr("a worker on node 127.0.0.2/"));
  EXPECT_THAT(r0.err, HasSubstr("failed; no restarts left"));
  CommandResult r1 = finish(1);
  EXPECT_EQ(r1.exit_code, 7) << r1.err;
}

// The barrier's timeout: the node exits 0 (its workers succeeded) naming
// the node it waited for.
TEST_F(Rendezvous, TheExitBarrierTimeoutNamesWhoItWaitedFor) {
  const std::string script =
      "if [ $NODE = 1 ]; then echo HELD; exec sleep 300; fi";
  conf_ += ",close_timeout=1";
  for (int i = 0; i < 2; ++i) {
    start(i, {"--nnodes", "2", "--exit-barrier-timeout", "1"}, script);
  }
  ASSERT_TRUE(agents_[1]->wait_for_output("HELD", 60s)) << agents_[1]->err();
  CommandResult r0 = agents_[0]->wait(60s);
  EXPECT_EQ(r0.exit_code, 0) << r0.err;
  // Group ranks follow the join order.
  EXPECT_THAT(r0.err,
              ::testing::ContainsRegex(
                  "exit barrier: 127\\.0\\.0\\.2 \\(group rank [01]\\) did "
                  "not finish within 1 s \\(--exit-barrier-timeout\\)"));
  // Node 1's agent still holds its connections: named by address.
  EXPECT_THAT(r0.err, ::testing::ContainsRegex(
                          "dlaunch: [0-9]+ agent connection\\(s\\) from "
                          "127\\.0\\.0\\.[0-9]+ \\([0-9]+\\) still open on "
                          "this node's store 1 s \\(close_timeout\\) after "
                          "the end; closing it"));
  agents_[1]->signal(SIGTERM);
  CommandResult r1 = finish(1);
  EXPECT_FALSE(r1.timed_out);
}

// A node whose workers finished leaves after its exit barrier's timeout;
// the others' workers, still running, go on to the end: its going is no
// loss (it re-formed the round, killing healthy workers, and failed the
// job with "1/2 nodes joined").
TEST_F(Rendezvous, ANodeLeavingAfterItsExitBarrierLeavesTheOthersRunning) {
  testing::TempDir dir;
  testing::Gate gate((dir / "go").string());
  const std::string script = testing::restart_count_then_node0_waits(gate);
  for (int i = 0; i < 2; ++i) {
    start(i, {"--nnodes", "2", "--exit-barrier-timeout", "1"}, script);
  }
  CommandResult r1 = finish(1);
  EXPECT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_THAT(r1.err, HasSubstr("did not finish within 1 s"));
  // The loss is in the store by now; give the watcher a moment to act on
  // it, as it did before.
  std::this_thread::sleep_for(500ms);
  gate.open_once();
  CommandResult r0 = finish(0);
  EXPECT_EQ(r0.exit_code, 0) << r0.err;
  EXPECT_THAT(r0.err, ::testing::Not(HasSubstr("is gone")));
  EXPECT_EQ(r0.out, "[default0]:RC=0\n") << r0.err;
}

// keep_alive_max_attempt=1 (accepted, as torchrun does): a node is dropped
// after one interval of silence, so it must ping more often than that; it
// pinged every interval from the last ping's end, always late, and healthy
// nodes were dropped within seconds.
TEST_F(Rendezvous, OneKeepAliveAttemptKeepsHealthyNodes) {
  conf_ += ",keep_alive_interval=1,keep_alive_max_attempt=1";
  testing::TempDir dir;
  testing::Gate gate((dir / "go").string());
  const std::string script = testing::restart_count_then_node0_waits(gate);
  for (int i = 0; i < 2; ++i) start(i, {"--nnodes", "2"}, script);
  ASSERT_TRUE(all_print(2, "RC=0"));
  std::this_thread::sleep_for(4s);  // four of the store's allowances
  gate.open_once();
  for (int i = 0; i < 2; ++i) {
    CommandResult r = finish(i);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "[default0]:RC=0\n") << r.err;
  }
}

// A node that arrives after the job finished has nothing to do: exit 0,
// saying so. The store is a dl-store no agent hosts, so it outlives the job.
TEST_F(Rendezvous, ANodeArrivingAfterTheJobFinishedExitsZero) {
  Subprocess store({{DLAUNCH_BIN_DIR "/dl-store", "--host", "127.0.0.1",
                     "--port", std::to_string(port_)},
                    {},
                    {},
                    ""});
  for (int i = 0; i < 2; ++i) start(i, {"--nnodes", "2"}, kShowEnv, "false");
  for (int i = 0; i < 2; ++i) {
    CommandResult r = finish(i);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  start(2, {"--nnodes", "2"}, kShowEnv, "false");
  CommandResult late = finish(2);
  EXPECT_EQ(late.exit_code, 0) << late.err;
  EXPECT_THAT(late.err, HasSubstr("already finished"));
  EXPECT_TRUE(env_lines(late.out).empty()) << late.out;
}

// A node that arrives after every node gave up past --max-restarts is
// told so at once and fails, instead of waiting for a place until its
// join timeout (60 s here; finish() would report a timeout first).
TEST_F(Rendezvous, ANodeArrivingAfterTheJobGaveUpFailsSayingSo) {
  Subprocess store({{DLAUNCH_BIN_DIR "/dl-store", "--host", "127.0.0.1",
                     "--port", std::to_string(port_)},
                    {},
                    {},
                    ""});
  for (int i = 0; i < 2; ++i) {
    start(i, {"--nnodes", "2", "--max-restarts", "0"}, "exit 3", "false");
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = finish(i);
    ASSERT_NE(r.exit_code, 0) << r.out << r.err;
  }
  start(2, {"--nnodes", "2", "--max-restarts", "0"}, kShowEnv, "false");
  CommandResult late = agents_[2]->wait(45s);
  EXPECT_FALSE(late.timed_out) << "the late node waited for a place";
  EXPECT_EQ(late.exit_code, 1) << late.err;
  EXPECT_THAT(late.err, HasSubstr("already failed: its nodes used every "
                                  "restart --max-restarts allows and gave "
                                  "up"));
  EXPECT_TRUE(env_lines(late.out).empty()) << late.out;
}

TEST_F(Rendezvous, ALateNodeScalesTheJobUp) {
  const std::string script =
      kShowEnv +
      "; if [ $GROUP_WORLD_SIZE = 2 ]; then echo RUNNING; exec sleep 300; fi";
  for (int i = 0; i < 2; ++i) start(i, {"--nnodes", "2:3"}, script);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(agents_[i]->wait_for_output("RUNNING", 60s))
        << agents_[i]->err();
  }
  start(2, {"--nnodes", "2:3"}, script);
  expect_last_group(3, 3, 0);
}

// A re-formed round waits for each member of the last one (or its loss),
// however long it takes to stop its workers: here node 0's ignore SIGTERM
// for the 4 s of --term-timeout, past the 1 s last call. The round closed
// without it at the last call, and the nodes took turns holding rounds
// alone, for good: after a failure, and when a late node joined.
TEST_F(Rendezvous, AMemberSlowToStopItsWorkersIsWaitedForAfterAFailure) {
  conf_ = "join_timeout=60,last_call_timeout=1";
  const std::string script =
      kShowEnv +
      "; if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then if [ $NODE = 1 ]; then "
      "sleep 1; exit 3; fi; trap '' TERM; sleep 30; fi";
  for (int i = 0; i < 2; ++i) {
    start(i, {"--nnodes", "1:2", "--max-restarts", "3", "--term-timeout", "4"},
          script);
  }
  EXPECT_TRUE(all_print(2, "round 1 (failure): 2 nodes"));
  expect_last_group(2, 2, 1);
}

TEST_F(Rendezvous, AMemberSlowToStopItsWorkersIsWaitedForByALateNode) {
  conf_ = "join_timeout=60,last_call_timeout=1";
  const std::string script =
      kShowEnv +
      "; if [ $GROUP_WORLD_SIZE = 1 ]; then echo RUNNING; trap '' TERM; "
      "sleep 30; fi";
  const std::vector<std::string> flags = {"--nnodes", "1:2", "--term-timeout",
                                          "4"};
  start(0, flags, script);
  ASSERT_TRUE(agents_[0]->wait_for_output("RUNNING", 60s)) << agents_[0]->err();
  start(1, flags, script);
  EXPECT_TRUE(all_print(2, "round 1 ("));
  expect_last_group(2, 2, 0);
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(agents_[i]->err(),
                ::testing::ContainsRegex("round 1 \\([a-z ]+\\): 2 nodes"));
  }
}

// A node outside the running round that goes (a spare waiting for a place
// in a full round, or a static node given a taken --node-rank) leaves its
// "lost" on the round's event key, as every joiner registers one: the
// members go on (they once re-formed the round, or, static, ended the job).
TEST_F(Rendezvous, ANodeOutsideTheRoundGoingLeavesTheRoundAlone) {
  testing::TempDir dir;
  const std::string go = (dir / "go").string();
  const std::string script = kShowEnv + "; echo RUNNING; while [ ! -e " + go +
                             " ]; do sleep 0.05; done";
  struct Case {
    std::vector<std::string> flags;  // each node's, less a static node rank
    bool fixed;
  };
  for (const Case& c : {Case{{"--nnodes", "1:2"}, false},
                        Case{{"--rdzv-backend", "static", "--nnodes", "2",
                              "--master-addr", "127.0.0.1"},
                             true}}) {
    SCOPED_TRACE(c.fixed ? "static" : "c10d");
    std::filesystem::remove(go);
    id_ = "job" + std::to_string(::getpid()) + (c.fixed ? "s" : "c");
    auto flags = [&](int rank) {
      auto f = c.flags;
      if (c.fixed) f.insert(f.end(), {"--node-rank", std::to_string(rank)});
      return f;
    };
    for (int i = 0; i < 2; ++i) start(i, flags(i), script);
    ASSERT_TRUE(all_print(2, "RUNNING"));
    Subprocess& outsider = start(2, flags(1), script);
    if (c.fixed) {
      CommandResult r = finish(2);
      EXPECT_EQ(r.exit_code, 1);
      EXPECT_THAT(r.err, HasSubstr("with --node-rank 1 before this node "
                                   "(127.0.0.3); give each of the 2 nodes "
                                   "its own --node-rank, 0..1"));
    } else {
      // Two spares; the second goes. The first waits on: it once took
      // the loss for the round's end and formed a round of its own.
      ASSERT_TRUE(outsider.wait_for_output("waiting for a place", 60s))
          << outsider.err();
      Subprocess& other = start(3, flags(1), script);
      ASSERT_TRUE(other.wait_for_output("waiting for a place", 60s))
          << other.err();
      other.signal(SIGKILL);
      finish(3);
    }
    // The members' watchers see the loss within milliseconds, if at all,
    // and a spare that went on would report its new round within a second.
    std::this_thread::sleep_for(2000ms);
    if (!c.fixed) {
      EXPECT_THAT(outsider.out() + outsider.err(),
                  ::testing::Not(HasSubstr("waiting for nodes")));
    }
    testing::write_file(go, "");
    for (int i = 0; i < 2; ++i) {
      CommandResult r = finish(i);
      EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
      EXPECT_EQ(env_lines(r.out).size(), 1u) << r.out << r.err;
      EXPECT_THAT(r.err, ::testing::Not(HasSubstr("is gone")));
    }
    if (!c.fixed) {
      CommandResult r = finish(2);
      EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
      EXPECT_TRUE(env_lines(r.out).empty()) << r.out << r.err;
      EXPECT_THAT(r.err, HasSubstr("finished while this node waited"));
    }
  }
}

// A spare whose round stays full past its join timeout says so (it once
// blamed the store: "the agents' store ... failed: timed out").
TEST_F(Rendezvous, ASpareWhoseRoundStaysFullSaysSo) {
  testing::TempDir dir;
  const std::string go = (dir / "go").string();
  const std::string script = kShowEnv + "; echo RUNNING; while [ ! -e " + go +
                             " ]; do sleep 0.05; done";
  for (int i = 0; i < 2; ++i) start(i, {"--nnodes", "2"}, script);
  ASSERT_TRUE(all_print(2, "RUNNING"));
  conf_ = "join_timeout=3,last_call_timeout=5";
  start(2, {"--nnodes", "2"}, script);
  CommandResult spare = finish(2);
  EXPECT_EQ(spare.exit_code, 1) << spare.err;
  EXPECT_THAT(spare.err,
              HasSubstr("stayed full (2 nodes, the most --nnodes allows) for "
                        "the 3 s this node waited for a place"));
  testing::write_file(go, "");
  for (int i = 0; i < 2; ++i) EXPECT_EQ(finish(i).exit_code, 0);
}

// A node that fails to join (no port free on its --local-addr) before it is
// counted: the round still forms from the others (it once waited for that
// node's record, never written, until the store's read timeout).
TEST_F(Rendezvous, ANodeThatCannotJoinDoesNotHoldTheRoundUp) {
  conf_ += ",read_timeout=5";
  // 192.0.2.1 (TEST-NET-1) is no address of this machine.
  std::vector<std::string> argv = {kDlaunch,
                                   "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port_),
                                   "--rdzv-id",
                                   id_,
                                   "--local-addr",
                                   "192.0.2.1",
                                   "--rdzv-conf",
                                   "is_host=false," + conf_,
                                   "--rdzv-backend",
                                   "c10d",
                                   "--nnodes",
                                   "2",
                                   "true"};
  start(0, {"--nnodes", "2"}, kShowEnv);
  ASSERT_TRUE(agents_[0]->wait_for_output("waiting for nodes: 1/2 joined", 60s))
      << agents_[0]->err();
  testing::CommandOptions bad_node;
  bad_node.argv = argv;
  CommandResult bad = testing::run_command(bad_node, 60s);
  EXPECT_NE(bad.exit_code, 0) << bad.err;
  start(1, {"--nnodes", "2"}, kShowEnv);
  for (int i = 0; i < 2; ++i) {
    CommandResult r = finish(i);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(env_lines(r.out).size(), 1u) << r.out << r.err;
  }
}

TEST_F(Rendezvous, LogFoldersAreNumberedByRoundTheSameOnEveryNode) {
  // Nodes 0 and 1 run round 0; node 2 arrives and round 1 takes it in.
  // attempt_K is round K on every node, the late one included.
  const std::string script =
      kShowEnv +
      "; if [ $GROUP_WORLD_SIZE = 2 ]; then echo RUNNING; exec sleep 300; fi";
  testing::TempDir dir;
  auto flags = [&](int i) {
    return std::vector<std::string>{
        "--nnodes", "2:3", "--log-dir", (dir / std::to_string(i)).string(),
        "-t",       "1"};
  };
  for (int i = 0; i < 2; ++i) start(i, flags(i), script);
  ASSERT_TRUE(all_print(2, "RUNNING"));
  start(2, flags(2), script);
  for (int i = 0; i < 3; ++i) {
    CommandResult r = finish(i);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto run = dir / std::to_string(i) / id_;
    auto summary =
        nlohmann::json::parse(testing::read_file(run / "summary.json"));
    for (const auto& a : summary["attempts"]) {
      const std::string k = std::to_string(a["round"].get<int>());
      EXPECT_TRUE(std::filesystem::exists(run / ("attempt_" + k) / "0"))
          << "node " << i << " round " << k;
    }
    EXPECT_EQ(summary["attempts"].back()["round"], 1);
    EXPECT_THAT(testing::read_file(run / "attempt_1/0/stdout.log"),
                HasSubstr("gws=3"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "2" / id_ / "attempt_0"));
}

TEST_F(Rendezvous, AWorkerFailureOnOneNodeRestartsEveryNode) {
  const std::string script =
      kShowEnv +
      "; if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $NODE = 2 ]; then "
      "exit 3; fi";
  testing::TempDir dir;
  for (int i = 0; i < 3; ++i) {
    start(i,
          {"--nnodes", "3", "--max-restarts", "2", "--log-dir",
           (dir / std::to_string(i)).string()},
          script);
  }
  for (int i = 0; i < 3; ++i) {
    CommandResult r = finish(i);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    // The first attempt's workers may be stopped before they print.
    auto lines = env_lines(r.out);
    ASSERT_FALSE(lines.empty()) << r.out;
    EXPECT_EQ(lines.back().rc, 1);  // the same count on every node
    auto summary = nlohmann::json::parse(
        testing::read_file(dir / std::to_string(i) / id_ / "summary.json"));
    ASSERT_EQ(summary["attempts"].size(), 2u);
    EXPECT_EQ(summary["attempts"][0]["reason"], "start");
    EXPECT_EQ(summary["attempts"][1]["reason"], "failure");
    EXPECT_EQ(summary["attempts"][1]["members"].size(), 3u);
    EXPECT_EQ(summary["attempts"][0]["restart_count"], 0);
    EXPECT_EQ(summary["attempts"][1]["restart_count"], 1);
    // Group ranks unchanged across the restart.
    EXPECT_EQ(summary["attempts"][0]["group_rank"],
              summary["attempts"][1]["group_rank"]);
    EXPECT_EQ(summary["attempts"][1]["group_rank"], lines.back().gr);
  }
}

TEST_F(Rendezvous, TooFewNodesFailNamingWhoJoined) {
  std::vector<std::string> argv = {kDlaunch,
                                   "--rdzv-backend",
                                   "c10d",
                                   "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port_),
                                   "--local-addr",
                                   "127.0.0.1",
                                   "--nnodes",
                                   "2",
                                   "--rdzv-conf",
                                   "is_host=true,join_timeout=1",
                                   "true"};
  CommandResult r = testing::run_command({argv, {}, {}, ""}, 60s);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("1/2 nodes joined round 0"));
  EXPECT_THAT(r.err, HasSubstr("joined: 127.0.0.1"));
  // A loopback meeting place cannot be other hosts' (torchrun's defaults).
  EXPECT_THAT(r.err, HasSubstr("; 127.0.0.1 reaches this machine alone: nodes "
                               "on other hosts must name node 0's address "
                               "(--rdzv-endpoint HOST[:PORT], or --master-addr "
                               "HOST for the static backend)"));
}

// A program that is no dlaunch store holds the endpoint's port of this
// machine (it listens, never answers): the agent says at once that it
// joins the store there as another agent's, and when no handshake comes,
// that it could not serve it itself and how to pick a free port (it once
// said nothing for the join timeout, then "start the agent that hosts it").
TEST_F(Rendezvous, AForeignProgramOnTheStorePortIsNamed) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port_));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  std::vector<std::string> argv = {kDlaunch,
                                   "--rdzv-backend",
                                   "c10d",
                                   "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port_),
                                   "--nnodes",
                                   "1",
                                   "--rdzv-conf",
                                   "join_timeout=2",
                                   "true"};
  CommandResult r = testing::run_command({argv, {}, {}, ""}, 60s);
  ::close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("dlaunch: port " + std::to_string(port_) +
                               " of this machine is taken; joining the "
                               "agents' store there as another agent's\n"));
  EXPECT_THAT(r.err, HasSubstr("; this agent could not serve it itself ("));
  EXPECT_THAT(r.err,
              HasSubstr("): if a program other than dlaunch holds port " +
                        std::to_string(port_) +
                        ", pick a free one (--rdzv-endpoint "
                        "HOST:PORT)"));
}

// A joiner lost while the round waited for its minimum is named as lost,
// not counted (the message once said "2/2 nodes joined").
TEST_F(Rendezvous, TooFewNodesNameAJoinerLostWhileWaiting) {
  conf_ = "join_timeout=8,last_call_timeout=5";
  for (int i = 0; i < 2; ++i) start(i, {"--nnodes", "3:4"}, "true");
  ASSERT_TRUE(agents_[1]->wait_for_output("waiting for nodes: 2/", 60s))
      << agents_[1]->err();
  agents_[1]->signal(SIGKILL);
  finish(1);
  CommandResult r = finish(0);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("1/3 nodes joined round 0"));
  EXPECT_THAT(r.err, HasSubstr("joined: 127.0.0.1; lost while waiting: "
                               "127.0.0.2)"));
}

TEST_F(Rendezvous, JobsWithDifferentIdsShareAnExternalStore) {
  Subprocess store({{DLAUNCH_BIN_DIR "/dl-store", "--host", "127.0.0.1",
                     "--port", std::to_string(port_)},
                    {},
                    {},
                    ""});
  std::map<std::string, std::unique_ptr<Subprocess>> jobs;
  for (const std::string id : {"alpha", "beta"}) {
    for (int i = 0; i < 2; ++i) {
      id_ = id;
      start(i, {"--nnodes", "2"}, kShowEnv, "false");
      jobs[id + std::to_string(i)] = std::move(agents_[i]);
    }
  }
  for (auto& [name, agent] : jobs) {
    CommandResult r = agent->wait(120s);
    ASSERT_EQ(r.exit_code, 0) << name << r.out << r.err;
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0].gws, 2);
    EXPECT_EQ(lines[0].id, name.substr(0, name.size() - 1));
  }
}

// True once some thread of `pid` sits in write(2, ...): a console that
// accepts nothing holds it there.
bool blocked_writing_stderr(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  while (std::chrono::steady_clock::now() < end) {
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream f(t.path() / "syscall");
      std::string nr, fd;
      if (f >> nr >> fd && nr == "1" && fd == "0x2") return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST_F(Rendezvous, ProgressLinesNeverStallTheAgentOnAStuckConsole) {
  // Agent 0's stderr is a pipe that is full and that nobody reads: its
  // "waiting for nodes" line must queue like its other messages, not block
  // the rendezvous.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ::fcntl(p[1], F_SETFL, ::fcntl(p[1], F_GETFL) | O_NONBLOCK);
  const std::string filler(4096, 'x');
  while (::write(p[1], filler.data(), filler.size()) > 0) {
  }
  ::fcntl(p[1], F_SETFL, ::fcntl(p[1], F_GETFL) & ~O_NONBLOCK);
  start(0, {"--nnodes", "2"}, kShowEnv, "", p[1]);
  ::close(p[1]);
  // Reads the console to its end (bounded) once the test lets it.
  std::string console;
  std::thread drain;
  auto drain_console = [&] {
    if (drain.joinable()) return;
    drain = std::thread([&console, fd = p[0]] {
      const auto end = std::chrono::steady_clock::now() + 120s;
      char buf[65536];
      pollfd in{fd, POLLIN, 0};
      while (std::chrono::steady_clock::now() < end &&
             ::poll(&in, 1, 100) >= 0) {
        if (in.revents == 0) continue;
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) break;
        console.append(buf, static_cast<size_t>(n));
      }
    });
  };
  // The progress line is due a second after joining; it waits for room.
  bool blocked = blocked_writing_stderr(agents_[0]->pid(), 60s);
  bool ran = false;
  if (blocked) {
    start(1, {"--nnodes", "2"}, kShowEnv);
    ran = agents_[0]->wait_for_output("ENV node=0", 60s);
  }
  drain_console();
  for (int i = 0; i < static_cast<int>(agents_.size()); ++i) {
    CommandResult r = finish(i);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  drain.join();
  ::close(p[0]);
  ASSERT_TRUE(blocked) << "agent 0 never wrote to its console";
  EXPECT_TRUE(ran) << "agent 0 stalled on its console";
  EXPECT_THAT(console, HasSubstr("dlaunch: waiting for nodes: 1/2 joined"));
}

class TorchRendezvous : public Rendezvous {
 protected:
  void SetUp() override {
    CommandResult r = testing::run_command(
        {{"/usr/bin/python3", "-c", "import torch.distributed"}, {}, {}, ""},
        60s);
    if (r.exit_code != 0) GTEST_SKIP() << "python3 cannot import torch";
  }
};

TEST_F(TorchRendezvous, GlooAllReduceOnTwoAndThreeNodes) {
  for (int nodes : {2, 3}) {
    port_ = free_port();
    id_ = "torch" + std::to_string(nodes);
    for (int i = 0; i < nodes; ++i) {
      start(i, {"--nnodes", std::to_string(nodes), "--nproc-per-node", "2"},
            "exec /usr/bin/python3 -u " + kScripts + "allreduce_gloo.py");
    }
    int world = 2 * nodes;
    int sum = world * (world + 1) / 2;
    std::string all;
    for (int i = 0; i < nodes; ++i) {
      CommandResult r = finish(i);
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
      all += r.out;
    }
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_THAT(all, HasSubstr("rank " + std::to_string(rank) + "/" +
                                 std::to_string(world) +
                                 " allreduce=" + std::to_string(sum) + " ok"));
    }
  }
}

}  // namespace
}  // namespace dlaunch
