// YAML job files: every error kind with its line and column, the override
// order (file < PET_* < flag), ${VAR} expansion and paths, secrets, the
// --print-config round trip, and every example in configs/.
#include "launcher/job_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "launcher/cli.h"
#include "launcher/flags.h"
#include "launcher/job_print.h"
#include "launcher/multi_host.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::launcher {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;
using testing::write_file;

class JobFileTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text,
                    const std::string& name = "job.yaml") {
    fs::create_directories((dir_ / name).parent_path());
    write_file(dir_ / name, text);
    return (dir_ / name).string();
  }

  ParseResult parse(const std::vector<std::string>& args,
                    const agent::EnvMap& env = {}) {
    notes_.clear();
    return parse_command_line(
        args, env, [this](const std::string& n) { notes_.push_back(n); });
  }

  LaunchOptions ok(const std::vector<std::string>& args,
                   const agent::EnvMap& env = {}) {
    ParseResult r = parse(args, env);
    if (auto* e = std::get_if<UsageError>(&r)) {
      ADD_FAILURE() << "rejected: " << e->message;
      return {};
    }
    return std::get<LaunchOptions>(r);
  }

  // The one-line message for `yaml` as job.yaml, checked to mean exit 2.
  std::string error(const std::string& yaml, const agent::EnvMap& env = {},
                    std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"--config", write(yaml)};
    args.insert(args.end(), more.begin(), more.end());
    ParseResult r = parse(args, env);
    if (!std::holds_alternative<UsageError>(r)) {
      ADD_FAILURE() << "accepted:\n" << yaml;
      return "";
    }
    const UsageError& e = std::get<UsageError>(r);
    EXPECT_EQ(e.exit_code, 2);
    EXPECT_EQ(e.message.find('\n'), std::string::npos) << e.message;
    return e.message;
  }

  TempDir dir_;
  std::vector<std::string> notes_;
};

TEST_F(JobFileTest, EachErrorKindNamesItsLineAndColumn) {
  write("node1\nnode2 slots=2\nnode3 slots=two\n", "hostfile");
  struct Case {
    std::string yaml;
    std::string expect;
  };
  const std::vector<Case> cases = {
      // Unknown keys, with the nearest valid one.
      {"program: x\nmax_restartz: 2\n",
       "job.yaml:2:1: unknown key 'max_restartz'; did you mean max_restarts?"},
      {"program: x\n  \nnproc-per-node: 2\n",
       "job.yaml:3:1: unknown key 'nproc-per-node'; did you mean "
       "nproc_per_node?"},
      {"program: x\nwibble: 1\n", "job.yaml:2:1: unknown key 'wibble'; valid"},
      {"program: x\ndry_run: true\n",
       "job.yaml:2:1: 'dry_run' is a command-line action (--dry-run), not a "
       "job key"},
      {"program: x\nprogram: y\n", "job.yaml:2:1: program: appears twice"},
      {"program: x\nrdzv_conf: {join_timeout: 1, join_timeout: 2}\n",
       "job.yaml:2:30: rdzv_conf.join_timeout: appears twice; keep one"},
      // One document: a second one's keys were dropped unsaid.
      {"---\nprogram: x\n---\nnproc_per_node: 4\n",
       "job.yaml:4:1: a second YAML document (after a '---' or '...' line): "
       "a job file holds one"},
      {"program: x\n...\nnproc_per_node: 4\n",
       "job.yaml:3:1: a second YAML document"},
      // yaml-cpp gives endless empty documents here (the fuzzer's find: a
      // look for a second document never ended).
      {"# c\n, \"1\"]\nprogram: true\n",
       "job.yaml:2:1: not valid YAML: the parser makes no progress here"},
      // Wrong types.
      {"program: x\nnnodes: two\n",
       "job.yaml:2:9: nnodes: 'two' is not valid; use N or MIN:MAX"},
      {"program: x\nnproc_per_node: [1]\n",
       "job.yaml:2:17: nproc_per_node: expected an integer, cpu, gpu, auto, "
       "got list"},
      {"program: x\nstandalone: maybe\n",
       "job.yaml:2:13: standalone: expected true or false, got 'maybe'"},
      {"program: x\nterm_timeout: soon\n",
       "job.yaml:2:15: term_timeout: expected a number of seconds, got 'soon'"},
      {"program: x\nargs: {a: 1}\n", "job.yaml:2:7: args: expected a list"},
      {"program: x\nenv: [A]\n", "job.yaml:2:6: env: expected a mapping"},
      // Names a shell could not export.
      {"program: x\nenv:\n  1A: v\n",
       "job.yaml:3:3: env: '1A' is not a variable name; use letters, digits "
       "and _, not starting with a digit (like MY_VAR_1)"},
      {"program: x\nenv: {'A-B': v}\n",
       "job.yaml:2:7: env: 'A-B' is not a variable name"},
      {"program: x\nenv: {'': v}\n",
       "job.yaml:2:7: env: '' is not a variable name"},
      {"program: x\nexport: [A, '']\n",
       "job.yaml:2:9: export: '' names no variable; give NAME or NAME=VALUE"},
      {"program: x\nexport: [1A=v]\n",
       "job.yaml:2:9: export: '1A=v' is not NAME or NAME=VALUE"},
      {"program: x\nlocal_ranks_filter: [0, [1]]\n",
       "job.yaml:2:25: local_ranks_filter: expected a list item, got list"},
      {"- program\n", "job.yaml:1:1: the file must be a mapping"},
      // A missing program: the file's first line.
      {"nproc_per_node: 2\n", "job.yaml:1:1: no program; add 'program: PROG'"},
      // Invalid values: the flags' own messages.
      {"program: x\nmax_restarts: -1\n",
       "job.yaml:2:15: max_restarts: '-1' is not valid; use a number "
       "0..1048576"},
      {"program: x\nterm_timeout: .inf\n",
       "job.yaml:2:15: term_timeout: 'inf' is not valid; use a number of "
       "seconds from 0.001 to 604800 (7 days)"},
      {"program: x\n\nmonitor_interval: 1e308\n",
       "job.yaml:3:19: monitor_interval: '1e308' is not valid"},
      {"program: x\nrdzv_backend: etcd-v9\n",
       "job.yaml:2:15: rdzv_backend: 'etcd-v9' is not valid; use static, "
       "c10d or etcd"},
      // ${VAR}s.
      {"program: x\nenv:\n  A: ${DLAUNCH_TEST_UNSET}\n",
       "job.yaml:3:6: env.A: ${DLAUNCH_TEST_UNSET} is not set in the "
       "environment; set it or write ${DLAUNCH_TEST_UNSET:-DEFAULT}"},
      {"program: x\nrole: ${oops\n",
       "job.yaml:2:7: role: '${oops' has no "
       "closing '}'"},
      // Hosts, listed and in a hostfile.
      {"program: x\nhosts:\n  - node1\n  - bad/host\n",
       "job.yaml:4:5: hosts: 'bad/host': '/' at offset 3 is not allowed in a "
       "host name"},
      {"program: x\nhosts: [node1, node2:4, node1]\n",
       "job.yaml:2:25: hosts: 'node1' is listed twice"},
      {"program: x\nhosts: [node1:0]\n",
       "job.yaml:2:9: hosts: 'node1:0': '0' is not a slot count"},
      {"program: x\nhosts: 'n[1-2],n[2-3]'\n",
       "job.yaml:2:8: hosts: 'n[1-2],n[2-3]': 'n2' is listed twice"},
      {"program: x\nhosts: [n1, 'n[0-1]']\n",
       "job.yaml:2:13: hosts: 'n1' is listed twice"},
      {"program: x\nhosts: hostfile\n",
       "hostfile:3:1: hosts: 'two' slots for node3 is not valid"},
      {"program: x\nenv:\n  A: 1\n  B: 2\n  A: 3\n",
       "job.yaml:5:3: env: A appears twice (first on line 3); keep one"},
      {"program: x\nhosts: myhosts.txt\n", "job.yaml:2:8: hosts: '"},
      {"program: x\nhostfile: missing-hostfile\n",
       "job.yaml:2:11: hostfile: '"},
      {"program: x\nhostfile: hostfile\nhosts: [a]\n",
       "hosts and hostfile both name the hosts; keep one"},
      {"program: x\nfaults: {kill: 1}\n",
       "job.yaml:2:9: faults: expected a list"},
      // Not YAML at all.
      {"program: [x\n", "job.yaml:2:1: not valid YAML"},
      // A quote left open on the last line (yaml-cpp alone takes it for
      // a value that runs to the end), or earlier, or with no newline.
      {"program: x\nrole: \"abc\n",
       "job.yaml:3:1: not valid YAML: a quoted value is still open at the "
       "end of the file; close its quote"},
      {"program: x\nrole: 'abc\nmax_restarts: 2\n",
       "job.yaml:4:1: not valid YAML: a quoted value is still open"},
      {"program: x\nrole: \"abc", "job.yaml:3:1: not valid YAML: a quoted"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    EXPECT_THAT(error(c.yaml), HasSubstr(c.expect));
  }
  // A hostfile that is missing is named so, not taken for a host (or a
  // host name with '/' in it).
  for (const char* name :
       {"myhosts.txt", "./myhosts", "sub/h", "a.hosts", "b.CFG", "myhostfile",
        "hosts", "nodes", "machinefile", "cluster-machinefile"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(error("program: x\nhosts: " + std::string(name) + "\n"),
              "dlaunch: " + (dir_ / "job.yaml").string() + ":2:8: hosts: '" +
                  (dir_.path() / name).lexically_normal().string() +
                  "': no such file; give the path of a hostfile (relative to "
                  "this file's folder) or a hostlist like node[01-04]");
  }
  EXPECT_EQ(ok({"--config", write("program: x\nhosts: myhost\n")}).hosts,
            (std::vector<Host>{{"myhost", 0}}));
  // Hosts whose names merely end like a hostfile's are hosts.
  EXPECT_EQ(ok({"--config", write("program: x\nhosts: gpu-nodes\n")}).hosts,
            (std::vector<Host>{{"gpu-nodes", 0}}));
  std::string missing = (dir_ / "nope.yaml").string();
  EXPECT_THAT(std::get<UsageError>(parse({"--config", missing})).message,
              HasSubstr("--config: '" + missing + "': no such file"));
  // The flag that named it, --drill too.
  EXPECT_THAT(std::get<UsageError>(parse({"--drill", missing})).message,
              HasSubstr("--drill: '" + missing + "': no such file"));
  // A folder (once an uncaught std::ios_base::failure: abort).
  const ParseResult folder = parse({"--config", dir_.path().string()});
  ASSERT_TRUE(std::holds_alternative<UsageError>(folder));
  EXPECT_THAT(std::get<UsageError>(folder).message,
              HasSubstr("--config: '" + dir_.path().string() +
                        "': is a folder; give the path of a YAML job file"));
  // A file that is no job file: its start quoted, not all of it.
  const std::string text = "root:x:0:0:root:/root:/bin/bash " +
                           std::string(200, 'x') + " end-of-the-file";
  const std::string e = error(text + "\n");
  EXPECT_THAT(e, HasSubstr("not a 'root:x:0:0:root:/root:/bin/bash xxx"));
  EXPECT_THAT(e, Not(HasSubstr("end-of-the-file")));
}

// Quotes closed on the last line, with or without a newline, and a
// document end marker of the file's own still load; export: [] adds none.
TEST_F(JobFileTest, AFileEndingInAClosedQuoteOrAnEndMarkerLoads) {
  EXPECT_EQ(ok({"--config", write("program: x\nrole: 'a b'")}).agent.role,
            "a b");
  EXPECT_EQ(
      ok({"--config", write("program: x\nrole: \"a\\\"b\"\n")}).agent.role,
      "a\"b");
  EXPECT_EQ(ok({"--config", write("program: x\nrole: r\n...\n")}).agent.role,
            "r");
  EXPECT_TRUE(ok({"--config", write("program: x\nexport: []\n")})
                  .remote.exports.empty());
}

TEST_F(JobFileTest, InvalidValuesGetTheFlagsOwnMessages) {
  struct Case {
    std::string key, value;
  };
  for (const Case& c : std::vector<Case>{{"term_timeout", "nan"},
                                         {"max_restarts", "-5"},
                                         {"master_port", "70000"},
                                         {"tee", "9"},
                                         {"signals_to_handle", "SIGFOO"},
                                         {"start_method", "thread"},
                                         {"role", "\"\""}}) {
    SCOPED_TRACE(c.key);
    const FlagSpec* f = find_flag(c.key);
    ASSERT_NE(f, nullptr);
    std::string value = c.value == "\"\"" ? "" : c.value;
    ParseResult r = parse({"--" + std::string(f->name), value, "true"});
    ASSERT_TRUE(std::holds_alternative<UsageError>(r));
    std::string flag_msg = std::get<UsageError>(r).message;
    std::string prefix = "dlaunch: --" + std::string(f->name) + ": ";
    ASSERT_EQ(flag_msg.rfind(prefix, 0), 0u) << flag_msg;
    std::string flag_tail = flag_msg.substr(prefix.size());
    std::string file_msg =
        error("program: x\n" + c.key + ": " + c.value + "\n");
    EXPECT_THAT(file_msg, HasSubstr("job.yaml:2:"));
    EXPECT_EQ(file_msg.substr(file_msg.find(c.key + ": ") + c.key.size() + 2),
              flag_tail);
  }
}

TEST_F(JobFileTest, OverrideOrderIsFileThenPetThenFlag) {
  struct Row {
    std::optional<std::string> file, pet, flag;
    std::string want;
    bool note;  // the PET_* variable hides a key of the file
  };
  const std::vector<Row> rows = {
      {{}, {}, {}, "0", false},   {"1", {}, {}, "1", false},
      {{}, "2", {}, "2", false},  {{}, {}, "3", "3", false},
      {"1", "2", {}, "2", true},  {"1", {}, "3", "3", false},
      {{}, "2", "3", "3", false}, {"1", "2", "3", "3", false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.file.value_or("-") + " " + row.pet.value_or("-") + " " +
                 row.flag.value_or("-"));
    std::string yaml = "program: true\nrole: from-file\n";
    if (row.file) yaml += "max_restarts: " + *row.file + "\n";
    std::vector<std::string> args = {"--config", write(yaml)};
    if (row.flag) args.insert(args.end(), {"--max_restarts", *row.flag});
    agent::EnvMap env;
    if (row.pet) env["PET_MAX_RESTARTS"] = *row.pet;
    LaunchOptions o = ok(args, env);
    EXPECT_EQ(std::to_string(o.agent.max_restarts), row.want);
    EXPECT_EQ(o.agent.role, "from-file");  // keys nobody overrides stay
    if (row.note) {
      ASSERT_EQ(notes_.size(), 1u);
      EXPECT_THAT(notes_[0], HasSubstr("PET_MAX_RESTARTS=2 overrides "
                                       "max_restarts: 1 of "));
      EXPECT_THAT(notes_[0], HasSubstr("job.yaml:3:15"));
      // A line of its own on stderr: the next message starts on the next.
      EXPECT_TRUE(notes_[0].ends_with("job.yaml:3:15\n")) << notes_[0];
    } else {
      EXPECT_TRUE(notes_.empty()) << notes_[0];
    }
  }
  // A program on the command line replaces the file's program and args.
  std::string f = write("program: sh\nargs: [-c, 'exit 3']\n");
  EXPECT_EQ(ok({"--config", f}).agent.entrypoint,
            (std::vector<std::string>{"sh", "-c", "exit 3"}));
  EXPECT_EQ(ok({"--config", f, "echo", "hi"}).agent.entrypoint,
            (std::vector<std::string>{"echo", "hi"}));
}

// The file's env map < --env-file < -x, as for every other key (the map
// once won over both).
TEST_F(JobFileTest, ExportsAndTheEnvFileBeatTheFilesEnvMap) {
  const std::string f =
      write("program: true\nenv: {X: file, Y: file, Z: file}\n");
  const std::string e = write("Y=env-file\nZ=env-file\n", "vars.env");
  const auto env = asked_environment(
      ok({"--config", f, "--env-file", e, "-x", "Z=flag"}), {});
  EXPECT_EQ(env.at("X"), "file");
  EXPECT_EQ(env.at("Y"), "env-file");
  EXPECT_EQ(env.at("Z"), "flag");
}

// A host name too long for a path is looked for as a hostfile without
// throwing (std::filesystem::exists threw on it: an abort; the fuzzer's
// find).
TEST_F(JobFileTest, AHostNameTooLongForAPathIsNoFile) {
  const std::string name(5000, 'a');
  LaunchOptions o =
      ok({"--config", write("program: x\nhosts: " + name + "\n")});
  ASSERT_EQ(o.hosts.size(), 1u);
  EXPECT_EQ(o.hosts[0].name, name);
}

// The dry run shows what --env-file and -x set, and stops where the run
// would (it showed neither and passed an unreadable --env-file).
TEST_F(JobFileTest, TheDryRunShowsAndChecksTheEnvFileAndExports) {
  const std::string e = write("FROM_FILE=1\nHF_TOKEN=t0k\n", "vars.env");
  const std::string plan =
      dry_run_plan(ok({"--env-file", e, "-x", "FROM_FLAG=2", "true"}));
  EXPECT_THAT(plan, HasSubstr("    FROM_FILE=1\n"));
  EXPECT_THAT(plan, HasSubstr("    FROM_FLAG=2\n"));
  EXPECT_THAT(plan, HasSubstr("    HF_TOKEN=<secret, not shown>\n"));
  EXPECT_THAT(plan, Not(HasSubstr("t0k")));
  // A bare -x NAME is named, its value (the environment's) not shown.
  ::setenv("DLAUNCH_TEST_URL", "postgres://u:pw@h/db", 1);
  const std::string bare = dry_run_plan(ok({"-x", "DLAUNCH_TEST_URL", "true"}));
  ::unsetenv("DLAUNCH_TEST_URL");
  EXPECT_THAT(bare,
              HasSubstr("    DLAUNCH_TEST_URL=<this environment's value>\n"));
  EXPECT_THAT(bare, Not(HasSubstr("pw@h")));
  EXPECT_THAT(
      [&] {
        dry_run_plan(ok({"--env-file", e + ".gone", "true"}));
      },
      ::testing::ThrowsMessage<std::runtime_error>(
          HasSubstr("--env-file: '" + e + ".gone': no such file")));
}

// --hosts and PET_HOSTS replace the file's hosts whether it names them by
// `hosts:` or by `hostfile:` (the latter once failed: "--hosts and
// --hostfile both name the hosts", a --hostfile nobody typed); --hostfile
// replaces either too.
TEST_F(JobFileTest, HostsGivenOutsideTheFileReplaceItsHostsOrHostfile) {
  write("f1\nf2\n", "hosts.txt");
  write("g1\ng2\n", "other.txt");
  auto names = [](const LaunchOptions& o) {
    std::vector<std::string> out;
    for (const Host& h : o.hosts) out.push_back(h.name);
    return out;
  };
  const std::vector<std::string> cli = {"n1", "n2"};
  const std::vector<std::string> other = {"g1", "g2"};
  for (const char* key : {"hosts", "hostfile"}) {
    SCOPED_TRACE(key);
    std::string f =
        write(std::string("program: true\n") + key + ": hosts.txt\n");
    EXPECT_EQ(names(ok({"--config", f})),
              (std::vector<std::string>{"f1", "f2"}));
    EXPECT_EQ(names(ok({"--config", f, "--hosts", "n1,n2"})), cli);
    EXPECT_EQ(names(ok({"--config", f}, {{"PET_HOSTS", "n1,n2"}})), cli);
    EXPECT_EQ(names(ok({"--config", f, "--hostfile",
                        (dir_.path() / "other.txt").string()})),
              other);
  }
}

TEST_F(JobFileTest, VariablesExpandAndRelativePathsFollowTheFile) {
  write("node1 slots=2  # the first\n\n# a comment\nnode2:2\n",
        "sub/hosts.txt");
  std::string f = write(
      "program: ./bin/train\n"
      "args: [--out, '${OUT}/x', --name, '${NAME:-anon}', --shard, "
      "'${local_rank}', '$${HOME}']\n"
      "log_dir: logs\n"
      "python: ./venv/python\n"
      "hosts: hosts.txt\n"
      "env: {A: '${OUT}', B: '${UNSET_B:-dflt}'}\n",
      "sub/job.yaml");
  fs::path sub = dir_.path() / "sub";
  LaunchOptions o = ok({"--config", f}, {{"OUT", "/o"}});
  EXPECT_EQ(o.program, (sub / "bin/train").string());
  EXPECT_EQ(o.program_args,
            (std::vector<std::string>{"--out", "/o/x", "--name", "anon",
                                      "--shard", "${local_rank}", "${HOME}"}));
  EXPECT_EQ(o.agent.log_dir, sub / "logs");
  EXPECT_EQ(o.python, (sub / "venv/python").string());
  EXPECT_EQ(o.hosts, (std::vector<Host>{{"node1", 2}, {"node2", 2}}));
  EXPECT_EQ(o.env,
            (std::map<std::string, std::string>{{"A", "/o"}, {"B", "dflt"}}));
  EXPECT_EQ(o.config_file, fs::path(f));
  // A bare program or interpreter name stays a PATH lookup.
  LaunchOptions bare =
      ok({"--config", write("program: sh\npython: python3\n", "sub/b.yaml")});
  EXPECT_EQ(bare.program, "sh");
  EXPECT_EQ(bare.python, "python3");
}

// The files rdzv_conf names are the job file's folder's, as log_dir is
// (they were the launch folder's), and a printed job names them absolute.
TEST_F(JobFileTest, RdzvConfFilesFollowTheFile) {
  fs::path sub = dir_.path() / "sub";
  std::string f = write(
      "program: true\nnnodes: 2\nrdzv_backend: etcd\nrdzv_endpoint: e1\n"
      "rdzv_conf: {token_file: tok, cacert: ca.pem, cert: /abs/c.pem, key: "
      "k/k.pem, user: ./u, password_file: pw, join_timeout: 5}\n",
      "sub/job.yaml");
  LaunchOptions o = ok({"--config", f});
  EXPECT_EQ(o.rdzv.token_file, (sub / "tok").string());
  EXPECT_EQ(o.rdzv.cacert, (sub / "ca.pem").string());
  EXPECT_EQ(o.rdzv.cert, "/abs/c.pem");
  EXPECT_EQ(o.rdzv.key, (sub / "k/k.pem").string());
  EXPECT_EQ(o.rdzv.password_file, (sub / "pw").string());
  EXPECT_EQ(o.rdzv.user, "./u");  // a name, not a path
  EXPECT_EQ(o.rdzv.join_timeout, std::chrono::seconds(5));
  // Written as one K=V,... string, the same.
  EXPECT_EQ(ok({"--config", write("program: true\nrdzv_conf: "
                                  "'join_timeout=5,token_file=tok'\n",
                                  "sub/s.yaml")})
                .rdzv.token_file,
            (sub / "tok").string());
  // Printed and loaded from another folder: the same files.
  LaunchOptions again =
      ok({"--config", write(job_yaml(o, true), "other/printed.yaml")});
  EXPECT_EQ(again.rdzv.token_file, o.rdzv.token_file);
  EXPECT_EQ(again.rdzv.key, o.rdzv.key);
  LaunchOptions cli = ok({"--rdzv-conf", "token_file=t", "true"});
  EXPECT_THAT(job_yaml(cli, true),
              HasSubstr("token_file: " + fs::absolute("t").string()));
}

TEST_F(JobFileTest, PrintConfigRoundTrips) {
  std::string f = write(
      "program: ./prog\n"
      "args: [--lr, '0.1', '${local_rank}', '$${KEEP}', 'a b', 'x: y']\n"
      "nproc_per_node: 3\n"
      "max_restarts: 2\n"
      "term_timeout: 0.25\n"
      "log_dir: logs\n"
      "tee: '0:3,1:1'\n"
      "local_ranks_filter: [0, 2]\n"
      "signals_to_handle: [SIGINT, SIGUSR1]\n"
      "rdzv_conf: {join_timeout: 60, last_call_timeout: 5}\n"
      "rdzv_id: r1\n"
      "role: trainer\n"
      "env: {SAFE: 'v ${x}', HF_TOKEN: '${HF_TOKEN}'}\n"
      "hosts: [localhost:3]\n"
      "faults:\n  - kill:rank=1:after=2\n  - stop:rank=0\n",
      "a/job.yaml");
  agent::EnvMap env{{"HF_TOKEN", "hunter2"}, {"x", "X"}};
  LaunchOptions first = ok({"--config", f, "--monitor-interval", "2"}, env);
  std::string yaml = job_yaml(first, /*with_run_id=*/true);
  EXPECT_THAT(yaml, Not(HasSubstr("hunter2")));
  EXPECT_THAT(yaml, HasSubstr("${HF_TOKEN}"));
  // Loaded again from another folder: the same job.
  LaunchOptions again = ok({"--config", write(yaml, "b/printed.yaml")}, env);
  EXPECT_EQ(job_yaml(again, true), yaml);
  EXPECT_EQ(again.agent.entrypoint, first.agent.entrypoint);
  EXPECT_EQ(again.program, (dir_.path() / "a/prog").string());
  EXPECT_EQ(again.program_args[3], "${KEEP}");
  EXPECT_EQ(again.env, first.env);
  EXPECT_EQ(again.env.at("HF_TOKEN"), "hunter2");
  EXPECT_EQ(again.hosts, first.hosts);
  EXPECT_EQ(again.faults, first.faults);
  EXPECT_EQ(again.agent.log_dir, dir_.path() / "a/logs");
  EXPECT_EQ(again.agent.run_id, "r1");
  EXPECT_EQ(again.monitor_interval, std::chrono::seconds(2));
  // job.yaml leaves the run id out, so a rerun gets a fresh log folder.
  EXPECT_THAT(job_yaml(first, false), Not(HasSubstr("rdzv_id")));
  // Flags alone round-trip too.
  LaunchOptions plain = ok({"true"});
  EXPECT_EQ(
      job_yaml(ok({"--config", write(job_yaml(plain, true), "c.yaml")}), true),
      job_yaml(plain, true));
}

// A host narrowed to some GPUs keeps them in a printed job (n2 once came
// back as n2:3, GPUs 0..2 where the job ran on 0, 2 and 3): the printed
// file plans the same job.
TEST_F(JobFileTest, PrintedHostsKeepTheirGpus) {
  auto plan = [](const LaunchOptions& o) {
    std::string p = dry_run_plan(o);
    return p.erase(p.find("  config:"),
                   p.find('\n', p.find("  config:")) - p.find("  config:"));
  };
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"--hosts", "n[1-3]:4", "--exclude", "n2:1"},
           {"--hosts", "n[1-3]", "--nproc-per-node", "4", "--exclude",
            "n2:1@n3:0"},
           {"--hosts", "n[1-3]:4", "--include", "n1@n3:3"},
           {"--hosts", "n[1-3]:4", "--exclude", "n2"}}) {
    SCOPED_TRACE(::testing::PrintToString(args));
    std::vector<std::string> cmd = args;
    cmd.insert(cmd.end(), {"--dry-run", "/bin/true"});
    LaunchOptions first = ok(cmd);
    LaunchOptions again =
        ok({"--config", write(job_yaml(first, true), "p.yaml"), "--dry-run"});
    EXPECT_EQ(again.hosts, first.hosts);
    EXPECT_EQ(plan(again), plan(first));
  }
  LaunchOptions o = ok({"--hosts", "n[1-3]:4", "--exclude", "n2:1", "true"});
  EXPECT_THAT(job_yaml(o, true), HasSubstr("hosts: [n1:4, n2:4, n3:4]"));
  EXPECT_THAT(job_yaml(o, true), HasSubstr("include: n1@n2:0,2,3@n3"));
  EXPECT_THAT(job_yaml(ok({"--hosts", "n[1-2]:4", "true"}), true),
              Not(HasSubstr("include")));
}

// --dry-run of hosts plans each host's workers (it said "1 on this node",
// LOCAL_WORLD_SIZE=1, on a machine that was none of the hosts) and leaves
// MASTER_ADDR to the rendezvous (it showed 127.0.0.1).
TEST_F(JobFileTest, TheDryRunOfHostsPlansEachHostsWorkers) {
  const std::string p = dry_run_plan(ok({"--hosts", "a:2,b:3", "/bin/true"}));
  EXPECT_THAT(p, HasSubstr("workers:   2 on a, 3 on b, world size"));
  EXPECT_THAT(p, HasSubstr("the workers of a "));
  EXPECT_THAT(p, HasSubstr("LOCAL_WORLD_SIZE=2\n"));
  EXPECT_THAT(p, HasSubstr("worker 1 (local rank 1)"));
  EXPECT_THAT(p, Not(HasSubstr("worker 2 ")));
  EXPECT_THAT(p, HasSubstr("MASTER_ADDR=<group rank 0's address, decided at "
                           "rendezvous>"));
  // As the launch counts (workers_on()): a given --nproc-per-node over
  // slots, included GPUs over both; one host's world is its own count.
  EXPECT_THAT(dry_run_plan(ok(
                  {"--hosts", "a,b:3", "--nproc-per-node", "4", "/bin/true"})),
              HasSubstr("workers:   4 on a, 4 on b,"));
  EXPECT_THAT(dry_run_plan(ok({"--hosts", "a:4,b:4", "--include", "a:0,1@b",
                               "--nproc-per-node", "3", "/bin/true"})),
              HasSubstr("workers:   2 on a, 3 on b,"));
  EXPECT_THAT(dry_run_plan(ok({"--hosts", "a:3", "/bin/true"})),
              HasSubstr("workers:   3 on a, world size 3\n"));
  EXPECT_THAT(dry_run_plan(ok({"--hosts", "a:4,b", "--nproc-per-node", "cpu",
                               "/bin/true"})),
              HasSubstr("workers:   one per CPU of a, one per CPU of b,"));
  // One host that counts its own: nothing of this machine's count shows.
  const std::string cpu =
      dry_run_plan(ok({"--hosts", "a", "--nproc-per-node", "cpu", "true"}));
  EXPECT_THAT(cpu, HasSubstr("workers:   one per CPU of a, world size <the "
                             "CPU count of the host that runs it>\n"));
  EXPECT_THAT(cpu, HasSubstr("LOCAL_WORLD_SIZE=<the CPU count of the host "
                             "that runs it>\n"));
  EXPECT_THAT(cpu, HasSubstr("OMP_NUM_THREADS=1 (when the host runs more "
                             "than one)\n"));
  // Included GPUs count on a head that sees no CUDA device (it said "not
  // resolved here").
  EXPECT_THAT(dry_run_plan(ok({"--hosts", "a:4", "--include", "a:0,1",
                               "--nproc-per-node", "gpu", "true"})),
              HasSubstr("workers:   2 on a, world size 2\n"));
  // One remote host is group rank 0 of its own rendezvous: its address,
  // not this machine's default.
  EXPECT_THAT(dry_run_plan(ok({"--hosts", "a:2", "true"})),
              HasSubstr("MASTER_ADDR=<group rank 0's address, decided at "
                        "rendezvous>"));
  // ...unless it is this machine: one node here, no head.
  const std::string here = dry_run_plan(ok({"--hosts", "localhost:2", "true"}));
  EXPECT_THAT(here, HasSubstr("hosts:     localhost:2 (this machine: its "
                              "agent runs here, no head)\n"));
  EXPECT_THAT(here, HasSubstr("MASTER_ADDR=127.0.0.1\n"));
  EXPECT_THAT(here, Not(HasSubstr("store hosted here")));
  // Static nodes are given their master.
  EXPECT_THAT(dry_run_plan(ok({"--nnodes", "2", "--node-rank", "1",
                               "--master-addr", "10.0.0.5", "/bin/true"})),
              HasSubstr("MASTER_ADDR=10.0.0.5\n"));
  // An IPv6 store address is bracketed, as --rdzv-endpoint takes it.
  EXPECT_THAT(dry_run_plan(ok({"--nnodes", "2", "--rdzv-backend", "c10d",
                               "--rdzv-endpoint", "[::1]:29400", "/bin/true"})),
              HasSubstr("store at [::1]:29400\n"));
}

// A printed job over hosts can be rerun on fewer hosts (it held nnodes:
// 3, which --exclude then contradicted), and keeps --nproc-per-node gpu for
// each host to count (it held the head's count).
TEST_F(JobFileTest, APrintedHostsJobCanBeRetargeted) {
  LaunchOptions o = ok({"--hosts", "n[1-3]", "--nproc-per-node", "gpu",
                        "--dry-run", "/bin/true"});
  const std::string printed = job_yaml(o, true);
  EXPECT_THAT(printed, Not(HasSubstr("nnodes")));
  EXPECT_THAT(printed, HasSubstr("nproc_per_node: gpu"));
  // Not given: the hosts' slots count, so it is left out (a printed 1
  // overrode them on the rerun), hosts added on the rerun too.
  EXPECT_THAT(job_yaml(ok({"--hosts", "n[1-2]:4", "true"}), true),
              Not(HasSubstr("nproc_per_node")));
  // A secret's value stays out of export (it reached every host's
  // job.yaml); NAME alone forwards it from the launching environment.
  const std::string exported = job_yaml(
      ok({"--hosts", "a,b", "-x", "HF_TOKEN=abc", "-x", "A=1", "true"}), true);
  // A bare secret name, forwarded when set, stays as given.
  EXPECT_THAT(job_yaml(ok({"--hosts", "a,b", "-x", "HF_TOKEN", "true"}), true),
              HasSubstr("export: [HF_TOKEN]\n"));
  EXPECT_THAT(exported, HasSubstr("export: [\"HF_TOKEN=${HF_TOKEN}\", A=1]"));
  EXPECT_THAT(exported, Not(HasSubstr("abc")));
  // The rerun takes it from its environment, and names it when unset (a
  // bare NAME was dropped silently).
  EXPECT_THAT(
      ok({"--config", write(exported), "--dry-run"}, {{"HF_TOKEN", "xyz"}})
          .remote.exports,
      ::testing::Contains("HF_TOKEN=xyz"));
  EXPECT_THAT(error(exported, {}, {"--dry-run"}), HasSubstr("HF_TOKEN"));
  // The agents run the program and log inside --chdir: the printed paths
  // are theirs (they were this folder's).
  const std::string moved =
      job_yaml(ok({"--hosts", "a,b", "--chdir", "/srv/job", "--log-dir", "logs",
                   "--no-python", "./run.sh"}),
               true);
  EXPECT_THAT(moved, HasSubstr("program: /srv/job/run.sh\n"));
  EXPECT_THAT(moved, HasSubstr("log_dir: /srv/job/logs\n"));
  EXPECT_THAT(moved, HasSubstr("chdir: /srv/job\n"));
  // What dlaunch reads is the launch folder's, also once a single node's
  // agent entered --chdir (env_file named the --chdir folder's).
  LaunchOptions entered = ok({"--no-python", "true"});
  entered.launch_dir = "/launch";
  entered.remote.chdir = "/srv/job";
  entered.remote.env_file = "vars.env";
  entered.agent.log_dir = "logs";
  const std::string inside = job_yaml(entered, true);
  EXPECT_THAT(inside, HasSubstr("env_file: /launch/vars.env\n"));
  EXPECT_THAT(inside, HasSubstr("log_dir: /srv/job/logs\n"));
  entered.remote.env_file.clear();  // the dry run reads it (not there)
  EXPECT_THAT(dry_run_plan(entered), HasSubstr("logs:      /srv/job/logs/"));
  // A script run by the interpreter is a path without a '/' too (it
  // stayed train.py, a PATH lookup on the rerun).
  EXPECT_THAT(
      job_yaml(ok({"--hosts", "a,b", "train.py"}), true),
      HasSubstr("program: " +
                (std::filesystem::current_path() / "train.py").string()));
  const std::string plain = job_yaml(ok({"true"}), true);
  EXPECT_THAT(plain, Not(HasSubstr("nproc_per_node")));
  EXPECT_THAT(dry_run_plan(ok({"--config", write(plain, "plain.yaml"),
                               "--hosts", "a:4,b:2", "--dry-run"})),
              HasSubstr("workers:   4 on a, 2 on b,"));
  LaunchOptions again = ok(
      {"--config", write(printed, "h.yaml"), "--exclude", "n3", "--dry-run"});
  EXPECT_EQ(again.hosts.size(), 2u);
  EXPECT_EQ(again.nproc_per_node_spec, "gpu");
  // A given --nnodes is the user's, printed as given.
  EXPECT_THAT(
      job_yaml(ok({"--hosts", "n[1-3]", "--nnodes", "2:3", "true"}), true),
      HasSubstr("nnodes: 2:3"));
}

TEST_F(JobFileTest, SecretsNeverAppearInPrintedOutput) {
  std::string f = write(
      "program: sh\nenv:\n  WANDB_API_KEY: k3y\n  DB_PASSWORD: pw0rd\n"
      "  MY_SECRET: s3cret\n  PLAIN: visible\n");
  LaunchOptions o = ok({"--config", f});
  EXPECT_EQ(o.env.at("DB_PASSWORD"), "pw0rd");  // the workers get it
  for (const std::string& out : {job_yaml(o, true), dry_run_plan(o)}) {
    for (const char* secret : {"k3y", "pw0rd", "s3cret"}) {
      EXPECT_THAT(out, Not(HasSubstr(secret)));
    }
    EXPECT_THAT(out, HasSubstr("visible"));
  }
  // By whole words: common settings that merely contain one print as they
  // are, so that the printed job reruns without them in the environment.
  for (const char* name :
       {"HF_TOKEN", "auth_token", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY",
        "WANDB_API_KEY", "MY_APIKEY", "SSH_PRIVATE_KEY", "GCP_CREDENTIALS",
        "PGPASSWORD", "NPM_CONFIG__AUTHTOKEN", "APITOKEN", "DJANGO_SECRETKEY",
        "GITHUB_PAT", "DB_PASS", "MYSQL_PWD"}) {
    EXPECT_TRUE(is_secret_name(name)) << name;
  }
  for (const char* name :
       {"NCCL_DEBUG", "TOKENIZERS_PARALLELISM", "MAX_TOKENS", "AUTHOR",
        "KEY_COLUMN", "PWD", "SSH_AUTH_SOCK", "PASSES", "PATH"}) {
    EXPECT_FALSE(is_secret_name(name)) << name;
  }
}

TEST_F(JobFileTest, DryRunShowsWhatOnlyARendezvousDecides) {
  std::string f = write(
      "program: sh\nargs: [-c, 'echo ${local_rank}']\nnproc_per_node: "
      "2\nhosts: [n1:2, n2:2]\nfaults: [kill:rank=1]\n");
  std::string plan = dry_run_plan(ok({"--config", f, "--dry-run"}));
  EXPECT_THAT(plan, HasSubstr("nothing was started"));
  EXPECT_THAT(plan, HasSubstr("n1:2, n2:2"));
  EXPECT_THAT(plan, HasSubstr("one agent each, started with --launcher ssh"));
  EXPECT_THAT(plan, HasSubstr("WORLD_SIZE=<decided at rendezvous>"));
  EXPECT_THAT(plan, HasSubstr("LOCAL_RANK=1\n"));
  EXPECT_THAT(plan, HasSubstr("command: sh -c 'echo 1'"));
  EXPECT_THAT(plan, HasSubstr("fault:     kill:rank=1 (SIGKILL to rank 1)"));
  EXPECT_THAT(plan, HasSubstr("MASTER_PORT=<a free port"));
}

TEST_F(JobFileTest, DryRunLeavesTheGpuCountToAHostThatHasGpus) {
  // Fake GPU counters, as dlaunch-cuda-devices answers.
  write_file(dir_ / "no-gpus", "#!/bin/sh\necho 0\n", 0755);
  write_file(dir_ / "two-gpus", "#!/bin/sh\necho 2\n", 0755);
  std::string f = write("program: sh\nnproc_per_node: gpu\n");
  agent::EnvMap none{{"DLAUNCH_CUDA_DEVICES", (dir_ / "no-gpus").string()}};
  std::string plan = dry_run_plan(ok({"--config", f, "--dry-run"}, none));
  EXPECT_THAT(plan, HasSubstr("one per visible CUDA device"));
  EXPECT_THAT(plan, HasSubstr("not resolved here: no CUDA device is visible"));
  EXPECT_THAT(plan, HasSubstr("LOCAL_WORLD_SIZE=<the GPU count of the host"));
  // A run, or --print-config, needs the real count.
  EXPECT_THAT(error("program: sh\nnproc_per_node: gpu\n", none),
              HasSubstr("job.yaml:2:17: nproc_per_node gpu: no CUDA device"));
  EXPECT_THAT(error("program: sh\nnproc_per_node: gpu\n", none,
                    {"--dry-run", "--print-config"}),
              HasSubstr("no CUDA device"));
  agent::EnvMap two{{"DLAUNCH_CUDA_DEVICES", (dir_ / "two-gpus").string()}};
  plan = dry_run_plan(ok({"--config", f, "--dry-run"}, two));
  EXPECT_THAT(plan, HasSubstr("workers:   2 on this node"));
  EXPECT_THAT(plan, HasSubstr("LOCAL_WORLD_SIZE=2\n"));
}

TEST_F(JobFileTest, EveryExampleInConfigsLoadsAndDryRuns) {
  int examples = 0;
  for (const auto& entry :
       fs::directory_iterator(fs::path(DLAUNCH_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++examples;
    SCOPED_TRACE(entry.path().string());
    std::string text = testing::read_file(entry.path());
    EXPECT_EQ(text.rfind("# ", 0), 0u) << "a comment header first";
    LaunchOptions o = ok({"--config", entry.path().string(), "--dry-run"},
                         {{"DLAUNCH_BIN", DLAUNCH_BIN_DIR}});
    EXPECT_EQ(o.mode, LaunchOptions::Mode::kDryRun);
    EXPECT_THAT(dry_run_plan(o), HasSubstr("nothing was started"));
  }
  EXPECT_GE(examples, 5);
}

}  // namespace
}  // namespace dlaunch::launcher
