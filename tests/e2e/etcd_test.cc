// The etcd rendezvous backend against a real etcd (Debian's etcd-server)
// that each test starts on free loopback ports with its data in a temp
// folder: every agent is its own `dlaunch --rdzv-backend etcd` advertising
// its own 127.0.0.x. Skipped when etcd is not installed. Waits are bounded
// and on observed output or state, never on sleeps.
#include <elf.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
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
using Clock = std::chrono::steady_clock;

const std::string kDlaunch = DLAUNCH_BIN_DIR "/dlaunch";
const std::string kEtcd = "/usr/bin/etcd";
const std::string kEtcdctl = "/usr/bin/etcdctl";

const std::string kShowEnv =
    "echo \"ENV node=$NODE rank=$RANK ws=$WORLD_SIZE gr=$GROUP_RANK "
    "gws=$GROUP_WORLD_SIZE master=$MASTER_ADDR "
    "rc=$TORCHELASTIC_RESTART_COUNT\"";
// Round 0 (three nodes) blocks until stopped; a round of two finishes.
const std::string kBlockWhileThree =
    kShowEnv +
    "; if [ $GROUP_WORLD_SIZE = 3 ]; then echo RUNNING; exec sleep 300; fi";

using testing::free_port;

struct EnvLine {
  int node, rank, ws, gr, gws, rc;
  std::string master;
};

std::vector<EnvLine> env_lines(const std::string& out) {
  std::vector<EnvLine> v;
  std::regex re(
      "ENV node=(\\d+) rank=(\\d+) ws=(\\d+) gr=(\\d+) gws=(\\d+) "
      "master=(\\S+) rc=(\\d+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re);
       it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    v.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]),
                 std::stoi(m[4]), std::stoi(m[5]), std::stoi(m[7]), m[6]});
  }
  return v;
}

// testing::eventually, checking every 20 ms: for state that has no event
// to wait on (etcd's health, its keys).
bool eventually(const std::function<bool()>& done,
                std::chrono::milliseconds timeout) {
  return testing::eventually(done, timeout, 20ms);
}

// The number of watch streams etcd at 127.0.0.1:`port` has served so far,
// from its /metrics (-1 when it did not answer within 10 s).
double watch_streams(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string resp;
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) resp.append(buf, n);
  }
  ::close(fd);
  const std::string key = "\ngrpc_server_started_total{grpc_method=\"Watch\"";
  const size_t at = resp.find(key);
  if (at == std::string::npos) return -1;
  const size_t value = resp.find("} ", at);
  if (value == std::string::npos) return -1;
  return std::strtod(resp.c_str() + value + 2, nullptr);
}

// An etcd cluster of `n` members on 127.0.0.1, data in a temp folder.
// Members are killed with the
// object.
class EtcdCluster {
 public:
  // With `tls`, members serve HTTPS with a certificate of a test CA
  // (tls_dir(): ca.pem, client.pem, client.key) and require client
  // certificates. `client_port0`, if not 0, is the first member's client
  // port (one the test picked before, for agents that came first).
  explicit EtcdCluster(int n, bool tls = false, int client_port0 = 0)
      : tls_(tls) {
    if (tls) make_certificates();
    std::string initial;
    // Unbound until etcd starts, so a free port may come back: each port
    // is one no member of this cluster has yet.
    std::set<int> taken = {client_port0};
    auto fresh_port = [&] {
      int port = free_port();
      while (taken.contains(port)) port = free_port();
      taken.insert(port);
      return port;
    };
    for (int i = 0; i < n; ++i) {
      client_.push_back(i == 0 && client_port0 ? client_port0 : fresh_port());
      peer_.push_back(fresh_port());
      initial += (i ? "," : "") + name(i) + "=" + peer_url(i);
    }
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> tls_flags;
      if (tls) {
        tls_flags = {"--cert-file",       (dir_ / "server.pem").string(),
                     "--key-file",        (dir_ / "server.key").string(),
                     "--trusted-ca-file", (dir_ / "ca.pem").string(),
                     "--client-cert-auth"};
      }
      const std::string log = (dir_ / (name(i) + ".log")).string();
      int fd =
          ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      std::vector<std::string> argv = {
          kEtcd,
          "--name",
          name(i),
          "--data-dir",
          (dir_ / name(i)).string(),
          "--listen-client-urls",
          scheme() + endpoint(i),
          "--advertise-client-urls",
          scheme() + endpoint(i),
          "--listen-peer-urls",
          peer_url(i),
          "--initial-advertise-peer-urls",
          peer_url(i),
          "--initial-cluster",
          initial,
          "--initial-cluster-token",
          "t" + std::to_string(::getpid()) + "-" + std::to_string(client_[0]),
          "--initial-cluster-state",
          "new"};
      argv.insert(argv.end(), tls_flags.begin(), tls_flags.end());
      members_.push_back(std::make_unique<Subprocess>(
          testing::CommandOptions{argv, {}, {}, "", fd, fd}));
      ::close(fd);
    }
  }

  // Every member answers (bounded).
  bool healthy(std::chrono::milliseconds timeout = 60s) {
    return eventually(
        [&] {
          return ctl({"--command-timeout=2s", "endpoint", "health"}, 10s)
                     .exit_code == 0;
        },
        timeout);
  }
  // etcdctl `args` against every member (with the test CA's client
  // certificate when TLS), bounded by `timeout`.
  CommandResult ctl(const std::vector<std::string>& args,
                    std::chrono::milliseconds timeout = 30s) const {
    std::vector<std::string> argv = {kEtcdctl, "--endpoints", endpoints()};
    if (tls_) {
      argv.insert(argv.end(), {"--cacert", (dir_ / "ca.pem").string(), "--cert",
                               (dir_ / "client.pem").string(), "--key",
                               (dir_ / "client.key").string()});
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::run_command({argv, {}, {}, ""}, timeout);
  }
  const std::filesystem::path& tls_dir() const { return dir_.path(); }
  std::string endpoint(int i) const {
    return "127.0.0.1:" + std::to_string(client_[i]);
  }
  int client_port(int i) const { return client_[i]; }
  // "127.0.0.1:P0,127.0.0.1:P1,..."
  std::string endpoints() const {
    std::string s;
    for (size_t i = 0; i < client_.size(); ++i) {
      s += (i ? "," : "") + endpoint(static_cast<int>(i));
    }
    return s;
  }
  void kill(int i) {
    members_[i]->signal(SIGKILL);
    members_[i]->wait(10s);
  }
  // Keys under `prefix`, one per line ("" when none or on error).
  std::string keys(const std::string& prefix) const {
    return ctl({"get", "--prefix", prefix, "--keys-only"}, 10s).out;
  }

 private:
  static std::string name(int i) { return "m" + std::to_string(i); }
  std::string scheme() const { return tls_ ? "https://" : "http://"; }
  // A CA, a server certificate for 127.0.0.1 and a client certificate,
  // all signed by the CA (openssl).
  void make_certificates() {
    const std::string script =
        "set -e; cd '" + dir_.path().string() +
        "'; k='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'\n"
        "openssl req -x509 $k -keyout ca.key -out ca.pem -days 1 "
        "-subj /CN=dlaunch-test-ca 2>/dev/null\n"
        "echo 'subjectAltName=IP:127.0.0.1' > san\n"
        "for c in server client; do\n"
        "  openssl req $k -keyout $c.key -out $c.csr -subj /CN=$c "
        "2>/dev/null\n"
        "  openssl x509 -req -in $c.csr -CA ca.pem -CAkey ca.key "
        "-CAcreateserial -out $c.pem -days 1 -extfile san 2>/dev/null\n"
        "done\n";
    CommandResult r =
        testing::run_command({{"sh", "-c", script}, {}, {}, ""}, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  bool tls_ = false;
  std::string peer_url(int i) const {
    return "http://127.0.0.1:" + std::to_string(peer_[i]);
  }
  testing::TempDir dir_{"dlaunch-etcd"};
  std::vector<int> client_, peer_;
  std::vector<std::unique_ptr<Subprocess>> members_;
};

// A TCP proxy the test controls: forwards 127.0.0.1:port() to `target`
// until cut(), after which it passes nothing either way and accepts
// connections that go nowhere (a silent partition, not a refusal).
class Proxy {
 public:
  explicit Proxy(int target_port) : target_(target_port) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(listen_, 64);
    ::pipe2(wake_, O_CLOEXEC);
    thread_ = std::thread([this] { run(); });
  }
  ~Proxy() {
    stop_ = true;
    ::write(wake_[1], "x", 1);
    thread_.join();
    for (int fd : fds_) ::close(fd);
    ::close(listen_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  int port() const { return port_; }
  void cut() {
    cut_ = true;
    ::write(wake_[1], "x", 1);
  }

 private:
  void run() {
    std::map<int, int> peer;  // fd -> the other side
    while (!stop_) {
      std::vector<pollfd> p = {{listen_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (!cut_) {
        for (auto [fd, other] : peer) p.push_back({fd, POLLIN, 0});
      }
      if (::poll(p.data(), p.size(), -1) < 0) continue;
      if (p[1].revents) {
        char c;
        ::read(wake_[0], &c, 1);
      }
      if (p[0].revents & POLLIN) {
        int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          fds_.push_back(c);
          if (!cut_) {
            int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            a.sin_port = htons(static_cast<uint16_t>(target_));
            if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
              peer[c] = s;
              peer[s] = c;
            }
            fds_.push_back(s);
          }
        }
      }
      for (size_t i = 2; i < p.size(); ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[65536];
        ssize_t n = ::read(p[i].fd, buf, sizeof buf);
        auto it = peer.find(p[i].fd);
        if (it == peer.end()) continue;
        if (n <= 0) {
          int other = it->second;
          ::shutdown(other, SHUT_WR);
          peer.erase(other);
          peer.erase(it);
          continue;
        }
        for (ssize_t off = 0; off < n;) {
          ssize_t w = ::write(it->second, buf + off, n - off);
          if (w <= 0) break;
          off += w;
        }
      }
    }
  }

  int target_;
  int listen_ = -1;
  int port_ = 0;
  int wake_[2];
  std::atomic<bool> stop_{false};
  std::atomic<bool> cut_{false};
  std::vector<int> fds_;
  std::thread thread_;
};

class EtcdRendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kEtcd.c_str(), X_OK) != 0 ||
        ::access(kEtcdctl.c_str(), X_OK) != 0) {
      GTEST_SKIP() << "etcd is not installed (scripts/setup installs "
                      "etcd-server and etcd-client)";
    }
  }

  // Starts agent `i` advertising 127.0.0.(i+1), meeting in etcd at
  // `endpoints` under job `id`, with `env` on top of NODE=i. What a loaded
  // machine may delay by seconds has room: a round of --nnodes 2:3 waits
  // 5 s for the third node (last call), and a lease lives 10 s without
  // keep-alives (a killed or cut node is dropped after those 10 s).
  Subprocess& start(int i, const std::string& endpoints,
                    const std::vector<std::string>& flags,
                    const std::string& script, const std::string& id = "",
                    const std::string& conf = "",
                    std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {
        kDlaunch,
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        endpoints,
        "--rdzv-id",
        id.empty() ? id_ : id,
        "--local-addr",
        "127.0.0." + std::to_string(i + 1),
        "--rdzv-conf",
        "join_timeout=60,last_call_timeout=5,close_timeout=2" +
            (conf.empty() ? ",keep_alive_interval=1,keep_alive_max_attempt=10"
                          : "," + conf)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"sh", "-c", script});
    env["NODE"] = std::to_string(i);
    agents_[i] = std::make_unique<Subprocess>(
        testing::CommandOptions{argv, env, {}, ""});
    return *agents_[i];
  }

  // Agents `survivors` finish with a round of two after the round of
  // three lost a node, spending no restart. (On a loaded machine a round
  // of two may form first, before the third node joins.)
  void expect_two_finish(const std::vector<int>& survivors) {
    for (int i : survivors) {
      CommandResult r = agents_[i]->wait(120s);
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
      EXPECT_THAT(r.err, HasSubstr("re-forming the worker group"));
      auto lines = env_lines(r.out);
      ASSERT_GE(lines.size(), 2u) << r.out << r.err;
      EXPECT_EQ(lines[lines.size() - 2].gws, 3) << r.out;
      EXPECT_EQ(lines.back().gws, 2) << r.out;
      EXPECT_EQ(lines.back().ws, 2);
      EXPECT_EQ(lines.back().rc, 0);
    }
  }

  // Starts agents 0-2 (--nnodes 2:3) at `endpoint` with workers that
  // block while the group has three nodes, and waits until all run.
  void start_three_running(const std::string& endpoint) {
    for (int i = 0; i < 3; ++i) {
      start(i, endpoint, {"--nnodes", "2:3"}, kBlockWhileThree);
    }
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(agents_[i]->wait_for_output("RUNNING", 60s))
          << agents_[i]->out() << agents_[i]->err();
    }
  }

  // The agent whose last round gave it group rank `gr` (-1: none).
  int with_group_rank(int gr) {
    for (const auto& [i, a] : agents_) {
      auto lines = env_lines(a->out());
      if (!lines.empty() && lines.back().gr == gr) return i;
    }
    return -1;
  }
  // The started agents other than `i`.
  std::vector<int> all_but(int i) const {
    std::vector<int> out;
    for (const auto& [k, a] : agents_) {
      if (k != i) out.push_back(k);
    }
    return out;
  }

  // The exit barrier's settings: the job's finished mark lives 120 s,
  // long past the members' leases (TTL 10 s).
  static constexpr const char* kBarrierConf =
      "close_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=10";

  // Starts nodes 0..2 (--nnodes 3 plus `flags`; node 2 with `env2`), whose
  // workers end at once but node 2's, which waits for `gate`; returns once
  // node 2's worker runs and nodes 0 and 1 wait in the exit barrier, their
  // "done" in etcd.
  void hold_in_barrier(EtcdCluster& etcd, const testing::Gate& gate,
                       std::vector<std::string> flags,
                       const std::map<std::string, std::string>& env2 = {}) {
    flags.insert(flags.begin(), {"--nnodes", "3"});
    const std::string script = "if [ $NODE = 2 ]; then echo HELD; read x < " +
                               gate.path() + "; fi; echo DONE";
    for (int i = 0; i < 3; ++i) {
      start(i, etcd.endpoint(0), flags, script, "", kBarrierConf,
            i == 2 ? env2 : std::map<std::string, std::string>{});
    }
    ASSERT_TRUE(agents_[2]->wait_for_output("HELD", 60s)) << agents_[2]->err();
    for (int i : {0, 1}) {
      ASSERT_TRUE(
          agents_[i]->wait_for_output("for the other nodes to finish", 60s))
          << agents_[i]->err();
    }
    // Each agent says it waits before its helper puts its "done".
    const std::string done = "/dlaunch/" + id_ + "/r/00000000/done/";
    std::string keys;
    ASSERT_TRUE(eventually(
        [&] {
          keys = etcd.keys(done);
          return keys.find(done + "127.0.0.1/") != std::string::npos &&
                 keys.find(done + "127.0.0.2/") != std::string::npos;
        },
        60s))
        << keys;
  }

  // A node that comes once the job finished exits 0 at once, saying so;
  // without the finished mark it would wait for a place until its join
  // timeout (300 s; the wait below ends first).
  void expect_told_finished(EtcdCluster& etcd) {
    start(3, etcd.endpoint(0), {"--nnodes", "3"}, kShowEnv, "",
          std::string(kBarrierConf) + ",join_timeout=300");
    CommandResult late = agents_[3]->wait(120s);
    ASSERT_FALSE(late.timed_out) << "the late node waited for a place";
    EXPECT_THAT(late.err, HasSubstr("already finished"));
    EXPECT_EQ(late.out.find("ENV"), std::string::npos) << late.out;
    EXPECT_EQ(late.exit_code, 0) << late.err;
  }

  // Round 0 of this job is closed with the value `closed`, of no format
  // this dlaunch knows: a node of one joins and fails, saying so, rather
  // than start workers or wait.
  void expect_round_named(const std::string& closed) {
    EtcdCluster etcd(1);
    ASSERT_TRUE(etcd.healthy());
    CommandResult put =
        etcd.ctl({"put", "/dlaunch/" + id_ + "/r/00000000/closed", closed});
    ASSERT_EQ(put.exit_code, 0) << put.err;
    start(0, etcd.endpoint(0), {"--nnodes", "1"}, kShowEnv);
    CommandResult r = agents_[0]->wait(120s);
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_NE(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("(another dlaunch version?)"));
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("ENV ")));
  }

  std::string id_ = "etcd" + std::to_string(::getpid());
  std::map<int, std::unique_ptr<Subprocess>> agents_;
};

TEST_F(EtcdRendezvous, TheFirstAgentIsKilledAndTheOthersFinish) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  ASSERT_NO_FATAL_FAILURE(start_three_running(etcd.endpoint(0)));
  // The first node, group rank 0, holds MASTER_ADDR; with c10d it would
  // host the store and its loss would end the job.
  const int first = with_group_rank(0);
  ASSERT_GE(first, 0);
  const std::vector<int> survivors = all_but(first);
  std::vector<pid_t> left = testing::descendants(agents_[first]->pid());
  ASSERT_FALSE(left.empty());
  agents_[first]->signal(SIGKILL);
  agents_[first]->wait(30s);
  expect_two_finish(survivors);
  const std::string addr = "127.0.0." + std::to_string(first + 1);
  for (int i : survivors) {
    EXPECT_THAT(agents_[i]->err(), HasSubstr("node " + addr + "/"));
    // The new group rank 0 is one of the survivors.
    auto lines = env_lines(agents_[i]->out());
    EXPECT_NE(lines.back().master, addr);
  }
  // Nothing of the killed node is left: workers and its etcd helper.
  for (pid_t p : left) {
    EXPECT_TRUE(eventually([p] { return !testing::process_alive(p); }, 30s))
        << "process " << p << " of the killed agent survived";
  }
}

TEST_F(EtcdRendezvous, AMemberOfAThreeMemberClusterDiesMidRendezvous) {
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.healthy());
  // Two of three nodes join and wait; the member they talk to (the first
  // listed) dies; the third node comes and the round completes. The dead
  // member may have led: until the other two elect a leader (seconds on a
  // loaded machine) no keep-alive is answered, so the TTL is 16 s.
  const std::string conf = "keep_alive_interval=2,keep_alive_max_attempt=8";
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoints(), {"--nnodes", "3"}, kShowEnv, "", conf);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(agents_[i]->wait_for_output("waiting for nodes: 2/3", 60s))
        << agents_[i]->err();
  }
  etcd.kill(0);
  start(2, etcd.endpoints(), {"--nnodes", "3"}, kShowEnv, "", conf);
  std::vector<CommandResult> results;
  std::string all;  // what each agent said, for any failure below
  for (int i = 0; i < 3; ++i) {
    results.push_back(agents_[i]->wait(120s));
    all += "agent " + std::to_string(i) + ":\n" + results.back().out +
           results.back().err;
  }
  std::set<int> ranks;
  for (const CommandResult& r : results) {
    ASSERT_EQ(r.exit_code, 0) << all;
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    EXPECT_EQ(lines[0].gws, 3);
    ranks.insert(lines[0].gr);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

TEST_F(EtcdRendezvous, AnAgentCutOffFromEtcdStopsItsWorkers) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  Proxy proxy(std::stoi(etcd.endpoint(0).substr(10)));
  const std::string script = kBlockWhileThree;
  start(0, etcd.endpoint(0), {"--nnodes", "2:3"}, script);
  start(1, etcd.endpoint(0), {"--nnodes", "2:3"}, script);
  start(2, "127.0.0.1:" + std::to_string(proxy.port()), {"--nnodes", "2:3"},
        script);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(agents_[i]->wait_for_output("RUNNING", 60s))
        << agents_[i]->out() << agents_[i]->err();
  }
  std::vector<pid_t> workers = testing::descendants(agents_[2]->pid());
  ASSERT_FALSE(workers.empty());
  proxy.cut();
  // Its lease expires (TTL 10 s): the others go on without it...
  expect_two_finish({0, 1});
  // ...and it stops its workers instead of running on as a split brain.
  CommandResult cut = agents_[2]->wait(60s);
  EXPECT_NE(cut.exit_code, 0) << cut.err;
  EXPECT_FALSE(cut.timed_out);
  EXPECT_THAT(cut.err, HasSubstr("lease"));
  // No round of two started on it after the cut.
  ASSERT_FALSE(env_lines(cut.out).empty()) << cut.out;
  EXPECT_EQ(env_lines(cut.out).back().gws, 3) << cut.out;
  for (pid_t p : workers) {
    EXPECT_TRUE(eventually([p] { return !testing::process_alive(p); }, 30s))
        << "worker " << p << " of the cut-off agent survived";
  }
}

// A frozen agent (SIGSTOP) loses its lease at its TTL, as a dead one does,
// though its helper (a process of its own) runs on: the helper renews the
// lease only while the agent's pings come. It once renewed it for good,
// and the others waited on the frozen node.
TEST_F(EtcdRendezvous, AFrozenAgentIsDroppedAndStopsItsWorkersWhenItWakes) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  ASSERT_NO_FATAL_FAILURE(start_three_running(etcd.endpoint(0)));
  std::vector<pid_t> workers = testing::descendants(agents_[2]->pid());
  ASSERT_FALSE(workers.empty());
  agents_[2]->signal(SIGSTOP);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(agents_[i]->wait_for_output("re-forming the worker group", 60s))
        << agents_[i]->err();
  }
  agents_[2]->signal(SIGCONT);
  expect_two_finish({0, 1});
  CommandResult frozen = agents_[2]->wait(60s);
  EXPECT_EQ(frozen.exit_code, 1) << frozen.err;
  EXPECT_FALSE(frozen.timed_out);
  EXPECT_THAT(frozen.err, HasSubstr("the agent gave no sign of life for"));
  EXPECT_THAT(frozen.err, HasSubstr("stopping 1 worker(s)"));
  for (pid_t p : workers) {
    EXPECT_TRUE(eventually([p] { return !testing::process_alive(p); }, 30s))
        << "worker " << p << " of the frozen agent survived";
  }
}

// A re-formed round waits past its last call (5 s) for a member that takes
// its --term-timeout (8 s: its workers ignore SIGTERM) to stop: it was
// left out, and the group re-formed once more to take it back in.
TEST_F(EtcdRendezvous, AMemberSlowToStopItsWorkersIsWaitedForAfterAFailure) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  const std::string script =
      kShowEnv +
      "; if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then if [ $NODE = 1 ]; then "
      "sleep 1; exit 3; fi; trap '' TERM; sleep 30; fi";
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0),
          {"--nnodes", "1:2", "--max-restarts", "3", "--term-timeout", "8"},
          script);
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = agents_[i]->wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("round 1 (failure): 2 nodes"));
    auto lines = env_lines(r.out);
    ASSERT_FALSE(lines.empty()) << r.out;
    EXPECT_EQ(lines.back().gws, 2);
    EXPECT_EQ(lines.back().rc, 1);
  }
}

// Scale up: a node that comes while a round of two runs asks to join; the
// round re-forms with three, spending no restart, and the first two keep
// their group ranks.
TEST_F(EtcdRendezvous, ALateNodeJoinsARunningJobAndRanksStayStable) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  const std::string script =
      kShowEnv +
      "; if [ $GROUP_WORLD_SIZE = 2 ]; then echo RUNNING; exec sleep 300; fi";
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0), {"--nnodes", "2:3"}, script);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(agents_[i]->wait_for_output("RUNNING", 60s))
        << agents_[i]->out() << agents_[i]->err();
  }
  start(2, etcd.endpoint(0), {"--nnodes", "2:3"}, script);
  std::set<int> ranks;
  for (int i = 0; i < 3; ++i) {
    CommandResult r = agents_[i]->wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = env_lines(r.out);
    ASSERT_FALSE(lines.empty()) << r.out << r.err;
    EXPECT_EQ(lines.back().gws, 3) << r.out;
    EXPECT_EQ(lines.back().ws, 3);
    EXPECT_EQ(lines.back().rc, 0);
    ranks.insert(lines.back().gr);
    if (i < 2) {
      ASSERT_EQ(lines.size(), 2u) << r.out;
      EXPECT_EQ(lines[0].gr, lines[1].gr) << r.out;
    } else {
      EXPECT_EQ(lines.back().gr, 2) << r.out;
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

// The restart budget is the job's: a worker failing on one node restarts
// the group on every node, one restart each time, and past --max-restarts
// every node gives up.
TEST_F(EtcdRendezvous, AFailureRestartsEveryNodeUntilTheBudgetIsSpent) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  // Node 1's worker fails only once node 0's worker of the same round has
  // shown its environment (a marker file, waited for up to 60 s): else the
  // stop can take node 0's worker before its line, on a loaded machine.
  testing::TempDir dir;
  const std::string shown =
      (dir / "shown.").string() + "$TORCHELASTIC_RESTART_COUNT";
  const std::string script =
      kShowEnv + "; if [ $NODE = 1 ]; then i=0; while [ ! -e " + shown +
      " ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; [ -e " + shown +
      " ] || echo node 1: no " + shown +
      " after 60 s >&2; exit 3; fi; "
      "touch " +
      shown + "; exec sleep 300";
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0), {"--nnodes", "2", "--max-restarts", "1"},
          script);
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = agents_[i]->wait(120s);
    EXPECT_FALSE(r.timed_out);
    EXPECT_NE(r.exit_code, 0) << r.err;
    auto lines = env_lines(r.out);
    ASSERT_EQ(lines.size(), 2u) << r.out << r.err;
    EXPECT_EQ(lines[0].rc, 0);
    EXPECT_EQ(lines[1].rc, 1);
    EXPECT_EQ(lines[0].gr, lines[1].gr) << r.out;
  }
  EXPECT_THAT(agents_[0]->err(), HasSubstr("a worker on node 127.0.0.2/"));
  EXPECT_THAT(agents_[0]->err(), HasSubstr("no restarts left"));
  EXPECT_THAT(agents_[1]->err(), HasSubstr("worker group failed"));
}

// The exit barrier on etcd: nodes whose workers finished first wait
// (their "done" keys) until the last node's workers are done too; the job
// is then marked finished, and a node that comes later exits 0 saying so.
TEST_F(EtcdRendezvous, TheExitBarrierHoldsUntilEveryNodeIsDone) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  testing::TempDir dir;
  testing::Gate gate((dir / "go").string());
  ASSERT_NO_FATAL_FAILURE(hold_in_barrier(etcd, gate, {}));
  for (int i : {0, 1}) EXPECT_TRUE(testing::process_alive(agents_[i]->pid()));
  gate.open_once();
  for (int i = 0; i < 3; ++i) {
    CommandResult r = agents_[i]->wait(60s);
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("DONE"));
  }
  expect_told_finished(etcd);
}

// A node whose workers finished leaves after its exit barrier's timeout
// (its keys vanish with its lease): the other node's workers go on, and
// its barrier completes at once when they finish, counting the node gone
// after its "done" (it re-formed the round and failed the job).
TEST_F(EtcdRendezvous, ANodeLeavingAfterItsExitBarrierLeavesTheOthersRunning) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  testing::TempDir dir;
  testing::Gate gate((dir / "go").string());
  const std::string script = testing::restart_count_then_node0_waits(gate);
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0),
          {"--nnodes", "2", "--exit-barrier-timeout", i == 0 ? "3600" : "1"},
          script);
  }
  CommandResult r1 = agents_[1]->wait(60s);
  EXPECT_EQ(r1.exit_code, 0) << r1.err;
  // Named (the helper's barrier named nobody: "the other nodes").
  EXPECT_THAT(r1.err, ::testing::ContainsRegex(
                          "exit barrier: [^ ]+ \\(group rank [01]\\) did not "
                          "finish within 1 s"));
  std::this_thread::sleep_for(500ms);  // the watch has seen it go
  gate.open_once();
  CommandResult r0 = agents_[0]->wait(60s);
  ASSERT_FALSE(r0.timed_out) << r0.err;
  EXPECT_EQ(r0.exit_code, 0) << r0.err;
  EXPECT_THAT(r0.err, ::testing::Not(HasSubstr("left")));
  EXPECT_THAT(r0.err, ::testing::Not(HasSubstr("did not finish within")));
  EXPECT_EQ(r0.out, "[default0]:RC=0\n") << r0.err;
}

// The node whose "done" completes the exit barrier's set dies (SIGKILL,
// agent and helper, through the helper's test hook) before it puts the
// round's "end": the others end the barrier once its lease expires (TTL
// 10 s), not at --exit-barrier-timeout (an hour here), say why, and mark
// the job finished for a node that comes later.
TEST_F(EtcdRendezvous, TheNodeCompletingTheExitBarrierDiesBeforeEndingIt) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  testing::TempDir dir;
  testing::Gate gate((dir / "go").string());
  ASSERT_NO_FATAL_FAILURE(
      hold_in_barrier(etcd, gate, {"--exit-barrier-timeout", "3600"},
                      {{"DLAUNCH_RDZV_ETCD_TEST_DIE_BEFORE_END", "1"}}));
  // Its helper, among them: nothing of the node may outlive it.
  const std::vector<pid_t> node2 = testing::descendants(agents_[2]->pid());
  ASSERT_FALSE(node2.empty());
  gate.open_once();
  CommandResult dead = agents_[2]->wait(60s);
  ASSERT_FALSE(dead.timed_out) << dead.err;
  EXPECT_EQ(dead.signal, SIGKILL) << dead.err;
  for (pid_t p : node2) {
    EXPECT_TRUE(eventually([p] { return !testing::process_alive(p); }, 30s))
        << "process " << p << " of the killed node survived";
  }
  for (int i : {0, 1}) {
    CommandResult r = agents_[i]->wait(120s);
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("node 127.0.0.3/"));
    EXPECT_THAT(r.err, HasSubstr("is gone after every node was done; the "
                                 "exit barrier is complete"));
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("did not finish within")));
  }
  expect_told_finished(etcd);
}

// An agent stopped (SIGTERM) in the exit barrier while etcd is cut off
// from it: its helper gives the "done" it could not deliver a bounded
// wait (10 s here), says it left without it, and exits; the agent exits
// well before the client's two read_timeouts (60 s each) that the report
// could take. The lease's TTL (200 s) is long, so that its expiry (which
// cancels every request) does not end the wait first.
TEST_F(EtcdRendezvous, AnAgentStoppedWhileCutOffFromEtcdNamesWhatItLeft) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  Proxy proxy(etcd.client_port(0));
  testing::TempDir dir;
  testing::Gate gate((dir / "go").string());
  const std::string script = "if [ $NODE = 1 ]; then echo HELD; read x < " +
                             gate.path() + "; fi; echo DONE";
  const std::string conf =
      "close_timeout=120,keep_alive_interval=5,keep_alive_max_attempt=40";
  start(0, etcd.endpoint(0), {"--nnodes", "2"}, script, "", conf);
  start(1, "127.0.0.1:" + std::to_string(proxy.port()), {"--nnodes", "2"},
        script, "", conf);
  ASSERT_TRUE(agents_[1]->wait_for_output("HELD", 60s)) << agents_[1]->err();
  ASSERT_TRUE(agents_[0]->wait_for_output("for the other nodes to finish", 60s))
      << agents_[0]->err();
  proxy.cut();
  gate.open_once();
  ASSERT_TRUE(agents_[1]->wait_for_output("for the other nodes to finish", 60s))
      << agents_[1]->err();
  agents_[1]->signal(SIGTERM);
  CommandResult r = agents_[1]->wait(90s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("etcd (127.0.0.1:" + std::to_string(proxy.port()) +
                        ") did not complete this node's report of its "
                        "workers' outcome (exit barrier) within 10 s"));
  EXPECT_THAT(r.err, HasSubstr("leaving without it"));
  EXPECT_THAT(r.err, HasSubstr("check that etcd is reachable from this host"));
  agents_[0]->signal(SIGTERM);
  EXPECT_FALSE(agents_[0]->wait(60s).timed_out);
}

// As with c10d: a node that arrives after every node gave up past
// --max-restarts is told so at once (the gave_up mark, which outlives the
// members' leases for close_timeout, 30 s here) and fails, instead of
// waiting for a place until its join timeout (60 s; the wait below ends
// first).
TEST_F(EtcdRendezvous, ANodeArrivingAfterTheJobGaveUpFailsSayingSo) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  const std::string conf =
      "close_timeout=30,keep_alive_interval=1,keep_alive_max_attempt=10";
  const std::vector<std::string> flags = {"--nnodes", "2", "--max-restarts",
                                          "0"};
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0), flags, "exit 3", "", conf);
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = agents_[i]->wait(120s);
    ASSERT_FALSE(r.timed_out);
    ASSERT_NE(r.exit_code, 0) << r.out << r.err;
  }
  start(2, etcd.endpoint(0), flags, kShowEnv, "", conf);
  CommandResult late = agents_[2]->wait(45s);
  ASSERT_FALSE(late.timed_out) << "the late node waited for a place";
  // Told what happened and what to do, and no worker started.
  EXPECT_THAT(late.err, HasSubstr("gave up, so this node has no group"));
  EXPECT_THAT(late.err, HasSubstr("start the job again with a new --rdzv-id"));
  EXPECT_EQ(late.out.find("ENV"), std::string::npos) << late.out;
  EXPECT_EQ(late.exit_code, 1) << late.err;
}

// The cut fault (--fault cut:node=N:for=S), as the c10d backend has it:
// the node's helper stops renewing its lease; past the TTL (10 s) etcd
// drops its keys, the others re-form without it, and it stops its workers
// and exits 1 instead of running on.
TEST_F(EtcdRendezvous, TheCutFaultDropsTheNodeAndTheOthersGoOn) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  const std::string fault = "cut:node=2:for=30:after=0.3";
  for (int i = 0; i < 3; ++i) {
    start(i, etcd.endpoint(0), {"--nnodes", "2:3", "--fault", fault},
          kBlockWhileThree);
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(agents_[i]->wait_for_output("RUNNING", 60s))
        << agents_[i]->out() << agents_[i]->err();
  }
  // Group rank 2 follows the join order.
  const int cut = with_group_rank(2);
  ASSERT_GE(cut, 0);
  std::vector<pid_t> workers = testing::descendants(agents_[cut]->pid());
  expect_two_finish(all_but(cut));
  CommandResult r = agents_[cut]->wait(60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("fault injected: " + fault));
  EXPECT_THAT(r.err, HasSubstr("lease"));
  EXPECT_EQ(env_lines(r.out).back().gws, 3) << r.out;
  for (pid_t p : workers) {
    EXPECT_TRUE(eventually([p] { return !testing::process_alive(p); }, 30s))
        << "process " << p << " of the cut-off agent survived";
  }
}

TEST_F(EtcdRendezvous, TwoJobsStayApartAndLeaveNoKeys) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  // Jobs a (2 nodes, 1 worker each) and b (2 nodes, 2 workers each).
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0), {"--nnodes", "2"}, kShowEnv, id_ + "a");
    start(i + 2, etcd.endpoint(0), {"--nnodes", "2", "--nproc-per-node", "2"},
          kShowEnv, id_ + "b");
  }
  for (int i = 0; i < 4; ++i) {
    CommandResult r = agents_[i]->wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    for (const EnvLine& l : env_lines(r.out)) {
      EXPECT_EQ(l.gws, 2);
      EXPECT_EQ(l.ws, i < 2 ? 2 : 4);
    }
  }
  // Every key of both jobs is gone once the "finished" marker expires
  // (close_timeout, 2 s).
  std::string keys;
  EXPECT_TRUE(eventually(
      [&] {
        keys = etcd.keys("/dlaunch/");
        return keys.empty();
      },
      30s))
      << keys;
}

// Each node's helper keeps one watch stream to etcd for all its rounds:
// the forming round's watch moves to the round's end and on to the next
// round on it (Watch::rewatch) rather than a stream, and a thread, per
// watch (docs/performance.md). Counted by etcd itself: 2 nodes through
// 2 rounds, 2 streams.
TEST_F(EtcdRendezvous, EachNodeWatchesOnOneStreamThroughItsRounds) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  const double before = watch_streams(etcd.client_port(0));
  ASSERT_GE(before, 0) << "etcd's /metrics has no watch stream count";
  // Round 0's workers fail, round 1's succeed.
  const std::string script =
      kShowEnv + "; [ $TORCHELASTIC_RESTART_COUNT = 1 ] || exit 3";
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0), {"--nnodes", "2", "--max-restarts", "1"},
          script);
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = agents_[i]->wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = env_lines(r.out);
    ASSERT_FALSE(lines.empty()) << r.out << r.err;
    EXPECT_EQ(lines.back().rc, 1) << r.out;
  }
  EXPECT_EQ(watch_streams(etcd.client_port(0)) - before, 2);
}

TEST_F(EtcdRendezvous, ARoundOfAnotherFormatIsNamed) {
  // Round 0 closed as dlaunch before the "f2:" round format wrote it (its
  // "closed" headed by the revision alone, no "end" key to come): its
  // members would wait for an "end" that never comes.
  expect_round_named("12");
}

// An empty "closed" value holds no member, and once made this node wait
// for a later round as a node that came too late.
TEST_F(EtcdRendezvous, AnEmptyRoundRecordIsNamed) { expect_round_named(""); }

TEST_F(EtcdRendezvous, LogsInWithAUserWhosePasswordIsInAFile) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  ASSERT_EQ(
      etcd.ctl({"user", "add", "root:s3cret", "--interactive=false"}).exit_code,
      0);
  ASSERT_EQ(etcd.ctl({"auth", "enable"}).exit_code, 0);
  testing::TempDir dir;
  testing::write_file(dir / "pw", "s3cret\n", 0600);
  testing::write_file(dir / "bad", "wrong\n", 0600);
  const std::string ka = "keep_alive_interval=1,keep_alive_max_attempt=10,";
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0), {"--nnodes", "2"}, kShowEnv, "",
          ka + "user=root,password_file=" + (dir / "pw").string());
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = agents_[i]->wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    ASSERT_EQ(env_lines(r.out).size(), 1u) << r.out;
    EXPECT_EQ(env_lines(r.out)[0].gws, 2);
  }
  // A wrong password: a clear error, and the password in no message.
  start(
      2, etcd.endpoint(0), {"--nnodes", "1"}, kShowEnv, id_ + "x",
      ka + "join_timeout=20,user=root,password_file=" + (dir / "bad").string());
  CommandResult bad = agents_[2]->wait(120s);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, HasSubstr("refused user 'root'"));
  EXPECT_THAT(bad.err, ::testing::Not(HasSubstr("wrong")));
}

TEST_F(EtcdRendezvous, TalksTlsWithAClientCertificate) {
  EtcdCluster etcd(1, true);
  ASSERT_TRUE(etcd.healthy());
  const auto& d = etcd.tls_dir();
  const std::string tls =
      "keep_alive_interval=1,keep_alive_max_attempt=10,"
      "cacert=" +
      (d / "ca.pem").string() + ",cert=" + (d / "client.pem").string() +
      ",key=" + (d / "client.key").string();
  for (int i = 0; i < 2; ++i) {
    start(i, etcd.endpoint(0), {"--nnodes", "2"}, kShowEnv, "", tls);
  }
  for (int i = 0; i < 2; ++i) {
    CommandResult r = agents_[i]->wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    ASSERT_EQ(env_lines(r.out).size(), 1u) << r.out;
  }
  // Plain TCP to a TLS member: no answer, and the error says where.
  start(2, etcd.endpoint(0), {"--nnodes", "1"}, kShowEnv, id_ + "plain",
        "keep_alive_interval=1,keep_alive_max_attempt=10,read_timeout=2,"
        "join_timeout=2");
  CommandResult plain = agents_[2]->wait(60s);
  EXPECT_NE(plain.exit_code, 0);
  EXPECT_THAT(plain.err, HasSubstr(etcd.endpoint(0)));
}

// etcd comes up longer than the lease's TTL (10 s) after the agent asked
// for its lease: the lease counts from the grant that etcd answered, so the
// agent keeps it and its worker finishes. Counted from the first try, it
// was lost at once and the agent stopped its worker (dc29b0f).
TEST_F(EtcdRendezvous, ALeaseGrantedLateIsKept) {
  const int port = free_port();
  start(0, "127.0.0.1:" + std::to_string(port), {"--nnodes", "1"},
        "sleep 5; echo FINISHED");
  // The agent retries its lease grant meanwhile (join_timeout 60 s).
  std::this_thread::sleep_for(15s);
  ASSERT_TRUE(testing::process_alive(agents_[0]->pid()))
      << agents_[0]->wait(1s).err;
  EtcdCluster etcd(1, false, port);
  CommandResult r = agents_[0]->wait(120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FINISHED"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("lease")));
}

TEST_F(EtcdRendezvous, NoEndpointAnswersNamesEveryOneTried) {
  const std::string a = "127.0.0.1:" + std::to_string(free_port());
  const std::string b = "127.0.0.1:" + std::to_string(free_port());
  CommandResult r = testing::run_command(
      {{kDlaunch, "--rdzv-backend", "etcd", "--rdzv-endpoint", a + "," + b,
        "--nnodes", "2", "--rdzv-conf", "join_timeout=2,read_timeout=2",
        "true"},
       {},
       {},
       ""},
      60s);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr(a));
  EXPECT_THAT(r.err, HasSubstr(b));
  EXPECT_THAT(r.err, HasSubstr("no etcd member answered"));
}

// A folder or an empty file as the password or a PEM file is named before
// any connection: it once logged in with "" (or failed the handshake).
TEST_F(EtcdRendezvous, AFolderOrAnEmptyFileAsASecretIsNamed) {
  testing::TempDir dir;
  testing::write_file(dir / "empty", "", 0600);
  const std::string a = "127.0.0.1:" + std::to_string(free_port());
  auto run = [&](const std::string& conf) {
    return testing::run_command(
        {{kDlaunch, "--rdzv-backend", "etcd", "--rdzv-endpoint", a,
          "--rdzv-conf", "join_timeout=2,read_timeout=2," + conf, "true"},
         {},
         {},
         ""},
        60s);
  };
  for (const std::string& path :
       {dir.path().string(), (dir / "empty").string()}) {
    CommandResult r = run("user=root,password_file=" + path);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.err, HasSubstr("password_file '" + path +
                                 "' (--rdzv-conf) holds no password"));
    r = run("cacert=" + path);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.err, HasSubstr("cacert '" + path +
                                 "' (--rdzv-conf) is empty or a folder"));
  }
}

#if DLAUNCH_STATIC_RUNTIME
// The ELF header of `elf` (a file's bytes), and whether it asks for a
// dynamic loader (PT_INTERP).
Elf64_Ehdr elf_header(const std::string& elf, bool& needs_loader) {
  Elf64_Ehdr eh{};
  needs_loader = false;
  if (elf.size() < sizeof eh) return eh;
  std::memcpy(&eh, elf.data(), sizeof eh);
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    const size_t off = eh.e_phoff + static_cast<size_t>(i) * eh.e_phentsize;
    if (off + sizeof ph > elf.size()) break;
    std::memcpy(&ph, elf.data() + off, sizeof ph);
    needs_loader = needs_loader || ph.p_type == PT_INTERP;
  }
  return eh;
}
#endif

// The etcd client (gRPC, protobuf, OpenSSL) lives in the helper only:
// dlaunch stays a static PIE (no dynamic loader; ET_DYN without
// PT_INTERP) that does not link gRPC, so its launch costs nothing extra
// (docs/performance.md, "Why etcd runs in a helper program"). The helper
// must hold gRPC, or the check would prove nothing; it is static too
// (a PIE by default; -DDLAUNCH_ETCD_HELPER_PIE=OFF starts faster).
TEST(EtcdHelper, DlaunchStaysAStaticPieWithoutTheEtcdClient) {
  const std::string dl = testing::read_file(kDlaunch);
  const std::string helper =
      testing::read_file(DLAUNCH_BIN_DIR "/dlaunch-rdzv-etcd");
  EXPECT_EQ(dl.find("grpc_init"), std::string::npos)
      << "dlaunch links gRPC; the etcd client belongs in dlaunch-rdzv-etcd";
  EXPECT_NE(helper.find("grpc_init"), std::string::npos);
#if DLAUNCH_STATIC_RUNTIME
  bool needs_loader = false;
  Elf64_Ehdr eh = elf_header(dl, needs_loader);
  ASSERT_EQ(std::memcmp(eh.e_ident, ELFMAG, SELFMAG), 0);
  EXPECT_EQ(eh.e_type, ET_DYN) << "dlaunch is not position-independent";
  EXPECT_FALSE(needs_loader) << "dlaunch needs a dynamic loader";
  eh = elf_header(helper, needs_loader);
  ASSERT_EQ(std::memcmp(eh.e_ident, ELFMAG, SELFMAG), 0);
  EXPECT_FALSE(needs_loader) << "dlaunch-rdzv-etcd needs a dynamic loader";
#endif
}

}  // namespace
}  // namespace dlaunch
