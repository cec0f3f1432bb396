// PrefixStore over a real TcpStore: keys are scoped, every operation passes
// through, and the view's own timeout bounds its blocking calls.

#include "comm/store/prefix_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/comm/store/store_test_util.h"

namespace dlaunch::comm::store {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class PrefixStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::start_local_server();
    base_ = testing::connect_to(server_->port());
  }
  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<TcpStore> base_;
};

TEST_F(PrefixStoreTest, KeysLiveUnderPrefixSlash) {
  PrefixStore a("round/1", base_);
  PrefixStore b("round/2", base_);
  a.set("k", "from-a");
  EXPECT_EQ(base_->get("round/1/k"), "from-a");
  EXPECT_FALSE(b.check({"k"}));
  base_->set("round/2/k", "from-base");
  EXPECT_EQ(b.get("k"), "from-base");
  EXPECT_EQ(a.get("k"), "from-a");
  EXPECT_EQ(a.prefix(), "round/1");
}

TEST_F(PrefixStoreTest, EveryOperationIsScoped) {
  PrefixStore p("p", base_);
  EXPECT_EQ(p.add("n", 3), 3);
  EXPECT_EQ(base_->add("p/n", 1), 4);
  EXPECT_EQ(p.compare_set("c", "", "v"), "v");
  EXPECT_EQ(base_->get("p/c"), "v");
  EXPECT_EQ(p.append("log", "ab"), 2);
  EXPECT_EQ(base_->get("p/log"), "ab");
  p.multi_set({"x", "y"}, {"1", "2"});
  EXPECT_EQ(base_->multi_get({"p/x", "p/y"}),
            (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(p.multi_get({"y", "x"}), (std::vector<std::string>{"2", "1"}));
  p.wait({"x", "y"});
  p.wait({"x"}, 1s);
  EXPECT_TRUE(p.check({"x", "n"}));
  EXPECT_TRUE(p.delete_key("x"));
  EXPECT_FALSE(base_->check({"p/x"}));
  base_->set("elsewhere", "1");
  // torch's PrefixStore counts the whole base store.
  EXPECT_EQ(p.num_keys(), base_->num_keys());
}

TEST_F(PrefixStoreTest, PrefixStoresNest) {
  auto outer = std::make_shared<PrefixStore>("a", base_);
  PrefixStore inner("b", outer);
  inner.set("k", "v");
  EXPECT_EQ(base_->get("a/b/k"), "v");
}

TEST_F(PrefixStoreTest, OwnTimeoutBoundsGetAndLeavesTheBaseAlone) {
  base_->set_timeout(10s);
  PrefixStore p("p", base_);
  EXPECT_EQ(p.timeout(), 10s);
  p.set_timeout(100ms);
  EXPECT_THAT([&] { p.get("missing"); },
              ::testing::ThrowsMessage<StoreTimeoutError>(::testing::StrEq(
                  "timed out after 100 ms waiting for key 'p/missing' (0/1 "
                  "present)")));
  EXPECT_THAT(
      [&] { p.multi_get({"missing"}); },
      ::testing::ThrowsMessage<StoreTimeoutError>(HasSubstr("after 100 ms")));
  EXPECT_THAT(
      [&] { p.wait({"missing"}); },
      ::testing::ThrowsMessage<StoreTimeoutError>(HasSubstr("after 100 ms")));
  EXPECT_EQ(base_->timeout(), 10s);
}

}  // namespace
}  // namespace dlaunch::comm::store
