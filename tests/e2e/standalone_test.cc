// `dlaunch --standalone` hosts a real TCP store (comm/store) for the
// job's lifetime: found through /proc and used with the store client;
// without the flag one node hosts none.
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
  ASSERT_TRUE(p.wait_for_output("[default0]:ready", 30s)) << p.err();
  std::set<int> ports = testing::listening_ports(p.pid());
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
  EXPECT_EQ(p.wait(30s).exit_code, 0);
}

// One node without --standalone or an endpoint meets nobody: no store, no
// listening socket (its workers use rank 0's store, on MASTER_PORT).
TEST(Standalone, OneNodeWithoutTheFlagHostsNoStore) {
  testing::TempDir dir;
  std::string go = (dir / "go").string();
  testing::Subprocess p(
      {{dlaunch::testing::bin("dlaunch"), "--nproc-per-node", "1", "sh", "-c",
        "echo ready; while [ ! -e " + go + " ]; do sleep 0.02; done"},
       {},
       {},
       ""});
  ASSERT_TRUE(p.wait_for_output("[default0]:ready", 30s)) << p.err();
  EXPECT_EQ(testing::listening_ports(p.pid()), std::set<int>{});
  testing::write_file(go, "");
  EXPECT_EQ(p.wait(30s).exit_code, 0);
}

}  // namespace
}  // namespace dlaunch
