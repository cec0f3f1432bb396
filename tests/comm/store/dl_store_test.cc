// The dl-store binary: announces its port, serves clients, stops on SIGTERM
// or SIGINT, and reports bad flags and bind failures.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <vector>

#include "tests/comm/store/store_test_util.h"

namespace dlaunch::comm::store {
namespace {

using testing::bin;
using testing::Child;
using ::testing::HasSubstr;

// Starts dl-store on 127.0.0.1 port 0 and returns the port it announced.
uint16_t start_dl_store(Child& child) {
  std::string line = child.read_line();
  std::smatch m;
  EXPECT_TRUE(std::regex_match(
      line, m, std::regex("dl-store listening on 127\\.0\\.0\\.1:([0-9]+)")))
      << "first line: " << line;
  return m.empty() ? 0 : static_cast<uint16_t>(std::stoi(m[1]));
}

TEST(DlStoreTest, ServesOnTheAnnouncedPortUntilSigterm) {
  Child child({bin("dl-store"), "--host", "127.0.0.1", "--port", "0"});
  uint16_t port = start_dl_store(child);
  ASSERT_NE(port, 0);
  auto a = testing::connect_to(port);
  auto b = testing::connect_to(port);
  a->set("k", "v");
  EXPECT_EQ(b->get("k"), "v");
  child.signal(SIGTERM);
  EXPECT_EQ(child.wait(), 0);
  EXPECT_THROW(b->get("k"), StoreError);
}

TEST(DlStoreTest, StopsOnSigint) {
  Child child({bin("dl-store"), "--host", "127.0.0.1", "--port", "0"});
  ASSERT_NE(start_dl_store(child), 0);
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(), 0);
}

TEST(DlStoreTest, BadFlagExitsTwoNamingIt) {
  Child child({bin("dl-store"), "--port", "70000"});
  EXPECT_EQ(child.wait(), 2);
  EXPECT_THAT(child.read_stderr(), HasSubstr("--port"));
  Child unknown({bin("dl-store"), "--prot", "1"});
  EXPECT_EQ(unknown.wait(), 2);
  EXPECT_THAT(unknown.read_stderr(), HasSubstr("--prot"));
}

TEST(DlStoreTest, PortInUseExitsOneNamingTheAddress) {
  auto server = testing::start_local_server();
  std::string port = std::to_string(server->port());
  Child child({bin("dl-store"), "--host", "127.0.0.1", "--port", port});
  EXPECT_EQ(child.wait(), 1);
  EXPECT_EQ(child.read_stderr(), "dl-store: cannot bind store to 127.0.0.1:" +
                                     port + ": address already in use\n");
}

// Out of file descriptors, the server logs once, keeps serving the clients
// it has, and accepts again once descriptors free up.
TEST(DlStoreTest, SurvivesRunningOutOfFileDescriptors) {
  Child child({"/bin/sh", "-c",
               "ulimit -n 32 && exec " + bin("dl-store") +
                   " --host 127.0.0.1 --port 0"});
  uint16_t port = start_dl_store(child);
  ASSERT_NE(port, 0);
  std::vector<std::unique_ptr<TcpStore>> clients;
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = std::chrono::milliseconds(300);
  bool refused = false;
  while (!refused && clients.size() < 64) {
    try {
      clients.push_back(TcpStore::connect(o));
    } catch (const StoreError& e) {
      refused = true;
      EXPECT_THAT(e.what(), HasSubstr("unreachable after 300 ms"));
    }
  }
  ASSERT_TRUE(refused) << "the fd limit never bit";
  EXPECT_GT(clients.size(), 10u);
  clients.front()->set("k", "v");
  EXPECT_EQ(clients.back()->get("k"), "v");
  clients.resize(clients.size() - 5);
  o.connect_timeout = std::chrono::seconds(10);
  EXPECT_EQ(TcpStore::connect(o)->get("k"), "v");
  child.signal(SIGTERM);
  EXPECT_EQ(child.wait(), 0);
  std::string err = child.read_stderr();
  size_t lines = 0;
  for (size_t at = 0;
       (at = err.find("cannot accept connections", at)) != std::string::npos;
       ++at) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << err;
  EXPECT_THAT(err, HasSubstr("cannot accept connections: too many open "
                             "files; retrying every 100 ms"));
}

// An agent hosts the server and spawns workers: neither the listening socket
// nor any connection may leak into them.
TEST(StoreServerTest, SocketsAreNotInheritedByChildProcesses) {
  auto server = testing::start_local_server();
  auto client = testing::connect_to(server->port());
  client->set("k", "v");  // the server has accepted the connection
  Child ls({"/bin/sh", "-c", "ls -l /proc/$$/fd"});
  std::string listing, line;
  while (!(line = ls.read_line()).empty()) listing += line + "\n";
  EXPECT_EQ(ls.wait(), 0);
  EXPECT_THAT(listing, ::testing::Not(HasSubstr("socket:"))) << listing;
}

}  // namespace
}  // namespace dlaunch::comm::store
