// The console writer: text the console takes is written at once, on the
// caller's thread; what a full pipe refuses follows later, in order, and
// the caller never blocks.
#include "agent/console.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace dlaunch::agent {
namespace {

using namespace std::chrono_literals;

struct Pipe {
  Pipe() { EXPECT_EQ(::pipe2(fd, O_CLOEXEC), 0); }
  ~Pipe() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  int fd[2] = {-1, -1};
};

TEST(Console, TextThePipeTakesIsThereWhenWriteReturns) {
  Pipe p;
  Console console(p.fd[1]);
  console.write("one line\n");
  // No writer thread to wait for: the bytes are in the pipe already.
  ::fcntl(p.fd[0], F_SETFL, O_NONBLOCK);
  char buf[64];
  ssize_t n = ::read(p.fd[0], buf, sizeof buf);
  ASSERT_EQ(n, 9);
  EXPECT_EQ(std::string(buf, 9), "one line\n");
  EXPECT_EQ(console.finish(1s), 0u);
}

TEST(Console, WhatAFullPipeRefusesFollowsInOrderWithoutBlocking) {
  Pipe p;
  ASSERT_GT(::fcntl(p.fd[1], F_SETPIPE_SZ, 4096), 0);
  Console console(p.fd[1]);
  std::string expect;
  for (char c : {'a', 'b', 'c', 'd'}) {
    std::string chunk(3000, c);
    chunk.back() = '\n';
    console.write(chunk);  // returns although the pipe holds 4096 bytes
    expect += chunk;
  }
  std::string got;
  char buf[4096];
  while (got.size() < expect.size()) {
    ssize_t n = ::read(p.fd[0], buf, sizeof buf);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got, expect);
  EXPECT_EQ(console.finish(5s), 0u);
}

// A reader slower than the job but reading gets everything at the end:
// finish()'s bound is on a console that takes nothing, not on the whole
// drain (with 2 s in all, a slow `| tee` lost the tail and the report).
TEST(Console, FinishWaitsForASlowReaderThatKeepsReading) {
  Pipe p;
  ASSERT_GT(::fcntl(p.fd[1], F_SETPIPE_SZ, 4096), 0);
  std::string expect, got;
  std::thread reader;
  {
    Console console(p.fd[1]);
    // One long write, then short ones: progress within a write counts
    // (a reader below 64 KiB per bound lost the rest).
    for (int i = 0; i < 40; ++i) {
      std::string chunk(i == 0 ? 200000 : 4000,
                        static_cast<char>('a' + i % 26));
      chunk.back() = '\n';
      console.write(chunk);
      expect += chunk;
    }
    reader = std::thread([&] {
      char buf[4096];
      for (ssize_t n; (n = ::read(p.fd[0], buf, sizeof buf)) > 0;) {
        got.append(buf, static_cast<size_t>(n));
        std::this_thread::sleep_for(10ms);  // ~90 reads: over the bound
      }
    });
    EXPECT_EQ(console.finish(200ms), 0u);
  }
  ::close(p.fd[1]);  // the reader ends at EOF, all taken or not
  p.fd[1] = -1;
  reader.join();
  EXPECT_EQ(got, expect);
}

// One that stops reading loses what it did not take after the bound.
TEST(Console, FinishDropsWhatAStoppedReaderLeaves) {
  Pipe p;
  ASSERT_GT(::fcntl(p.fd[1], F_SETPIPE_SZ, 4096), 0);
  ::signal(SIGPIPE, SIG_IGN);  // the writer left blocked meets a closed pipe
  Console console(p.fd[1]);
  console.write(std::string(20000, 'x') + "\n");  // the writer's, blocked
  console.write(std::string(20000, 'y') + "\n");  // queued behind it
  EXPECT_EQ(console.finish(200ms), 20001u);
}

TEST(Console, OneFileTwiceIsTheSameFile) {
  Pipe p, q;
  const int dup = ::dup(p.fd[1]);
  EXPECT_TRUE(Console::same_file(p.fd[1], dup));
  EXPECT_FALSE(Console::same_file(p.fd[1], q.fd[1]));
  ::close(dup);
}

}  // namespace
}  // namespace dlaunch::agent
