// The comm library across real processes: env://, tcp:// and file:// init,
// every collective under `dlaunch`, and a peer SIGKILLed mid all-reduce.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/file_store.h"
#include "tests/testing/bin.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::comm {
namespace {

using dlaunch::testing::CommandOptions;
using dlaunch::testing::CommandResult;
using dlaunch::testing::free_port;
using dlaunch::testing::process_state;
using dlaunch::testing::Subprocess;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kWorker = dlaunch::testing::bin("comm_test_worker");
const std::string kDlaunch = dlaunch::testing::bin("dlaunch");

// Starts `n` workers: rank r gets RANK=r, WORLD_SIZE=n and `env`.
std::vector<std::unique_ptr<Subprocess>> start_workers(
    int n, const std::vector<std::string>& args,
    std::map<std::string, std::string> env) {
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int r = 0; r < n; ++r) {
    CommandOptions o;
    o.argv = {kWorker};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.env = env;
    o.env["RANK"] = std::to_string(r);
    o.env["WORLD_SIZE"] = std::to_string(n);
    procs.push_back(std::make_unique<Subprocess>(o));
  }
  return procs;
}

// How many of `pid`'s TCP sockets have at least `bytes` written and not yet
// taken by the peer (the tx_queue of /proc/net/tcp).
int sockets_with_queued_bytes(pid_t pid, uint64_t bytes) {
  std::set<std::string> inodes;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(fds)) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      in >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >>
          timeout >> inode;
      if (!inodes.count(inode)) continue;
      uint64_t tx =
          std::stoull(queues.substr(0, queues.find(':')), nullptr, 16);
      if (tx >= bytes) ++n;
    }
  }
  return n;
}

// Polls `ok` every 10 ms for at most `timeout` (for state only /proc shows;
// finer than testing::eventually: start_p2p_stopping_receivers stops each
// receiver before its sender can finish).
bool eventually(const std::function<bool()>& ok, milliseconds timeout) {
  return testing::eventually(ok, timeout, milliseconds(10));
}

void expect_all_ok(std::vector<std::unique_ptr<Subprocess>>& procs) {
  const int n = static_cast<int>(procs.size());
  for (int r = 0; r < n; ++r) {
    CommandResult res = procs[r]->wait(seconds(60));
    EXPECT_EQ(res.exit_code, 0) << "rank " << r << ": " << res.err;
    EXPECT_THAT(res.out, HasSubstr("rank " + std::to_string(r) + " of " +
                                   std::to_string(n) + ": all collectives ok"));
  }
}

TEST(MultiProcessTest, EnvInitWithRankZeroServingTheStore) {
  auto procs = start_workers(4, {"collectives"},
                             {{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(free_port())},
                              {"DLAUNCH_COMM_TIMEOUT", "60"}});
  expect_all_ok(procs);
}

TEST(MultiProcessTest, TcpInit) {
  std::string init = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto procs =
      start_workers(3, {"collectives", init}, {{"DLAUNCH_COMM_TIMEOUT", "60"}});
  expect_all_ok(procs);
}

TEST(MultiProcessTest, FileInitOnASharedFile) {
  dlaunch::testing::TempDir dir;
  std::string init = "file://" + (dir / "rendezvous").string();
  auto procs = start_workers(
      3, {"collectives", init},
      {{"DLAUNCH_COMM_TIMEOUT", "60"}, {"DLAUNCH_GLOO_HOST", "127.0.0.1"}});
  expect_all_ok(procs);
}

TEST(MultiProcessTest, FileInitIgnoresKeysLeftByAKilledAttempt) {
  // The previous attempt's workers were killed: their addresses are still in
  // the file (kept alive here by one open store). The restarted attempt
  // must not read them.
  dlaunch::testing::TempDir dir;
  const std::string path = (dir / "rendezvous").string();
  auto stale = std::make_shared<FileStore>(path);
  for (const char* k :
       {"world/0", "world/1", "attempt0/world/0", "attempt0/world/1"}) {
    stale->set(k, std::string(64, '\x7f'));
  }
  auto procs = start_workers(2, {"collectives", "file://" + path},
                             {{"DLAUNCH_COMM_TIMEOUT", "20"},
                              {"DLAUNCH_GLOO_HOST", "127.0.0.1"},
                              {"TORCHELASTIC_RESTART_COUNT", "1"}});
  expect_all_ok(procs);
}

TEST(MultiProcessTest, LargeAllReduceFallsBackToTcpWhenSharedMemoryFails) {
  // Rank 1 cannot create its segment; every rank must notice and use TCP.
  for (bool limit : {false, true}) {
    std::vector<std::unique_ptr<Subprocess>> procs;
    const std::string port = std::to_string(free_port());
    for (int r = 0; r < 3; ++r) {
      CommandOptions o;
      o.argv = {kWorker, "big-allreduce"};
      o.env = {{"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port},
               {"RANK", std::to_string(r)},
               {"WORLD_SIZE", "3"},
               {"DLAUNCH_COMM_TIMEOUT", "20"}};
      if (limit && r == 1) o.env["COMM_TEST_FSIZE_LIMIT"] = "65536";
      procs.push_back(std::make_unique<Subprocess>(o));
    }
    for (int r = 0; r < 3; ++r) {
      CommandResult res = procs[r]->wait(seconds(30));
      EXPECT_EQ(res.exit_code, 0)
          << "rank " << r << (limit ? " (limited)" : "") << ": " << res.err;
      // Which path ran, not only the result.
      EXPECT_THAT(res.out, HasSubstr(limit ? "big all_reduce ok (tcp)"
                                           : "big all_reduce ok (shm-chunks)"));
    }
  }
}

TEST(MultiProcessTest, SubGroupsCreatedFromTwoThreadsAtOnce) {
  // Over the TCP store: each rendezvous must block on its own connection,
  // or the two threads' rendezvous would wait for each other across ranks
  // until the timeout (60 s) failed them: exit 0 is the proof.
  auto procs = start_workers(3, {"concurrent-groups"},
                             {{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(free_port())},
                              {"DLAUNCH_COMM_TIMEOUT", "60"}});
  for (int r = 0; r < 3; ++r) {
    CommandResult res = procs[r]->wait(seconds(120));
    EXPECT_EQ(res.exit_code, 0) << "rank " << r << ": " << res.err;
    EXPECT_THAT(res.out, HasSubstr("concurrent groups ok"));
  }
}

// A member that dies while a sub-group is being created (here rank 1,
// between new_group's argument check and its connections) fails the
// others at once, named: they waited the whole timeout (60 s here) for
// its key, the message naming only the key.
TEST(MultiProcessTest, AMemberDyingInNewGroupFailsTheOthersNamingIt) {
  auto procs = start_workers(3, {"new-group"},
                             {{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(free_port())},
                              {"DLAUNCH_COMM_TIMEOUT", "60"},
                              {"DLAUNCH_COMM_TEST_EXIT_IN_NEW_GROUP", "1"}});
  EXPECT_EQ(procs[1]->wait(seconds(60)).exit_code, 7);
  for (int r : {0, 2}) {
    // Well within the 60 s timeout (a hang guard, not a measurement).
    CommandResult res = procs[r]->wait(seconds(30));
    EXPECT_FALSE(res.timed_out) << "rank " << r << " waited out its timeout";
    EXPECT_EQ(res.exit_code, 3) << "rank " << r << ": " << res.err;
    EXPECT_THAT(res.err,
                HasSubstr("rank 1 of group 'world' left (it failed or exited) "
                          "while this group was being created"));
  }
}

TEST(MultiProcessTest, EachCollectiveUnderDlaunch) {
  CommandOptions o;
  o.argv = {kDlaunch, "--nproc-per-node", "4", kWorker, "collectives"};
  o.env["DLAUNCH_COMM_TIMEOUT"] = "60";
  CommandResult res = dlaunch::testing::run_command(o, seconds(90));
  EXPECT_EQ(res.exit_code, 0) << res.out << res.err;
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(res.out + res.err, HasSubstr("rank " + std::to_string(r) +
                                             " of 4: all collectives ok"));
  }
}

// Rank 0 exits in its third all_reduce; rank 1 fails in it and then, silent,
// waits for the agent's SIGTERM, as a worker stopped before it could print
// its CommError: the line comm wrote as it raised the failure is in the
// job's output all the same.
TEST(MultiProcessTest, AFailureIsToldBeforeTheAgentStopsTheWorker) {
  CommandOptions o;
  o.argv = {kDlaunch, "--nproc-per-node", "2", kWorker,
            "allreduce-until-stopped"};
  o.env["DLAUNCH_COMM_TIMEOUT"] = "60";
  o.env["DLAUNCH_COMM_FAULTS"] = "exit:rank=0:op=all_reduce:call=3:code=4";
  CommandResult res = dlaunch::testing::run_command(o, seconds(90));
  EXPECT_NE(res.exit_code, 0) << res.out << res.err;
  EXPECT_THAT(res.err, HasSubstr("dlaunch comm: all_reduce on group 'world' "
                                 "(rank 1 of 2) failed: "));
  EXPECT_THAT(res.err, HasSubstr("rank 0 has left the group"));
}

TEST(MultiProcessTest, BusyMasterPortAndUnreachableStoreAreClearErrors) {
  // Something else listens on the port rank 0 should serve the store on.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string busy = std::to_string(ntohs(a.sin_port));
  auto procs = start_workers(1, {"collectives"},
                             {{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", busy},
                              {"DLAUNCH_COMM_TIMEOUT", "5"}});
  CommandResult res = procs[0]->wait(seconds(30));
  close(fd);
  EXPECT_EQ(res.exit_code, 3);
  EXPECT_THAT(res.err,
              HasSubstr("rank 0 cannot serve the store on port " + busy));
  EXPECT_THAT(res.err, HasSubstr("MASTER_PORT must be free"));

  // Rank 1 of 2 with no rank 0 anywhere: gives up after the timeout.
  CommandOptions o;
  o.argv = {kWorker, "collectives"};
  o.env = {{"MASTER_ADDR", "127.0.0.1"},
           {"MASTER_PORT", std::to_string(free_port())},
           {"RANK", "1"},
           {"WORLD_SIZE", "2"},
           {"DLAUNCH_COMM_TIMEOUT", "1"}};
  // (At the default 30 minutes, the run's 60 s would time out.)
  CommandResult lone = dlaunch::testing::run_command(o, seconds(60));
  EXPECT_FALSE(lone.timed_out);
  EXPECT_EQ(lone.exit_code, 3);
  EXPECT_THAT(lone.err, HasSubstr("rank 1 cannot reach the store that rank 0 "
                                  "serves at 127.0.0.1:"));
}

TEST(MultiProcessTest, PeerKilledMidAllReduceFailsTheOthersFast) {
  // Timeout 300 s: the survivors must notice the death itself, not time
  // out (each is waited for 60 s at most).
  auto procs = start_workers(4, {"allreduce-loop"},
                             {{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(free_port())},
                              {"DLAUNCH_COMM_TIMEOUT", "300"}});
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(procs[r]->wait_for_output(
        "rank " + std::to_string(r) + " ready", seconds(30)))
        << "rank " << r << ": " << procs[r]->err();
  }
  procs[2]->signal(SIGKILL);
  for (int r : {0, 1, 3}) {
    CommandResult res = procs[r]->wait(seconds(60));
    EXPECT_FALSE(res.timed_out) << "rank " << r << " hung";
    EXPECT_EQ(res.exit_code, 3) << "rank " << r << ": " << res.err;
    EXPECT_THAT(res.err, HasSubstr("all_reduce on group 'world'"));
    EXPECT_THAT(res.err, HasSubstr("rank 2"));
  }
}

// The p2p-from-last job on 3 ranks (timeout 120 s, shared memory as
// `shm` says): once ranks 0 and 1 have posted their receives from rank 2
// over `path`, they are SIGSTOPped; only then does rank 2 post its sends
// (`gate`: a running receiver could take its whole payload); returns when
// it has.
std::vector<std::unique_ptr<Subprocess>> start_p2p_stopping_receivers(
    const std::string& path, const std::string& shm,
    dlaunch::testing::Gate& gate) {
  auto procs = start_workers(3, {"p2p-from-last"},
                             {{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(free_port())},
                              {"DLAUNCH_COMM_TIMEOUT", "120"},
                              {"DLAUNCH_COMM_SHM_MIN_BYTES", shm},
                              {"DLT_SEND_GATE", gate.path()}});
  for (int r : {0, 1}) {
    EXPECT_TRUE(procs[r]->wait_for_output(
        "rank " + std::to_string(r) + " waiting (" + path + ")", seconds(30)))
        << "rank " << r << ": " << procs[r]->out() << procs[r]->err();
    procs[r]->signal(SIGSTOP);
    EXPECT_TRUE(eventually(
        [&] { return process_state(procs[r]->pid()) == 'T'; }, seconds(30)));
  }
  gate.open_once();
  EXPECT_TRUE(
      procs[2]->wait_for_output("rank 2 sending (" + path + ")", seconds(30)))
      << procs[2]->out() << procs[2]->err();
  return procs;
}

// SIGKILLs rank 2 and resumes ranks 0 and 1, whose receives must fail at
// once naming it, not at the 120 s timeout.
void kill_sender_expecting_fast_failures(
    std::vector<std::unique_ptr<Subprocess>>& procs) {
  procs[2]->signal(SIGKILL);
  EXPECT_EQ(procs[2]->wait(seconds(30)).signal, SIGKILL);
  for (int r : {0, 1}) procs[r]->signal(SIGCONT);
  for (int r : {0, 1}) {
    CommandResult res = procs[r]->wait(seconds(60));
    EXPECT_FALSE(res.timed_out) << "rank " << r << " waited for the timeout";
    EXPECT_EQ(res.exit_code, 3) << "rank " << r << ": " << res.out << res.err;
    EXPECT_THAT(res.err,
                HasSubstr("recv from rank 2 (tag 0) on group 'world'"));
    EXPECT_THAT(res.err, HasSubstr("connection to rank 2 lost"));
  }
}

TEST(MultiProcessTest, PeerKilledMidTransferFailsPendingReceivesFast) {
  // Ranks 0 and 1 each receive 64 MiB from rank 2, over TCP (shared memory
  // off, so that this keeps testing TCP now that point to point has a
  // shared-memory path). The receivers are stopped once their receive is
  // posted, so rank 2 fills the sockets and blocks mid-payload; it is killed
  // there. Gloo tells a failed connection only to operations still queued
  // on it, not to a receive whose bytes are in transfer: the survivors must
  // notice the death themselves, not wait out the 120 s timeout.
  dlaunch::testing::TempDir dir;
  dlaunch::testing::Gate gate((dir / "send").string());
  auto procs = start_p2p_stopping_receivers("tcp", "off", gate);
  // Payload bytes queued towards both receivers (more than any control
  // message): both are mid-transfer.
  ASSERT_TRUE(eventually(
      [&] { return sockets_with_queued_bytes(procs[2]->pid(), 4096) >= 2; },
      seconds(30)))
      << "sockets of rank 2 with bytes queued: "
      << sockets_with_queued_bytes(procs[2]->pid(), 1);
  kill_sender_expecting_fast_failures(procs);
}

// The names of comm's shared-memory segments in /dev/shm right now (files;
// the folders dlaunch agents of concurrent tests make there are not ours).
std::set<std::string> shm_names() {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind("dlaunch-", 0) == 0) {
      out.insert(name);
    }
  }
  return out;
}

// Other jobs' segments come and go; those created since `before` (ours)
// must all be gone.
void expect_no_new_shm(const std::set<std::string>& before) {
  std::set<std::string> left;
  EXPECT_TRUE(eventually(
      [&] {
        left.clear();
        for (const auto& n : shm_names()) {
          if (!before.count(n)) left.insert(n);
        }
        return left.empty();
      },
      seconds(30)));
  for (const auto& n : left) ADD_FAILURE() << "left in /dev/shm: " << n;
}

// The op-loop job on 3 ranks (timeout 60 s, DLAUNCH_COMM_CMA=`cma`),
// running `op` on `bytes` until it fails; returned once every rank has done
// one (empty if one never did, a failure added).
std::vector<std::unique_ptr<Subprocess>> start_op_loop(const char* op,
                                                       const char* bytes,
                                                       const char* cma = "") {
  auto procs = start_workers(3, {"op-loop", op, bytes},
                             {{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(free_port())},
                              {"DLAUNCH_COMM_TIMEOUT", "60"},
                              {"DLAUNCH_COMM_CMA", cma}});
  for (int r = 0; r < 3; ++r) {
    if (!procs[r]->wait_for_output("rank " + std::to_string(r) + " ready",
                                   seconds(30))) {
      ADD_FAILURE() << op << " of " << bytes << " bytes, rank " << r
                    << " never ready: " << procs[r]->err();
      return {};
    }
  }
  return procs;
}

// Each collective on shared memory, its data with the check (4 KiB) and in
// segment steps (8 MiB), and the data-moving ones in single copy
// (DLAUNCH_COMM_CMA=on; all_to_all here is in place, so it takes the
// segments): a rank SIGKILLed mid-loop fails the others at once, naming
// it, and leaves nothing in /dev/shm.
TEST(MultiProcessTest, PeerKilledMidEachSharedMemoryOperationFailsTheOthers) {
  const std::set<std::string> before = shm_names();
  auto kill_mid = [](const char* op, const char* bytes, const char* cma) {
    const std::string what =
        std::string(op) + " of " + bytes + " bytes, single copy '" + cma + "'";
    auto procs = start_op_loop(op, bytes, cma);
    ASSERT_FALSE(procs.empty()) << what;
    procs[1]->signal(SIGKILL);
    for (int r : {0, 2}) {
      CommandResult res = procs[r]->wait(seconds(15));
      EXPECT_FALSE(res.timed_out) << what << ": rank " << r << " hung";
      EXPECT_EQ(res.exit_code, 3) << what << ", rank " << r << ": " << res.err;
      EXPECT_THAT(res.err, HasSubstr(std::string(op) + " on group 'world'"))
          << what;
      EXPECT_THAT(res.err, HasSubstr("rank 1")) << what;
    }
  };
  for (const char* op :
       {"broadcast", "reduce", "all_reduce", "scatter", "gather", "all_gather",
        "reduce_scatter", "all_to_all", "barrier"}) {
    for (const char* bytes : {"4096", "8388608"}) kill_mid(op, bytes, "");
  }
  for (const char* op : {"broadcast", "scatter", "gather", "all_gather"}) {
    kill_mid(op, "8388608", "on");
  }
  expect_no_new_shm(before);
}

// Four ranks on two simulated hosts (ranks 0,1 and 2,3) looping over
// 16 MiB all_reduces (the hierarchical path) with DLAUNCH_COMM_TIMEOUT
// `timeout`; empty unless every rank got ready.
std::vector<std::unique_ptr<Subprocess>> start_on_two_hosts(
    const std::string& timeout) {
  auto procs = start_workers(4, {"op-loop", "all_reduce", "16777216"},
                             {{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(free_port())},
                              {"DLAUNCH_COMM_TIMEOUT", timeout},
                              {"DLAUNCH_COMM_TEST_HOSTS", "a,a,b,b"}});
  for (int r = 0; r < 4; ++r) {
    if (!procs[r]->wait_for_output("rank " + std::to_string(r) + " ready",
                                   seconds(30))) {
      ADD_FAILURE() << "rank " << r << " not ready: " << procs[r]->err();
      return {};
    }
  }
  return procs;
}

// Two simulated hosts (ranks 0,1 and 2,3): the hierarchical all_reduce.
// Rank 2, host b's leader, is stopped (rank 0 waits for it among the
// leaders, rank 1 for rank 0 in its host's broadcast, rank 3 for rank 2),
// then killed. Every other rank fails at once with the world group's
// error naming world rank 2; rank 1 once waited out the whole timeout in
// the broadcast, and the errors named sub-groups' ranks ("connection to
// rank 1 lost" on group 'world/3').
TEST(MultiProcessTest, ARankKilledMidHierarchicalAllReduceFailsTheOthers) {
  const std::set<std::string> before = shm_names();
  auto procs = start_on_two_hosts("60");
  ASSERT_EQ(procs.size(), 4u);
  procs[2]->signal(SIGSTOP);
  ASSERT_TRUE(eventually([&] { return process_state(procs[2]->pid()) == 'T'; },
                         seconds(10)));
  std::this_thread::sleep_for(milliseconds(500));  // the others wait on it
  procs[2]->signal(SIGKILL);
  for (int r : {0, 1, 3}) {
    CommandResult res = procs[r]->wait(seconds(20));
    EXPECT_FALSE(res.timed_out) << "rank " << r << " hung";
    EXPECT_EQ(res.exit_code, 3) << "rank " << r << ": " << res.err;
    // Rank 2 named before any sub-group's words ("[gloo: ..."); ranks
    // that failed first may be named lost too.
    EXPECT_THAT(res.err,
                ::testing::ContainsRegex(
                    "all_reduce on group 'world' \\(rank " + std::to_string(r) +
                    " of 4\\) failed: [^[]*rank 2"))
        << res.err;
  }
  expect_no_new_shm(before);
}

// The same hierarchy, rank 3 (host b, not its leader) stopped for good in
// the middle of 16 MiB all_reduces: the others time out naming the late
// ranks as world ranks before any sub-group's words; a phase's timeout
// said "none reported a failure" on the world group and named them only
// as the sub-group's ranks.
TEST(MultiProcessTest, AHierarchicalAllReduceTimeoutNamesTheLateWorldRanks) {
  auto procs = start_on_two_hosts("3");
  ASSERT_EQ(procs.size(), 4u);
  procs[3]->signal(SIGSTOP);
  // Rank 2 times out waiting for rank 3 in host b's reduce. Ranks 0 and 1
  // wait elsewhere (among the leaders, in host a's broadcast): they time
  // out naming whom their phase lacks, or see rank 2 fail first.
  std::string rank2;
  for (int r : {0, 1, 2}) {
    CommandResult res = procs[r]->wait(seconds(30));
    EXPECT_FALSE(res.timed_out) << "rank " << r << " hung";
    EXPECT_EQ(res.exit_code, 3) << "rank " << r << ": " << res.err;
    EXPECT_THAT(res.err, HasSubstr("all_reduce on group 'world' (rank " +
                                   std::to_string(r) + " of 4) failed: "));
    EXPECT_THAT(res.err, Not(HasSubstr("none reported a failure")));
    if (r == 2) rank2 = res.err;
  }
  EXPECT_THAT(rank2, ::testing::ContainsRegex(
                         "all_reduce on group 'world' \\(rank 2 of 4\\) "
                         "failed: timed out after [^[]*waiting for rank 3 "));
  procs[3]->signal(SIGKILL);
}

// Rank 1 is SIGKILLed while rank 2 is stopped: rank 0 sees it leave (also
// while it waits for the stopped rank), fails and exits, taking the store
// it hosts with it. Rank 2, resumed, finds ranks 0 and 1 gone and must
// still report rank 0's failure as the group's first: it comes from
// shared memory, not from the dead store. Under load this was a race (rank
// 2 reading the store before or after rank 0 exited); stopping rank 2
// makes it the losing case every time.
TEST(MultiProcessTest, TheFirstFailureOutlivesTheRankHostingTheStore) {
  const std::set<std::string> before = shm_names();
  for (const char* op : {"broadcast", "all_reduce"}) {
    for (const char* bytes : {"4096", "8388608"}) {
      const std::string what = std::string(op) + " of " + bytes + " bytes";
      auto procs = start_op_loop(op, bytes);
      ASSERT_FALSE(procs.empty()) << what;
      procs[2]->signal(SIGSTOP);
      ASSERT_TRUE(eventually(
          [&] { return process_state(procs[2]->pid()) == 'T'; }, seconds(10)));
      procs[1]->signal(SIGKILL);
      CommandResult r0 = procs[0]->wait(seconds(30));
      EXPECT_FALSE(r0.timed_out) << what << ": rank 0 waited for rank 2";
      EXPECT_EQ(r0.exit_code, 3) << what << ": " << r0.err;
      const std::string first = std::string(op) +
                                " on group 'world' (rank 0 of 3) failed: "
                                "rank 1 has left the group";
      EXPECT_THAT(r0.err, HasSubstr(first)) << what;
      procs[2]->signal(SIGCONT);
      CommandResult r2 = procs[2]->wait(seconds(30));
      EXPECT_FALSE(r2.timed_out) << what << ": rank 2 hung";
      EXPECT_EQ(r2.exit_code, 3) << what << ": " << r2.err;
      EXPECT_THAT(r2.err, HasSubstr("(first failure, rank 0: " + first))
          << what;
    }
  }
  expect_no_new_shm(before);
}

// The same over shared memory (the default between ranks on one host):
// rank 2's sends fill the rings to the stopped receivers (a ring holds far
// less than 64 MiB) and it blocks mid-payload; it is SIGKILLed there. The
// receivers must notice the death, not wait out the 120 s timeout, and
// nothing may stay in /dev/shm.
TEST(MultiProcessTest, PeerKilledMidSharedMemoryTransferFailsReceivesFast) {
  const std::set<std::string> before = shm_names();
  // Posting wrote the first ring's worth of each payload.
  dlaunch::testing::TempDir dir;
  dlaunch::testing::Gate gate((dir / "send").string());
  auto procs = start_p2p_stopping_receivers("shm-p2p", "", gate);
  kill_sender_expecting_fast_failures(procs);
  expect_no_new_shm(before);
}

TEST(MultiProcessTest, StoreAddressThatNeverResolvesFailsAtTheTimeout) {
  // The resolver alone would wait 30 s per try, 5 tries. The store connect
  // must give up at the 1 s timeout, naming the host.
  dlaunch::testing::TempDir dir;
  dlaunch::testing::SilentNameserver dns((dir / "resolv.conf").string());
  if (!dns.ok()) GTEST_SKIP() << dns.why();
  CommandOptions o;
  o.argv = dns.wrap({kWorker, "collectives"});
  o.env = {{"MASTER_ADDR", "dlaunch-test.invalid"},
           {"MASTER_PORT", std::to_string(free_port())},
           {"RANK", "1"},
           {"WORLD_SIZE", "2"},
           {"DLAUNCH_COMM_TIMEOUT", "1"},
           {"RES_OPTIONS", dlaunch::testing::SilentNameserver::kResOptions}};
  CommandResult res = dlaunch::testing::run_command(o, seconds(60));
  EXPECT_EQ(res.exit_code, 3) << res.out << res.err;
  EXPECT_THAT(res.err, HasSubstr("cannot resolve host 'dlaunch-test.invalid'"));
  EXPECT_THAT(res.err, HasSubstr("unreachable after 1 s"));
  EXPECT_FALSE(res.timed_out) << "the resolver's 150 s, not the 1 s";
}

}  // namespace
}  // namespace dlaunch::comm
