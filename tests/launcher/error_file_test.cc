// Unit tests of the failure records a multi-host job's agents leave the
// head (error_file.h): their text, and which host the head names the
// root cause.
#include "launcher/error_file.h"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

namespace dlaunch::launcher {
namespace {

TEST(HostFailureTest, ARecordReadsBackAsWritten) {
  const HostFailure f{.code = 7,
                      .root_time = "2026-12-03 14:01:02.345",
                      .round = 3,
                      .error_text = "{\"message\": \"x\"}"};
  const HostFailure back = decode_host_failure(encode_host_failure(f));
  EXPECT_EQ(back.code, 7);
  EXPECT_EQ(back.root_time, f.root_time);
  EXPECT_EQ(back.round, 3);
  EXPECT_EQ(back.error_text, f.error_text);
}

TEST(HostFailureTest, TextThatIsNoRecordIsRefusedNamingIt) {
  for (const std::string text :
       {"", "not json", "[1]", "{\"root_time\": \"\"}",
        "{\"code\": \"7\", \"root_time\": \"\", \"error_text\": \"\"}",
        "{\"code\": 7, \"round\": \"2\"}", "{\"code\": 7, \"root_time\": 5}",
        "{\"code\": 7, \"root_time\": \"\", \"round\": \"2\", "
        "\"error_text\": \"\"}",
        "{\"code\": 7, \"root_time\": \"\", \"error_text\": \"\"}"}) {
    try {
      decode_host_failure(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "not a host's failure record: " + text);
    }
  }
}

// An elastic job goes on without a host that failed in round 1; its last
// round's root cause is the job's, although the lost host failed earlier.
TEST(HostFailureTest, TheLatestRoundsFirstFailureIsTheRootCause) {
  std::map<std::string, HostFailure> told = {
      {"lost",
       {.code = 3,
        .root_time = "2026-12-03 14:00:00.000",
        .round = 1,
        .error_text = ""}},
      {"late",
       {.code = 5,
        .root_time = "2026-12-03 14:05:00.002",
        .round = 4,
        .error_text = ""}},
      {"first",
       {.code = 7,
        .root_time = "2026-12-03 14:05:00.001",
        .round = 4,
        .error_text = ""}},
      {"ended", {.code = 1, .root_time = "", .round = 4, .error_text = ""}},
  };
  EXPECT_EQ(root_cause_host(told), "first");
  told.erase("first");
  EXPECT_EQ(root_cause_host(told), "late");
  told.erase("late");
  EXPECT_EQ(root_cause_host(told), "lost");
  told.erase("lost");
  EXPECT_EQ(root_cause_host(told), "") << "no host's own worker failed";
}

}  // namespace
}  // namespace dlaunch::launcher
