// PyTorch programs run unchanged under dlaunch (Debian's python3-torch,
// called as /usr/bin/python3). Skipped where torch is not importable.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/testing/bin.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::string kDlaunch = testing::bin("dlaunch");
const std::string kPython = "/usr/bin/python3";
const std::string kScripts = DLAUNCH_SOURCE_DIR "/tests/e2e/py/";

class Torch : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult r = testing::run_command(
        {{kPython, "-c", "import torch.distributed"}, {}, {}, ""}, 60s);
    if (r.exit_code != 0) GTEST_SKIP() << kPython << " cannot import torch";
  }
};

TEST_F(Torch, GlooAllReduceWithFourWorkers) {
  CommandResult r =
      testing::run_command({{kDlaunch, "--nproc-per-node", "4", "--python",
                             kPython, kScripts + "allreduce_gloo.py"},
                            {},
                            {},
                            ""},
                           120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(r.out, HasSubstr("[default" + std::to_string(i) + "]:rank " +
                                 std::to_string(i) + "/4 allreduce=10 ok\n"));
  }
}

TEST_F(Torch, FailsOnceThenSucceedsAfterARestart) {
  testing::TempDir dir;
  CommandResult r = testing::run_command(
      {{kDlaunch, "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
        dir.path().string(), "--run-id", "once", kScripts + "fail_once.py"},
       {{"PYTHON", kPython}},
       {},
       ""},
      120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default0]:rank 0 attempt 1 sum=2\n"));
  EXPECT_THAT(r.out, HasSubstr("[default1]:rank 1 attempt 1 sum=2\n"));
  EXPECT_THAT(r.err, HasSubstr("restarting the worker group (restart 1 of 1)"));
  auto summary =
      nlohmann::json::parse(testing::read_file(dir / "once/summary.json"));
  ASSERT_EQ(summary["attempts"].size(), 2u);
  // @record wrote the error file; dlaunch read it into the first attempt.
  const auto& failed = summary["attempts"][0]["workers"][1];
  EXPECT_THAT(failed["error_message"].get<std::string>(),
              HasSubstr("injected failure on attempt 0"));
}

}  // namespace
}  // namespace dlaunch
