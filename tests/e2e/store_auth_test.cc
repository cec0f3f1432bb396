// Store authentication end to end (docs/store.md, "Authentication"): real
// `dlaunch` agents on 127.0.0.x sharing a job token meet and run a gloo
// job; a client without the token, or with another, can neither read nor
// write the agents' store nor a worker's env:// store; bad token sources
// are exit 2. Waits are bounded and on observed output.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <sys/stat.h>

#include <csignal>
#include <memory>
#include <regex>
#include <set>

#include "comm/store/client.h"
#include "comm/store/resolve.h"
#include "comm/store/token.h"
#include "comm/store/wire.h"
#include "tests/comm/store/store_test_util.h"
#include "tests/testing/bin.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

using comm::store::StoreAuthError;
using comm::store::TcpStore;
using comm::store::TcpStoreOptions;
using testing::CommandOptions;
using testing::CommandResult;
using testing::free_port;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Subprocess;
using namespace std::chrono_literals;

const std::string kDlaunch = testing::bin("dlaunch");
const std::string kWorker = testing::bin("comm_test_worker");
const std::string kToken = "e2e-job-token-0123456789abcdef";

// What a client presenting `token` (empty: none) gets from the store at
// 127.0.0.1:port: the StoreAuthError's message, or "connected".
std::string refusal(int port, const std::string& token) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = static_cast<uint16_t>(port);
  o.connect_timeout = 10s;
  o.token = token;
  try {
    TcpStore::connect(o);
  } catch (const StoreAuthError& e) {
    return e.what();
  }
  return "connected";
}

// Neither a tokenless client nor one with another token gets in.
void expect_locked(int port) {
  EXPECT_THAT(refusal(port, ""),
              HasSubstr("requires the job's token and this client has none"));
  EXPECT_THAT(refusal(port, kToken + "-other"),
              HasSubstr("refused this client: wrong token"));
}

class StoreAuth : public ::testing::Test {
 protected:
  // Agent `i` of a two-node c10d job: 127.0.0.(i+1), agent 0 hosting the
  // store; `env` on top of the test's environment.
  std::unique_ptr<Subprocess> agent(int i, std::vector<std::string> flags,
                                    std::map<std::string, std::string> env,
                                    std::vector<std::string> program) {
    CommandOptions o;
    o.argv = {kDlaunch,
              "--nnodes",
              "2",
              "--nproc-per-node",
              "2",
              "--rdzv-backend",
              "c10d",
              "--rdzv-endpoint",
              "127.0.0.1:" + std::to_string(port_),
              "--rdzv-id",
              "auth" + std::to_string(::getpid()),
              "--local-addr",
              "127.0.0." + std::to_string(i + 1)};
    std::string conf = std::string("is_host=") + (i == 0 ? "true" : "false") +
                       ",join_timeout=60,last_call_timeout=1";
    for (const std::string& f : flags) conf += "," + f;
    o.argv.insert(o.argv.end(), {"--rdzv-conf", conf});
    o.argv.insert(o.argv.end(), program.begin(), program.end());
    o.env = std::move(env);
    o.env["DLAUNCH_COMM_TIMEOUT"] = "60";
    o.unset_env = {comm::store::kTokenEnv};
    if (o.env.count(comm::store::kTokenEnv)) o.unset_env.clear();
    return std::make_unique<Subprocess>(o);
  }

  int port_ = free_port();
  testing::TempDir dir_;
};

TEST_F(StoreAuth, AgentsWithTheJobsTokenMeetAndTheirWorkersUseIt) {
  // One agent takes the token from the environment, the other from a file;
  // every worker checks it carries the token, then all four run a gloo job
  // over rank 0's env:// store, which requires it.
  testing::write_file(dir_ / "token", kToken + "\n", 0600);
  std::vector<std::string> program = {
      "sh", "-c",
      "test \"$DLAUNCH_RDZV_TOKEN\" = " + kToken + " && exec " + kWorker +
          " collectives"};
  auto a = agent(0, {}, {{comm::store::kTokenEnv, kToken}}, program);
  auto b = agent(1, {"token_file=" + (dir_ / "token").string()}, {}, program);
  for (auto* p : {a.get(), b.get()}) {
    CommandResult r = p->wait(120s);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.out + r.err, HasSubstr("all collectives ok"));
    EXPECT_THAT(r.err, Not(HasSubstr("warning")));
  }
}

TEST_F(StoreAuth, OnlyTheJobsTokenReadsOrWritesTheAgentsStore) {
  auto host = agent(0, {}, {{comm::store::kTokenEnv, kToken}}, {"true"});
  // The host is up and waits for the second node.
  ASSERT_TRUE(host->wait_for_output("waiting for nodes: 1/2", 30s))
      << host->err();
  expect_locked(port_);
  // Raw requests for the job's keys get an error and a close, no value.
  const std::string cur = "dlaunch/rdzv/auth" + std::to_string(::getpid());
  comm::store::wire::Request get;
  get.type = comm::store::wire::MsgType::kGet;
  get.keys = {cur + "/cur"};
  get.timeout_ms = 1000;
  comm::store::wire::Request set = get;
  set.type = comm::store::wire::MsgType::kSet;
  set.values = {"7"};
  for (const std::string& token : {std::string(), kToken + "-other"}) {
    for (const auto& request : {get, set}) {
      auto a = comm::store::testing::raw_request(port_, token, request);
      EXPECT_EQ(a.type, comm::store::wire::MsgType::kError) << a.bytes;
      EXPECT_TRUE(a.closed);
    }
  }

  // An agent with another token, or none, fails at once saying why.
  for (const auto& env : {std::map<std::string, std::string>{},
                          std::map<std::string, std::string>{
                              {comm::store::kTokenEnv, kToken + "-other"}}}) {
    auto stranger = agent(1, {}, env, {"true"});
    CommandResult r = stranger->wait(60s);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.err, HasSubstr("the agents' store refused this agent"));
    EXPECT_THAT(
        r.err, HasSubstr(env.empty() ? "this client has none" : "wrong token"));
    EXPECT_THAT(r.err, HasSubstr("DLAUNCH_RDZV_TOKEN"));
    EXPECT_THAT(r.out + r.err, Not(HasSubstr(kToken)));
  }

  // The real second node joins and the job completes.
  auto member = agent(1, {}, {{comm::store::kTokenEnv, kToken}}, {"true"});
  for (auto* p : {host.get(), member.get()}) {
    CommandResult r = p->wait(120s);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  CommandResult h = host->wait(1s);
  EXPECT_THAT(h.out + h.err, HasSubstr("wrong token"));  // the store's log
  EXPECT_THAT(h.out + h.err, Not(HasSubstr(kToken)));
}

TEST_F(StoreAuth, TheHostedStoresWarningsGoToStderrNotStdout) {
  // A refused client makes the agents' store (hosted in `dlaunch`) log a
  // warning: it must land on dlaunch's stderr, never in stdout, which
  // carries only the workers' output.
  auto host = agent(0, {}, {{comm::store::kTokenEnv, kToken}},
                    {"echo", "worker-output"});
  ASSERT_TRUE(host->wait_for_output("waiting for nodes: 1/2", 30s))
      << host->err();
  EXPECT_THAT(refusal(port_, kToken + "-other"),
              HasSubstr("refused this client: wrong token"));
  ASSERT_TRUE(host->wait_for_output("closing connection from", 30s))
      << host->err();
  auto member = agent(1, {}, {{comm::store::kTokenEnv, kToken}}, {"true"});
  EXPECT_EQ(member->wait(120s).exit_code, 0);
  CommandResult h = host->wait(120s);
  EXPECT_EQ(h.exit_code, 0) << h.out << h.err;
  EXPECT_THAT(h.err, HasSubstr("store: closing connection from"));
  EXPECT_THAT(h.err, HasSubstr("wrong token"));
  EXPECT_THAT(h.out, Not(HasSubstr("store:")));
  EXPECT_THAT(h.out, Not(HasSubstr("wrong token")));
  EXPECT_THAT(h.out, HasSubstr("worker-output"));
}

TEST_F(StoreAuth, AWorkersEnvStoreRefusesClientsWithoutTheToken) {
  // One node, no token given: the agent makes one for its workers, whose
  // rank 0 store on MASTER_PORT then takes no stranger.
  const int master_port = free_port();
  CommandOptions o;
  o.argv = {kDlaunch,        "--nproc-per-node",          "2",
            "--master-port", std::to_string(master_port), kWorker,
            "allreduce-loop"};
  o.env["DLAUNCH_COMM_TIMEOUT"] = "60";
  o.unset_env = {comm::store::kTokenEnv};
  Subprocess job(o);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(
        job.wait_for_output("rank " + std::to_string(r) + " ready", 60s))
        << job.out() << job.err();
  }
  expect_locked(master_port);
  job.signal(SIGTERM);
  EXPECT_FALSE(job.wait(60s).timed_out);
}

TEST_F(StoreAuth, OneNodeWorkersGetAFreshTokenEachRun) {
  CommandOptions o;
  o.argv = {kDlaunch, "--nproc-per-node",
            "2",      "sh",
            "-c",     "echo TOKEN=$DLAUNCH_RDZV_TOKEN"};
  o.unset_env = {comm::store::kTokenEnv};
  std::set<std::string> seen;
  for (int run = 0; run < 2; ++run) {
    CommandResult r = testing::run_command(o, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::regex token_line("TOKEN=([0-9a-f]*)");
    std::set<std::string> tokens;
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), token_line);
         it != std::sregex_iterator(); ++it) {
      tokens.insert((*it)[1]);
    }
    ASSERT_EQ(tokens.size(), 1u) << r.out;  // both workers, one token
    EXPECT_EQ(tokens.begin()->size(), 64u);
    seen.insert(*tokens.begin());
  }
  EXPECT_EQ(seen.size(), 2u);
}

TEST_F(StoreAuth, BadTokenSourcesAreExitTwoWithTheFix) {
  testing::write_file(dir_ / "token", kToken + "\n", 0644);
  CommandOptions o;
  o.argv = {kDlaunch, "--rdzv-conf", "token_file=" + (dir_ / "token").string(),
            "true"};
  CommandResult open = testing::run_command(o, 60s);
  EXPECT_EQ(open.exit_code, 2);
  EXPECT_THAT(open.err, HasSubstr("has mode 0644"));
  EXPECT_THAT(open.err, HasSubstr("chmod 600 " + (dir_ / "token").string()));
  EXPECT_THAT(open.err, Not(HasSubstr(kToken)));

  o.argv = {kDlaunch, "true"};
  o.env[comm::store::kTokenEnv] = "short";
  CommandResult short_token = testing::run_command(o, 60s);
  EXPECT_EQ(short_token.exit_code, 2);
  EXPECT_THAT(short_token.err,
              HasSubstr("the store token in DLAUNCH_RDZV_TOKEN has 5 "
                        "characters"));

  o.argv = {kDlaunch, "--rdzv-conf", "token_file=", "true"};
  o.env.clear();
  CommandResult empty = testing::run_command(o, 60s);
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.err, HasSubstr("token_file=PATH"));
}

TEST_F(StoreAuth, ATokenlessStoreOnTheNetworkIsAWarning) {
  // The endpoint is this machine's name, not a loopback address: the
  // store serves the network, and without a token the agent says so.
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  // A host whose own name does not resolve (a bare chroot) cannot serve it.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0) {
    GTEST_SKIP() << "this host's name '" << name
                 << "' does not resolve (add it to /etc/hosts)";
  }
  ::freeaddrinfo(found);
  CommandOptions o;
  o.argv = {kDlaunch,
            "--nnodes",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            std::string(name) + ":0",
            "--rdzv-conf",
            "is_host=true",
            "true"};
  o.unset_env = {comm::store::kTokenEnv};
  CommandResult r = testing::run_command(o, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("warning: the agents' store at " + std::string(name) +
                        ":0 serves the network and this job has no "
                        "token"));
  EXPECT_THAT(r.err, HasSubstr("openssl rand -hex 32"));
  o.env[comm::store::kTokenEnv] = kToken;
  o.unset_env.clear();
  CommandResult with = testing::run_command(o, 60s);
  EXPECT_EQ(with.exit_code, 0) << with.err;
  EXPECT_THAT(with.err, Not(HasSubstr("warning")));
}

}  // namespace
}  // namespace dlaunch
