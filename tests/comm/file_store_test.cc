#include "comm/file_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::comm {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(FileStoreTest, OperationsAndSharingThroughTheFile) {
  dlaunch::testing::TempDir dir;
  const std::string path = dir / "store";
  FileStore a(path);
  FileStore b(path);
  a.set("k", "v1");
  EXPECT_EQ(b.get("k"), "v1");
  EXPECT_EQ(b.add("n", 3), 3);
  EXPECT_EQ(a.add("n", 4), 7);
  EXPECT_EQ(a.append("l", "ab"), 2);
  EXPECT_EQ(b.append("l", "c"), 3);
  EXPECT_EQ(a.get("l"), "abc");
  EXPECT_EQ(a.compare_set("k", "v1", "v2"), "v2");
  EXPECT_EQ(b.compare_set("k", "zz", "v3"), "v2");
  EXPECT_EQ(b.compare_set("fresh", "", "x"), "x");
  EXPECT_EQ(b.compare_set("absent", "e", "x"), "e");
  EXPECT_EQ(a.num_keys(), 4);  // k, n, l, fresh
  EXPECT_TRUE(b.delete_key("fresh"));
  EXPECT_FALSE(a.delete_key("fresh"));
  EXPECT_FALSE(a.check({"fresh"}));
  a.multi_set({"x", "y"}, {"1", "2"});
  EXPECT_EQ(b.multi_get({"y", "x"}), (std::vector<std::string>{"2", "1"}));
  EXPECT_THROW(a.add("k", 1), store::StoreError);  // "v2" is no integer
}

TEST(FileStoreTest, GetWakesWhenAnotherInstanceWrites) {
  dlaunch::testing::TempDir dir;
  FileStore a(dir / "store");
  std::thread writer([&] {
    FileStore b(dir / "store");
    std::this_thread::sleep_for(milliseconds(100));
    b.set("late", "here");
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(a.get("late"), "here");
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(90));
  EXPECT_LT(elapsed, milliseconds(1000));
  writer.join();
}

TEST(FileStoreTest, WaitTimesOutNamingTheMissingKeys) {
  dlaunch::testing::TempDir dir;
  FileStore a(dir / "store");
  a.set("there", "1");
  try {
    a.wait({"there", "rank_2"}, milliseconds(150));
    FAIL() << "wait returned";
  } catch (const store::StoreTimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'rank_2'"));
    EXPECT_THAT(e.what(), HasSubstr("1/2 present"));
    EXPECT_THAT(e.what(), HasSubstr("150 ms"));
  }
}

TEST(FileStoreTest, LastUserRemovesTheFile) {
  dlaunch::testing::TempDir dir;
  const std::string path = dir / "store";
  {
    FileStore a(path);
    {
      FileStore b(path);
      b.set("k", "v");
    }
    EXPECT_TRUE(std::filesystem::exists(path));
    EXPECT_EQ(a.get("k"), "v");
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(FileStoreTest, ConcurrentAddsFromSeveralProcessesAreAtomic) {
  dlaunch::testing::TempDir dir;
  const std::string path = dir / "store";
  FileStore keep(path);  // keeps the file while the children come and go
  std::vector<pid_t> kids;
  for (int p = 0; p < 4; ++p) {
    pid_t pid = fork();
    ASSERT_NE(pid, -1);
    if (pid == 0) {
      try {
        FileStore s(path);
        for (int i = 0; i < 200; ++i) s.add("count", 1);
        s.append("log", "x");
      } catch (...) {
        _exit(1);
      }
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    std::optional<int> status =
        dlaunch::testing::wait_exit(pid, std::chrono::seconds(60));
    ASSERT_TRUE(status) << "child " << pid << " did not finish in 60 s";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  }
  EXPECT_EQ(keep.get("count"), "800");
  EXPECT_EQ(keep.get("log"), "xxxx");
}

TEST(FileStoreTest, UnopenablePathIsAClearError) {
  try {
    FileStore s("/nonexistent-dir-dlaunch/store");
    FAIL() << "opened";
  } catch (const store::StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent-dir-dlaunch/store"));
    EXPECT_THAT(e.what(), HasSubstr("directory must exist"));
  }
}

}  // namespace
}  // namespace dlaunch::comm
