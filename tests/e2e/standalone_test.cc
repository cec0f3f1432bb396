// `dlaunch --standalone` hosts a real TCP store (comm/store) for the
// job's lifetime: found through /proc and used with the store client.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "comm/store/client.h"
#include "tests/testing/bin.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

// The TCP ports `pid` listens on (its socket inodes matched against
// /proc/net/tcp{,6} LISTEN entries).
std::set<int> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  for (const auto& e : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >>
          timeout >> inode;
      if (st == "0A" && inodes.contains(inode)) {
        ports.insert(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
      }
    }
  }
  return ports;
}

TEST(Standalone, HostsAWorkingStoreWhileTheJobRuns) {
  testing::TempDir dir;
  std::string go = (dir / "go").string();
  testing::Subprocess p(
      {{dlaunch::testing::bin("dlaunch"), "--standalone", "--nproc-per-node",
        "1", "sh", "-c",
        "echo ready; while [ ! -e " + go + " ]; do sleep 0.02; done"},
       {},
       {},
       ""});
  ASSERT_TRUE(p.wait_for_output("[default0]:ready", 10s)) << p.err();
  std::set<int> ports = listening_ports(p.pid());
  ASSERT_EQ(ports.size(), 1u);
  auto store = comm::store::TcpStore::connect(
      {.host = "127.0.0.1",
       .port = static_cast<uint16_t>(*ports.begin()),
       .connect_timeout = 5s,
       .timeout = 5s});
  store->set("k", "v");
  EXPECT_EQ(store->get("k"), "v");
  EXPECT_EQ(store->add("n", 2), 2);
  testing::write_file(go, "");
  EXPECT_EQ(p.wait(10s).exit_code, 0);
}

}  // namespace
}  // namespace dlaunch
