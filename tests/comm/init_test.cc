// init_process_group's argument and environment checks, and a one-rank
// group over a file store (which listens on a socket).
#include "comm/init.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm/progress.h"
#include "comm/store/hash_store.h"
#include "tests/comm/rank_threads.h"
#include "tests/testing/net.h"
#include "tests/testing/temp_dir.h"
#ifdef DLAUNCH_WITH_NCCL
#include "comm/nccl/process_group.h"
#endif

namespace dlaunch::comm {
namespace {

using ::testing::HasSubstr;

using testing::error_of;

class InitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "DLAUNCH_COMM_TIMEOUT"}) {
      unsetenv(v);
    }
  }
};

// Without NCCL in the build, or without a GPU, "nccl" fails at once with a
// message naming the reason and the way out; before any store is touched.
TEST_F(InitTest, NcclWithoutABuildOrADeviceIsAClearError) {
  auto store = std::make_shared<store::HashStore>();
  std::string init = error_of([] { init_process_group("nccl"); });
  std::string made = error_of([&] {
    make_process_group("nccl", store, 0, 1, std::chrono::seconds(1));
  });
#ifdef DLAUNCH_WITH_NCCL
  std::string why;
  if (nccl::visible_devices(&why) > 0) {
    GTEST_SKIP() << "a GPU is visible: the no-device error cannot show";
  }
  for (const std::string& e : {init, made}) {
    EXPECT_THAT(e, HasSubstr("backend 'nccl': no CUDA device is visible"));
    EXPECT_THAT(e, HasSubstr(why));
    EXPECT_THAT(e, HasSubstr("or use backend 'gloo'"));
  }
  EXPECT_EQ(store->num_keys(), 0);
#else
  for (const std::string& e : {init, made}) {
    EXPECT_THAT(e, HasSubstr("backend 'nccl'"));
    EXPECT_THAT(e, HasSubstr("not available"));
    EXPECT_THAT(e, HasSubstr("use backend 'gloo'"));
  }
#endif
  EXPECT_THAT(error_of([] { init_process_group("mpi"); }),
              HasSubstr("unknown backend 'mpi'; valid backends: gloo, nccl"));
}

TEST_F(InitTest, EnvInitNamesTheMissingVariable) {
  EXPECT_THAT(error_of([] { init_process_group("gloo"); }),
              HasSubstr("WORLD_SIZE is not set"));
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_THAT(error_of([] { init_process_group("gloo"); }),
              HasSubstr("RANK is not set"));
  setenv("RANK", "0", 1);
  EXPECT_THAT(error_of([] { init_process_group("gloo"); }),
              HasSubstr("MASTER_ADDR is not set"));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "http", 1);
  EXPECT_THAT(error_of([] { init_process_group("gloo"); }),
              HasSubstr("MASTER_PORT is 'http'; expected an integer in "
                        "1..65535"));
  setenv("RANK", "2", 1);
  EXPECT_THAT(error_of([] { init_process_group("gloo"); }),
              HasSubstr("rank 2 is out of range for world size 2"));
}

TEST_F(InitTest, BadInitMethodsAndTimeouts) {
  InitOptions o;
  o.init_method = "udp://x:1";
  EXPECT_THAT(error_of([&] { init_process_group("gloo", o); }),
              HasSubstr("use env://, tcp://HOST:PORT or file:///path"));
  o.init_method = "tcp://hostonly";
  EXPECT_THAT(error_of([&] { init_process_group("gloo", o); }),
              HasSubstr("not of the form tcp://HOST:PORT"));
  o.init_method = "tcp://127.0.0.1:29500";
  EXPECT_THAT(error_of([&] { init_process_group("gloo", o); }),
              HasSubstr("needs an explicit rank and world size"));
  o.init_method = "file://relative/path";
  o.rank = 0;
  o.world_size = 1;
  EXPECT_THAT(error_of([&] { init_process_group("gloo", o); }),
              HasSubstr("must name an absolute path"));
  setenv("DLAUNCH_COMM_TIMEOUT", "soon", 1);
  o.init_method = "env://";
  EXPECT_THAT(error_of([&] { init_process_group("gloo", o); }),
              HasSubstr("DLAUNCH_COMM_TIMEOUT is 'soon'"));
}

TEST_F(InitTest, TimeoutsOutsideOneMillisecondToSevenDaysAreRefused) {
  InitOptions o;
  o.init_method = "env://";
  o.rank = 0;
  o.world_size = 1;
  for (const char* bad : {"nan", "inf", "-inf", "1e308", "604801", "1e9", "0",
                          "-1", "1e-9", "0.0004", " 5", "5s"}) {
    setenv("DLAUNCH_COMM_TIMEOUT", bad, 1);
    std::string e = error_of([&] { init_process_group("gloo", o); });
    EXPECT_THAT(e, HasSubstr(std::string("DLAUNCH_COMM_TIMEOUT is '") + bad +
                             "'; expected seconds from 0.001 to 604800 "
                             "(7 days)"))
        << bad;
  }
  unsetenv("DLAUNCH_COMM_TIMEOUT");
  for (auto t : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5),
                 kMaxTimeout + std::chrono::milliseconds(1)}) {
    o.timeout = t;
    EXPECT_THAT(
        error_of([&] { init_process_group("gloo", o); }),
        HasSubstr("InitOptions.timeout is " + std::to_string(t.count()) +
                  " ms; it must be from 1 ms to 7 days"));
  }
  auto store = std::make_shared<store::HashStore>();
  EXPECT_THAT(error_of([&] {
                make_process_group("gloo", store, 0, 1,
                                   kMaxTimeout + std::chrono::hours(1));
              }),
              HasSubstr("it must be from 1 ms to 7 days"));
}

TEST_F(InitTest, FileInitWithOneRankAndTimeoutFromTheEnvironment) {
  dlaunch::testing::TempDir dir("dlaunch-init");
  std::string path = dir / "store";
  setenv("DLAUNCH_COMM_TIMEOUT", "2.5", 1);
  // file:// has no address to route to, so Gloo would listen on this host's
  // name, which a minimal machine (a chroot without /etc/hosts) cannot
  // resolve; this test is about the timeout, not the address.
  setenv("DLAUNCH_GLOO_HOST", "127.0.0.1", 1);
  InitOptions o;
  o.init_method = "file://" + path;
  o.rank = 0;
  o.world_size = 1;
  {
    auto pg = init_process_group("gloo", o);
    EXPECT_EQ(pg->timeout(), std::chrono::milliseconds(2500));
    EXPECT_EQ(pg->size(), 1);
    EXPECT_EQ(pg->backend(), "gloo");
    EXPECT_EQ(pg->name(), "world");
    std::vector<float> v{3.0f};
    pg->all_reduce(Tensor::of(v), ReduceOp::kAvg);
    EXPECT_EQ(v[0], 3.0f);
  }
  unsetenv("DLAUNCH_GLOO_HOST");
}

// An IPv6 MASTER_ADDR (dlaunch's --master-addr takes ::1 and [::1]): rank
// 0 serves the store on both stacks. It served IPv4 only, and every rank,
// rank 0 included, failed with "connection refused".
TEST_F(InitTest, EnvInitWithAnIpv6MasterAddress) {
  for (const char* addr : {"::1", "[::1]"}) {
    SCOPED_TRACE(addr);
    setenv("MASTER_ADDR", addr, 1);
    setenv("MASTER_PORT", std::to_string(dlaunch::testing::free_port()).c_str(),
           1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("DLAUNCH_COMM_TIMEOUT", "5", 1);
    auto pg = init_process_group("gloo", {});
    std::vector<float> v{3.0f};
    pg->all_reduce(Tensor::of(v));
    EXPECT_EQ(v[0], 3.0f);
  }
}

// DLAUNCH_COMM_FAULTS in a one-rank group: the fault fires at its call and
// is written into the progress record (spec, action, time) for the agent;
// a rank outside the world is an error naming the spec.
TEST_F(InitTest, ACommFaultIsNotedInTheProgressRecord) {
  dlaunch::testing::TempDir dir("dlaunch-init");
  const std::string record_path = dir / "progress_0";
  int fd = ::open(record_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kProgressFileSize), 0);
  void* m = ::mmap(nullptr, kProgressFileSize, PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(m, MAP_FAILED);
  const auto& record = *static_cast<const ProgressRecord*>(m);
  setenv("DLAUNCH_GLOO_HOST", "127.0.0.1", 1);
  setenv("DLAUNCH_PROGRESS_FILE", record_path.c_str(), 1);
  InitOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.timeout = std::chrono::seconds(10);

  setenv("DLAUNCH_COMM_FAULTS", "fail:rank=0:op=all_reduce:call=2", 1);
  o.init_method = "file://" + (dir / "store").string();
  {
    auto pg = init_process_group("gloo", o);
    std::vector<float> v{1.0f};
    pg->all_reduce(Tensor::of(v), ReduceOp::kSum);
    EXPECT_EQ(record.fault_time_ns.load(), 0);
    EXPECT_THAT(
        error_of([&] { pg->all_reduce(Tensor::of(v), ReduceOp::kSum); }),
        HasSubstr("DLAUNCH_COMM_FAULTS: fault injected: "
                  "fail:rank=0:op=all_reduce:call=2 (call 2 of "
                  "all_reduce)"));
    EXPECT_NE(record.fault_time_ns.load(), 0);
    EXPECT_STREQ(record.fault_spec, "fail:rank=0:op=all_reduce:call=2");
    EXPECT_STREQ(record.fault_action, "failing it");
    EXPECT_EQ(record.entered.load(), 1u);
  }

  setenv("DLAUNCH_COMM_FAULTS", "fail:rank=1:op=barrier", 1);
  o.init_method = "file://" + (dir / "store2").string();
  EXPECT_THAT(error_of([&] { init_process_group("gloo", o); }),
              HasSubstr("DLAUNCH_COMM_FAULTS: fault 'fail:rank=1:op=barrier': "
                        "rank 1 is out of range: 1 workers (ranks 0..0)"));
  // Another attempt's fault is not checked against this world.
  setenv("DLAUNCH_COMM_FAULTS", "fail:rank=1:op=barrier:attempt=1", 1);
  o.init_method = "file://" + (dir / "store3").string();
  EXPECT_NO_THROW(init_process_group("gloo", o));
  for (const char* v :
       {"DLAUNCH_GLOO_HOST", "DLAUNCH_PROGRESS_FILE", "DLAUNCH_COMM_FAULTS"}) {
    unsetenv(v);
  }
  ::munmap(m, kProgressFileSize);
}

}  // namespace
}  // namespace dlaunch::comm
