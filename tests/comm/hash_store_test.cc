#include "comm/store/hash_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <thread>

namespace dlaunch::comm::store {
namespace {

using std::chrono::milliseconds;

TEST(HashStoreTest, SetGetAddAppendAndDelete) {
  HashStore s;
  s.set("a", "1");
  EXPECT_EQ(s.get("a"), "1");
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(s.get("n"), "3");
  EXPECT_EQ(s.append("l", "ab"), 2);
  EXPECT_EQ(s.append("l", "cde"), 5);
  EXPECT_EQ(s.get("l"), "abcde");
  EXPECT_EQ(s.num_keys(), 3);
  EXPECT_TRUE(s.check({"a", "n"}));
  EXPECT_FALSE(s.check({"a", "zz"}));
  EXPECT_TRUE(s.delete_key("a"));
  EXPECT_FALSE(s.delete_key("a"));
  EXPECT_EQ(s.num_keys(), 2);
}

TEST(HashStoreTest, AddOnNonIntegerValueIsAnError) {
  HashStore s;
  s.set("k", "abc");
  EXPECT_THROW(s.add("k", 1), StoreError);
  // As the TCP store says (signed overflow was undefined here).
  s.set("max", std::to_string(INT64_MAX));
  EXPECT_THAT([&] { s.add("max", 1); },
              ::testing::ThrowsMessage<StoreError>(
                  ::testing::HasSubstr("would overflow int64")));
  EXPECT_EQ(s.get("max"), std::to_string(INT64_MAX));
}

TEST(HashStoreTest, CompareSetFollowsTorch) {
  HashStore s;
  EXPECT_EQ(s.compare_set("k", "x", "y"), "x");  // missing, non-empty expected
  EXPECT_FALSE(s.check({"k"}));
  EXPECT_EQ(s.compare_set("k", "", "v1"), "v1");  // missing matches ""
  EXPECT_EQ(s.compare_set("k", "nope", "v2"), "v1");
  EXPECT_EQ(s.compare_set("k", "v1", "v2"), "v2");
}

TEST(HashStoreTest, MultiSetAndMultiGet) {
  HashStore s;
  s.multi_set({"a", "b"}, {"1", "2"});
  EXPECT_EQ(s.multi_get({"b", "a"}), (std::vector<std::string>{"2", "1"}));
  EXPECT_THROW(s.multi_set({"a"}, {}), StoreError);
}

TEST(HashStoreTest, GetBlocksUntilAnotherThreadSets) {
  HashStore s;
  auto getter = std::async(std::launch::async, [&] { return s.get("late"); });
  // Still waiting without the key; the set releases it.
  EXPECT_EQ(getter.wait_for(milliseconds(50)), std::future_status::timeout);
  s.set("late", "v");
  EXPECT_EQ(getter.get(), "v");
}

TEST(HashStoreTest, WaitTimesOutNamingMissingKeys) {
  HashStore s;
  s.set("here", "1");
  auto start = std::chrono::steady_clock::now();
  try {
    s.wait({"here", "rank_3"}, milliseconds(100));
    FAIL() << "wait returned without the key";
  } catch (const StoreTimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'rank_3'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1/2 present"), std::string::npos) << msg;
    EXPECT_NE(msg.find("100 ms"), std::string::npos) << msg;
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(100));
  EXPECT_LT(elapsed, milliseconds(15000));  // hang guard: not the 5 min default
}

TEST(HashStoreTest, GetUsesTheStoreTimeout) {
  HashStore s;
  s.set_timeout(milliseconds(50));
  EXPECT_THROW(s.get("never"), StoreTimeoutError);
  EXPECT_THROW(s.multi_get({"never"}), StoreTimeoutError);
}

TEST(HashStoreTest, ConcurrentAddsAreAtomic) {
  HashStore s;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) s.add("c", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(s.get("c"), "4000");
}

}  // namespace
}  // namespace dlaunch::comm::store
