// Unit tests of the host parsers: hostlists (pdsh/Slurm syntax), hostfiles,
// --hosts items with slots, and deepspeed's --include/--exclude; every bad
// form in a table with the words its message must carry.
#include "launcher/hostlist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "launcher/hostfile.h"
#include "launcher/hosts.h"

namespace dlaunch::launcher {
namespace {

using ::testing::HasSubstr;
using Names = std::vector<std::string>;

TEST(HostlistTest, ExpandsRangesListsAndProducts) {
  struct Case {
    std::string text;
    Names want;
  };
  const std::vector<Case> cases = {
      {"node1", {"node1"}},
      {"node[01-04],gpu7", {"node01", "node02", "node03", "node04", "gpu7"}},
      {"n[1-3,7,09-10]", {"n1", "n2", "n3", "n7", "n09", "n10"}},
      {"n[08-11]", {"n08", "n09", "n10", "n11"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[001-002]x", {"n001x", "n002x"}},
      {"r[1-2]n[1,3]", {"r1n1", "r1n3", "r2n1", "r2n3"}},
      {"[1-2]", {"1", "2"}},
      {"127.0.0.[2-4]", {"127.0.0.2", "127.0.0.3", "127.0.0.4"}},
      {"a,b,a", {"a", "b", "a"}},  // duplicates are the caller's to judge
      {"host-a_b.example.com", {"host-a_b.example.com"}},
      {"n[5-5]", {"n5"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(expand_hostlist(c.text), c.want);
  }
}

TEST(HostlistTest, EveryBadFormIsAClearError) {
  struct Case {
    std::string text;
    std::string words;
    size_t offset;
  };
  const std::vector<Case> cases = {
      {"", "empty", 0},
      {",a", "empty host name at offset 0", 0},
      {"a,", "empty host name at offset 2", 2},
      {"a,,b", "empty host name at offset 2", 2},
      // ssh would read these as options (-F.evil loads a config file).
      {"-F.evil",
       "a host name at offset 0 starts with '-' (ssh would take "
       "it for an option)",
       0},
      {"n1,-v", "a host name at offset 3 starts with '-'", 3},
      {"n[1-3", "'[' at offset 1 is never closed", 1},
      {"n1-3]", "']' at offset 4 has no '['", 4},
      {"n[1[2]]", "nested '[' at offset 3", 3},
      {"n[]", "empty brackets at offset 1", 1},
      {"n[3-1]", "range '3-1' runs backwards", 2},
      {"n[a-c]", "'a-c' is not a number", 2},
      {"n[1-]", "'1-' is not a number", 2},
      {"n[-3]", "'-3' is not a number", 2},
      {"n[1-2-3]", "'1-2-3' is not a number", 2},
      {"n[1,,2]", "an empty element in brackets at offset 4", 4},
      {"n[1,]", "an empty element in brackets at offset 4", 4},
      {"n[ 1]", "' 1' is not a number", 2},
      {"n[99999999999999999999]", "is not a number", 2},
      {"n[1-99999999]", "has more than 65536 hosts", 2},
      {"a[1-300]b[1-300]", "more than 65536 hosts", 0},
      {"bad/host", "'/' at offset 3 is not allowed in a host name", 3},
      {"a b", "' ' at offset 1 is not allowed", 1},
      {"a:4", "':' at offset 1 is not allowed", 1},
      {std::string("a\x01"), "byte 1 at offset 1", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      expand_hostlist(c.text);
      ADD_FAILURE() << "no error";
    } catch (const HostlistError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
      EXPECT_EQ(e.offset(), c.offset) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

// The cap holds for every item: names without brackets count too (they
// once went past it), and whole texts of --hosts, --include/--exclude and
// hostfiles are held to it across their items and lines.
TEST(HostlistTest, TheHostCapHoldsForEveryItemAndInAll) {
  EXPECT_EQ(expand_hostlist("a,b", 2), (Names{"a", "b"}));
  for (const char* text : {"a,b,c", "a[1-2],c", "c,a[1-2]"}) {
    SCOPED_TRACE(text);
    try {
      expand_hostlist(text, 2);
      ADD_FAILURE() << "no error";
    } catch (const HostlistError& e) {
      EXPECT_THAT(e.what(), HasSubstr("more than 2 hosts"));
    }
  }
  // 80000 hosts in two items or lines of 40000 each.
  const std::string two = "a[1-40000],b[1-40000]";
  try {
    parse_host_list(two);
    ADD_FAILURE() << "no error";
  } catch (const HostsError& e) {
    EXPECT_THAT(e.what(), HasSubstr("more than 65536 hosts in all"));
  }
  try {
    parse_host_filter("a[1-40000]@b[1-40000]");
    ADD_FAILURE() << "no error";
  } catch (const HostsError& e) {
    EXPECT_THAT(e.what(), HasSubstr("more than 65536 hosts in all"));
  }
  try {
    parse_hostfile("a[1-40000]\nb[1-40000]\n", "hf");
    ADD_FAILURE() << "no error";
  } catch (const HostsError& e) {
    EXPECT_THAT(e.what(), HasSubstr("hf:2:1: hosts: more than 65536 hosts in "
                                    "all"));
  }
  EXPECT_EQ(parse_host_list("a[1-30000],b[1-30000]").size(), 60000u);
}

// Many large bracket groups fail at the group that goes past the cap, not
// after all of them were built: 400 groups of 65536 numbers would take
// gigabytes. Checked in a child whose address space is capped (not under
// AddressSanitizer, whose shadow memory needs more).
TEST(HostlistTest, ManyLargeGroupsFailWithoutBuildingThem) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory needs an uncapped "
                  "address space";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "AddressSanitizer's shadow memory needs an uncapped "
                  "address space";
#endif
#endif
  std::string text = "n";
  for (int i = 0; i < 400; ++i) text += "[0-65535]";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // 256 MiB more than the child has now.
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    rlim_t limit = static_cast<rlim_t>(pages) * ::sysconf(_SC_PAGESIZE) +
                   (rlim_t{256} << 20);
    rlimit rl{limit, limit};
    if (pages == 0 || ::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(3);
    try {
      expand_hostlist(text);
      ::_exit(1);
    } catch (const HostlistError& e) {
      ::_exit(std::string(e.what()).find("more than 65536 hosts") !=
                      std::string::npos
                  ? 0
                  : 1);
    } catch (const std::bad_alloc&) {
      ::_exit(2);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: no error or another one; 2: out of memory building the groups; "
         "3: could not cap the address space";
}

TEST(HostlistTest, SplitKeepsBracketedCommas) {
  EXPECT_EQ(split_hostlist("a[1,2],b"),
            (std::vector<std::string_view>{"a[1,2]", "b"}));
  EXPECT_EQ(split_hostlist("a"), (std::vector<std::string_view>{"a"}));
  EXPECT_EQ(split_hostlist(""), (std::vector<std::string_view>{""}));
}

TEST(HostlistTest, SplitFieldsKeepsEmptyFieldsAsViewsIntoTheText) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(split_fields("a,,b", ','), (V{"a", "", "b"}));
  EXPECT_EQ(split_fields("0,2@n", '@'), (V{"0,2", "n"}));
  EXPECT_EQ(split_fields(",", ','), (V{"", ""}));
  EXPECT_EQ(split_fields("", ','), (V{""}));
  const std::string_view text = "x,yz";
  EXPECT_EQ(split_fields(text, ',')[1].data(), text.data() + 2);
}

TEST(HostfileTest, ReadsSlotsCommentsBlankLinesAndHostlists) {
  const std::string text =
      "# the cluster\n"
      "node1 slots=2  # first\n"
      "\n"
      "   \t\n"
      "node2:4\r\n"
      "gpu[1-2] slots=8\n"
      "plain\n";
  EXPECT_EQ(
      parse_hostfile(text, "hf"),
      (std::vector<Host>{
          {"node1", 2}, {"node2", 4}, {"gpu1", 8}, {"gpu2", 8}, {"plain", 0}}));
  EXPECT_TRUE(parse_hostfile("# nothing\n\n", "hf").empty());
}

TEST(HostfileTest, EveryBadLineNamesItsLine) {
  struct Case {
    std::string text;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"a\nb\na slots=2\n",
       "hf:3:1: hosts: 'a' is listed twice (first on line 1)"},
      {"n[1-3]\nn2\n", "hf:2:1: hosts: 'n2' is listed twice (first on line 1)"},
      {"a slots=two\n", "hf:1:1: hosts: 'two' slots for a is not valid"},
      {"a slots=0\n", "'0' slots for a is not valid; use a number 1..65536"},
      {"a:0\n", "'0' slots for a"},
      {"a:\n", "'a:' has no slots after ':'"},
      {"a slots=\n", "'slots=' has no number"},
      {"a cpus=2\n", "'cpus=2' is not valid; write NAME, NAME:SLOTS"},
      {"a:2 slots=2\n", "'slots=2' is not valid"},
      {"a slots=2 b\n", "'b' is extra; write one host per line"},
      {"  bad/host\n", "hf:1:3: hosts: 'bad/host': '/' at offset 3"},
      {"n[1-\n", "'[' at offset 1 is never closed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      parse_hostfile(c.text, "hf");
      ADD_FAILURE() << "no error";
    } catch (const HostsError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
    }
  }
  EXPECT_THROW(read_hostfile("/nonexistent/hostfile"), HostsError);
}

TEST(HostsTest, HostListItemsTakeSlots) {
  EXPECT_EQ(parse_host_list("node[01-02]:8,gpu7"),
            (std::vector<Host>{{"node01", 8}, {"node02", 8}, {"gpu7", 0}}));
  struct Case {
    std::string text;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"", "the host list is empty"},        {"a,a", "'a' is listed twice"},
      {"n[1-2],n2", "'n2' is listed twice"}, {"a:0", "'0' is not a slot count"},
      {"a:x", "'x' is not a slot count"},    {"a:", "'' is not a slot count"},
      {":4", "an empty host name"},          {"a[1-", "never closed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      parse_host_list(c.text);
      ADD_FAILURE() << "no error";
    } catch (const HostsError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
    }
  }
}

TEST(HostsTest, FiltersParseDeepspeedSyntax) {
  EXPECT_EQ(parse_host_filter("node01:0,2@node02"),
            (std::vector<HostFilter>{{"node01", {0, 2}}, {"node02", {}}}));
  EXPECT_EQ(parse_host_filter("n[1-2]:1"),
            (std::vector<HostFilter>{{"n1", {1}}, {"n2", {1}}}));
  struct Case {
    std::string text;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"", "it is empty"},
      {"a@", "an empty entry"},
      {"@a", "an empty entry"},
      {"a:", "'' is not a GPU index"},
      {"a:x", "'x' is not a GPU index"},
      {"a:-1", "'-1' is not a GPU index"},
      {"a:1,1", "GPU 1 is named twice"},
      {":1", "no host name before ':'"},
      {"a/b", "not allowed in a host name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      parse_host_filter(c.text);
      ADD_FAILURE() << "no error";
    } catch (const HostsError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
    }
  }
}

TEST(HostsTest, IncludeAndExcludeSelectHostsAndGpus) {
  const std::vector<Host> all = {{"a", 4}, {"b", 0}, {"c", 2}};
  auto f = [](const std::string& s) { return parse_host_filter(s); };
  EXPECT_EQ(select_hosts(all, {}, {}, 3), all);
  EXPECT_EQ(select_hosts(all, f("c@a:2,0"), {}, 3),
            (std::vector<Host>{{"a", 2, {0, 2}}, {"c", 2}}));
  EXPECT_EQ(select_hosts(all, {}, f("b@a:1"), 3),
            (std::vector<Host>{{"a", 3, {0, 2, 3}}, {"c", 2}}));
  // A host without slots has --nproc-per-node's GPUs.
  EXPECT_EQ(select_hosts(all, {}, f("b:0"), 3),
            (std::vector<Host>{{"a", 4}, {"b", 2, {1, 2}}, {"c", 2}}));
  // Every GPU of a host excluded drops the host.
  EXPECT_EQ(select_hosts(all, {}, f("c:0,1"), 3),
            (std::vector<Host>{{"a", 4}, {"b", 0}}));
  struct Case {
    std::vector<HostFilter> include, exclude;
    std::string words;
  };
  const std::vector<Case> cases = {
      {f("a"), f("b"), "--include and --exclude cannot be used together"},
      {f("z"), {}, "--include: 'z' is not one of the job's hosts"},
      {{}, f("z"), "--exclude: 'z' is not one of the job's hosts"},
      {f("a@a"), {}, "'a' is named twice"},
      {f("a:4"), {}, "--include: a:4: a has 4 slot(s), GPUs 0..3"},
      {f("b:3"), {}, "b has 3 slot(s)"},
      {{}, f("a@b@c"), "--exclude leaves no host to run on"},
  };
  for (const Case& c : cases) {
    try {
      select_hosts(all, c.include, c.exclude, 3);
      ADD_FAILURE() << "no error for " << c.words;
    } catch (const HostsError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
    }
  }
}

// default_slots 0 (--nproc-per-node auto or cpu, or gpu that this machine
// could not count): a host without slots has no known GPUs, so no index
// may be named there (the head once took 1, or its CPU count: with no GPU
// here, excluding b:0 dropped b whole and including b:1 was refused).
TEST(HostsTest, GpusOfAHostWithoutAKnownCountCannotBeNamed) {
  const std::vector<Host> all = {{"a", 4}, {"b", 0}};
  auto f = [](const std::string& s) { return parse_host_filter(s); };
  EXPECT_EQ(select_hosts(all, {}, f("a:0@b"), 0),
            (std::vector<Host>{{"a", 3, {1, 2, 3}}}));
  EXPECT_EQ(select_hosts(all, f("b"), {}, 0), (std::vector<Host>{{"b", 0}}));
  for (auto [include, exclude] :
       {std::pair{f("b:1"), std::vector<HostFilter>{}},
        std::pair{std::vector<HostFilter>{}, f("b:0,2")}}) {
    EXPECT_THAT(
        [&] { select_hosts(all, include, exclude, 0); },
        ::testing::ThrowsMessage<HostsError>(::testing::HasSubstr(
            ": b has no slots given and --nproc-per-node gives no GPU count "
            "here (auto or cpu, or gpu on a machine without GPUs), so its "
            "GPU indices cannot be checked; give its slots (b:N in --hosts, "
            "slots=N in the hostfile)")));
  }
}

}  // namespace
}  // namespace dlaunch::launcher
