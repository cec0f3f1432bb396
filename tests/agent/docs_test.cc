// dlaunch(1) and the bash completion come from the flag table: every flag
// is in both, man renders the page without a warning, and bash completes
// flags, their fixed values, and nothing of ours after PROG.
#include "launcher/docs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "launcher/cli.h"
#include "launcher/flags.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

TEST(Docs, ManRendersEveryFlagWithoutWarnings) {
  testing::TempDir dir;
  const auto page = dir / "dlaunch.1";
  testing::write_file(page, man_page(help_text(), "9.8.7"));
  testing::CommandResult r = testing::run_command(
      {{"man", "--warnings", "-l", "-P", "cat", page.string()},
       {{"MANWIDTH", "80"}, {"LANG", "C.UTF-8"}},
       {},
       ""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* section :
       {"NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "EXAMPLES"}) {
    EXPECT_THAT(r.out, HasSubstr(section));
  }
  EXPECT_THAT(r.out, HasSubstr("dlaunch - start, watch and restart"));
  EXPECT_THAT(r.out, HasSubstr("dlaunch 9.8.7"));
  for (const FlagSpec& f : flags()) {
    // The page shows ASCII minus signs, so flags copied from it work.
    EXPECT_THAT(r.out, HasSubstr("--" + std::string(f.name))) << f.name;
  }
}

// The words bash would offer for `words` with the cursor on the last one.
std::vector<std::string> complete(const std::vector<std::string>& words) {
  testing::TempDir dir;
  testing::write_file(dir / "dlaunch", bash_completion());
  std::string array;
  for (const std::string& w : words) array += " '" + w + "'";
  testing::CommandResult r = testing::run_command(
      {{"bash", "--norc", "-c",
        // compopt only works inside real completion; here it is a no-op.
        "compopt() { :; }; source \"$0\" && COMP_WORDS=(" + array +
            ") && COMP_CWORD=" + std::to_string(words.size() - 1) +
            " && _dlaunch && printf '%s\\n' \"${COMPREPLY[@]}\"",
        (dir / "dlaunch").string()},
       {},
       {},
       dir.path().string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::vector<std::string> out;
  std::istringstream lines(r.out);
  for (std::string l; std::getline(lines, l);) {
    if (!l.empty()) out.push_back(l);
  }
  return out;
}

TEST(Docs, BashCompletesEveryFlagSpelling) {
  std::vector<std::string> offered = complete({"dlaunch", "-"});
  for (const FlagSpec& f : flags()) {
    for (const std::string& s : spellings(f)) {
      EXPECT_THAT(offered, ::testing::Contains(s));
    }
  }
  EXPECT_THAT(complete({"dlaunch", "--nproc-per"}),
              UnorderedElementsAre("--nproc-per-node"));
}

TEST(Docs, BashCompletesAFlagsFixedValues) {
  EXPECT_THAT(complete({"dlaunch", "--nproc-per-node", ""}),
              UnorderedElementsAre("cpu", "gpu", "auto"));
  EXPECT_THAT(complete({"dlaunch", "--nproc_per_node", "g"}),
              UnorderedElementsAre("gpu"));
}

TEST(Docs, BashLeavesTheProgramsArgumentsToTheProgram) {
  // After PROG (here past a flag's value), "--" words are not ours.
  EXPECT_THAT(complete({"dlaunch", "--max-restarts", "2", "train.py", "--"}),
              ::testing::IsEmpty());
  EXPECT_THAT(complete({"dlaunch", "--", "train.py", "--n"}),
              ::testing::IsEmpty());
  // Before PROG, a switch takes no value: the next word is still ours.
  EXPECT_THAT(complete({"dlaunch", "--standalone", "--max-r"}),
              UnorderedElementsAre("--max-restarts"));
}

}  // namespace
}  // namespace dlaunch::launcher
