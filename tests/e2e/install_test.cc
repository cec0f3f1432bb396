// `cmake --install` into a temporary prefix gives working programs and a
// usable comm: examples/consumer builds against the installed CMake package
// (and against dlaunch.pc) and all-reduces under the installed dlaunch.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <string>

#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;
using testing::CommandResult;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Building the consumer compiles comm's headers: minutes on a loaded
// machine, a bound only.
constexpr auto kBuildTimeout = 400s;

// A fresh install of this build tree under a temporary prefix.
class Install : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult r =
        testing::run_command({{DLAUNCH_CMAKE_COMMAND, "--install",
                               DLAUNCH_BUILD_DIR, "--prefix", prefix_.string()},
                              {},
                              {},
                              ""},
                             120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }

  // The consumer's folder in the source tree.
  static std::string consumer_source() {
    return DLAUNCH_SOURCE_DIR "/examples/consumer";
  }

  // Runs `program` under the installed dlaunch with 2 ranks and checks that
  // both ranks got the right sum.
  void expect_all_reduce_under_dlaunch(const fs::path& program) {
    CommandResult r =
        testing::run_command({{(prefix_ / "bin/dlaunch").string(),
                               "--nproc-per-node", "2", program.string()},
                              {},
                              {},
                              ""},
                             120s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("[default0]:rank 0 of 2: all_reduce sum 3 "
                                 "(expected 3)\n"));
    EXPECT_THAT(r.out, HasSubstr("[default1]:rank 1 of 2: all_reduce sum 3 "
                                 "(expected 3)\n"));
  }

  testing::TempDir dir_{"dlaunch-install"};
  fs::path prefix_ = dir_ / "prefix";
};

TEST_F(Install, PutsProgramsHeadersAndPackageFilesInThePrefix) {
  for (const char* f :
       {"bin/dlaunch", "bin/dlaunch-watchdog", "bin/dlaunch-cuda-devices",
        "bin/dl-store", "bin/dl-sgd", "bin/dl-p2p", "bin/dl-collectives",
        "bin/dl-ring-allreduce", "bin/dl-bench", "include/dlaunch/comm/init.h",
        "include/dlaunch/comm/store/client.h",
        "include/dlaunch/comm/gloo/process_group.h"}) {
    EXPECT_TRUE(fs::exists(prefix_ / f)) << f;
  }
  // Headers private to a path's sources stay out (the store's needs Boost).
  for (const char* f : {"include/dlaunch/comm/gloo/shm_p2p_internal.h",
                        "include/dlaunch/comm/store/server_internal.h"}) {
    EXPECT_FALSE(fs::exists(prefix_ / f)) << f;
  }
  // The benchmarks' binaries: dl-store-bench in PATH, the helpers with
  // generic names under libexec/dlaunch/.
  if (DLAUNCH_INSTALLS_BENCH) {
    for (const char* f :
         {"bin/dl-store-bench", "libexec/dlaunch/allreduce_bench",
          "libexec/dlaunch/forkexec8", "libexec/dlaunch/launch-fail-once"}) {
      EXPECT_TRUE(fs::exists(prefix_ / f)) << f;
    }
  }
  // GNUInstallDirs picks lib/ or lib/<multiarch>/ by prefix.
  bool config = false, pc = false;
  for (const auto& e : fs::recursive_directory_iterator(prefix_)) {
    config |= e.path().filename() == "dlaunchConfig.cmake";
    pc |= e.path().filename() == "dlaunch.pc";
  }
  EXPECT_TRUE(config);
  EXPECT_TRUE(pc);
}

TEST_F(Install, ManFindsTheInstalledPageAndBashLoadsTheCompletion) {
  // Where man (MANPATH's man1/) and bash-completion (completions/NAME) look.
  CommandResult r = testing::run_command(
      {{"man", "-P", "cat", "dlaunch"},
       {{"MANPATH", (prefix_ / "share/man").string()}, {"MANWIDTH", "80"}},
       {},
       ""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--nproc-per-node"));
  r = testing::run_command(
      {{"bash", "-c", "source \"$1\" && complete -p dlaunch", "bash",
        (prefix_ / "share/bash-completion/completions/dlaunch").string()},
       {},
       {},
       ""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("-F _dlaunch dlaunch\n"));
}

TEST_F(Install, InstalledDlaunchPrintsItsVersion) {
  CommandResult r = testing::run_command(
      {{(prefix_ / "bin/dlaunch").string(), "--version"}, {}, {}, ""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "dlaunch " DLAUNCH_PROJECT_VERSION "\n");
}

TEST_F(Install, InstalledDlaunchFindsItsGpuHelperBesideIt) {
  // auto asks dlaunch-cuda-devices (0 GPUs here: one worker per CPU); a
  // missing helper is an error, not a fallback.
  CommandResult r = testing::run_command(
      {{(prefix_ / "bin/dlaunch").string(), "--nproc-per-node", "auto", "true"},
       {},
       {"DLAUNCH_CUDA_DEVICES"},
       ""});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("cannot count CUDA devices")));
}

TEST_F(Install, InstalledDlaunchRunsItsWatchdogBesideIt) {
  testing::Subprocess p(
      {{(prefix_ / "bin/dlaunch").string(), "--nproc-per-node", "1", "sh", "-c",
        "echo ready; exec sleep 60"},
       {},
       {},
       ""});
  ASSERT_TRUE(p.wait_for_output("[default0]:ready", 60s)) << p.err();
  const fs::path watchdog = fs::canonical(prefix_ / "bin/dlaunch-watchdog");
  EXPECT_TRUE(testing::eventually(
      [&] {
        for (pid_t d : testing::descendants(p.pid())) {
          std::error_code ec;
          if (fs::read_symlink("/proc/" + std::to_string(d) + "/exe", ec) ==
              watchdog) {
            return true;
          }
        }
        return false;
      },
      30s))
      << "no process below dlaunch runs " << watchdog;
  p.signal(SIGTERM);
  p.wait(60s);
}

TEST_F(Install, CMakeConsumerAllReducesUnderInstalledDlaunch) {
  const fs::path build = dir_ / "consumer-build";
  CommandResult r = testing::run_command(
      {{DLAUNCH_CMAKE_COMMAND, "-S", consumer_source(), "-B", build.string(),
        "-DCMAKE_PREFIX_PATH=" + prefix_.string(),
        "-DCMAKE_CXX_COMPILER=" DLAUNCH_CXX_COMPILER},
       {},
       {},
       ""},
      kBuildTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = testing::run_command(
      {{DLAUNCH_CMAKE_COMMAND, "--build", build.string()}, {}, {}, ""},
      kBuildTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_all_reduce_under_dlaunch(build / "consumer");
}

TEST_F(Install, PkgConfigConsumerAllReducesUnderInstalledDlaunch) {
  std::string pc_path;
  for (const auto& e : fs::recursive_directory_iterator(prefix_)) {
    if (e.path().filename() == "dlaunch.pc") {
      pc_path = e.path().parent_path().string();
    }
  }
  ASSERT_FALSE(pc_path.empty());
  const fs::path program = dir_ / "consumer";
  CommandResult r = testing::run_command(
      {{"sh", "-c",
        "exec \"$CXX\" -std=c++20 \"$SRC/consumer.cc\" -o \"$OUT\" "
        "$(pkg-config --cflags --libs dlaunch)"},
       {{"PKG_CONFIG_PATH", pc_path},
        {"CXX", DLAUNCH_CXX_COMPILER},
        {"SRC", consumer_source()},
        {"OUT", program.string()}},
       {},
       ""},
      kBuildTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_all_reduce_under_dlaunch(program);
}

}  // namespace
}  // namespace dlaunch
