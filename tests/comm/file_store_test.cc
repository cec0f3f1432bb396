#include "comm/file_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
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

// The other instance writes once the getter sleeps in get() (seen in
// /proc); the get wakes, long before its 60 s timeout.
TEST(FileStoreTest, GetWakesWhenAnotherInstanceWrites) {
  dlaunch::testing::TempDir dir;
  FileStore a(dir / "store", std::chrono::seconds(60));
  std::atomic<pid_t> getter{0};
  std::thread writer([&] {
    FileStore b(dir / "store");
    EXPECT_TRUE(dlaunch::testing::eventually(
        [&] {
          return getter != 0 && dlaunch::testing::process_state(getter) == 'S';
        },
        std::chrono::seconds(10)));
    b.set("late", "here");
  });
  auto start = std::chrono::steady_clock::now();
  getter = ::gettid();
  EXPECT_EQ(a.get("late"), "here");
  // Hang guard, far below the timeout: woken by the write.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
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

// Runs `child` in a forked process and returns its exit code (-1 when it
// did not exit within 10 s or died of a signal).
template <class F>
int in_child(F&& child) {
  pid_t pid = fork();
  if (pid == 0) _exit(child());
  std::optional<int> status =
      dlaunch::testing::wait_exit(pid, std::chrono::seconds(10));
  return status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

TEST(FileStoreTest, WaitingForTheFileLockEndsAtTheTimeout) {
  // This process holds the lock (as a stopped process or a hung NFS client
  // would); another process's store must give up at its 300 ms timeout.
  dlaunch::testing::TempDir dir;
  const std::string path = dir / "store";
  { FileStore create(path); }
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_NE(fd, -1);
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(fd, F_SETLK, &fl), 0);
  int code = in_child([&] {
    try {
      FileStore s(path, milliseconds(300));
      return 1;
    } catch (const store::StoreTimeoutError& e) {
      return std::string(e.what()).find(
                 "could not lock the file within 300 ms") != std::string::npos
                 ? 0
                 : 2;
    } catch (...) {
      return 3;
    }
  });
  ::close(fd);
  EXPECT_EQ(code, 0) << "1: got the lock, 2: wrong message, 3: other error, "
                        "-1: still waiting after 10 s";
  FileStore after(path, milliseconds(300));  // free again
  after.set("k", "v");
  EXPECT_EQ(after.get("k"), "v");
}

TEST(FileStoreTest, AFailedWriteLeavesTheFileReadable) {
  // A file size limit cuts a record in the middle, as a full disk would.
  dlaunch::testing::TempDir dir;
  const std::string path = dir / "store";
  int code = in_child([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    try {
      FileStore s(path);
      s.set("before", "1");
      struct stat st {};
      ::stat(path.c_str(), &st);
      struct rlimit rl {};
      rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(st.st_size) + 10;
      setrlimit(RLIMIT_FSIZE, &rl);
      s.set("big", std::string(4096, 'x'));
      return 1;
    } catch (const store::StoreError& e) {
      return std::string(e.what()).find("write of key 'big' failed") !=
                     std::string::npos
                 ? 0
                 : 2;
    }
  });
  ASSERT_EQ(code, 0) << "1: the write fit, 2: wrong message";
  FileStore reader(path);
  EXPECT_EQ(reader.get("before"), "1");
  EXPECT_FALSE(reader.check({"big"}));
  reader.set("after", "2");
  FileStore again(path);
  EXPECT_EQ(again.get("after"), "2");
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
