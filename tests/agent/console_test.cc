// The console writer: text the console takes is written at once, on the
// caller's thread; what a full pipe refuses follows later, in order, and
// the caller never blocks.
#include "agent/console.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>

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

}  // namespace
}  // namespace dlaunch::agent
