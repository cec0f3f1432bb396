#include <sstream>

#include "launcher/cli.h"
#include "launcher/flags.h"

namespace dlaunch::launcher {
namespace {

constexpr std::string_view kHead = R"(NAME
    dlaunch - start, watch and restart a group of distributed workers
    (a torchrun equivalent)

SYNOPSIS
    dlaunch [options] PROG [ARGS...]
    dlaunch [options] -m MODULE [ARGS...]
    dlaunch --config JOB.yaml [options] [PROG [ARGS...]]

DESCRIPTION
    Starts --nproc-per-node copies of PROG on this node, each with torchrun's
    worker environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    GROUP_RANK, ROLE_*, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), so
    PyTorch programs using init_process_group() run unchanged. PROG ending
    in .py, and -m MODULE, run under python3 -u; anything else is executed
    directly. A literal ${local_rank} in ARGS becomes the worker's local rank.

    Every output line of a worker is shown whole, prefixed "[default0]:"
    (role name and local rank). When a worker fails, the others are stopped
    (SIGTERM, SIGKILL after --term-timeout) and the group restarts while
    --max-restarts allows. Each worker runs in its own process group and
    dies with dlaunch, children included.
)";

constexpr std::string_view kTail = R"(
JOB FILE FORMAT
    A YAML mapping: program, args (a list), env (a mapping; values are
    strings), hosts (a list of NAME or NAME:SLOTS, a hostlist, or a
    hostfile path; see HOSTS), and every option above under its key, the
    long name with '_' (max_restarts: 3; lists as lists; rdzv_conf:
    {join_timeout: 60}; faults: a list of --fault specs). Each setting
    comes from its flag, else its PET_ variable, else the file (faults add
    up from all of them); a program on the command line replaces program
    and args.
    ${VAR} and ${VAR:-default} expand from the environment ($${ is a
    literal ${); relative paths resolve against the file's folder
    (rdzv_conf's token_file, cacert, cert, key, password_file too). A bad
    file is reported as FILE:LINE:COLUMN and nothing starts (exit 2).
    Secret-looking env names (TOKEN, SECRET, PASSWORD, API_KEY, ...) are
    written as ${NAME} by --print-config and job.yaml. Examples: configs/.

ENVIRONMENT
    PET_<KEY>
        Every flag that configures the job may come from a PET_ variable
        named after its key in capitals (--nproc-per-node: PET_NPROC_PER_NODE);
        the command line wins.
    DLAUNCH_FAULTS
        More --fault specs, comma-, ';'- or space-separated.
    DLAUNCH_COMM_FAULTS
        Read by comm in each worker: fail:rank=R:op=OP:call=N (the N-th
        call of OP throws), exit:...[:code=C], kill:...[:signal=KILL], or
        stall:...[:for=SECONDS] (blocks; default for ever), each with
        [:attempt=K] (TORCHELASTIC_RESTART_COUNT, default 0).
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
        Console prefix with ${role_name}, ${local_rank} and ${rank}.

    Every flag may be spelled with '-' or '_' (--max-restarts,
    --max_restarts). Durations are seconds: finite, from 0.001 to the
    flag's maximum (604800, 7 days, unless said otherwise).

EXIT STATUS
    0      every worker of the last attempt exited 0
    N      the root-cause worker's exit code (torchrun always exits 1)
    128+S  the root-cause worker died of signal S, or dlaunch was stopped
           by signal S
    1      rendezvous or another dlaunch error
    2      a bad flag or value
    127    the program does not exist or is not executable (checked
           before any worker starts: no restart spent), or a worker could
           not be started

EXAMPLES
    dlaunch --nproc-per-node 4 train.py --epochs 3
    dlaunch --config configs/sgd_cpu.yaml --max-restarts 2 --dry-run
    dlaunch --nproc-per-node gpu --max-restarts 3 --log-dir logs -t 3 train.py
    dlaunch --nproc-per-node 8 --no-python ./worker --shard ${local_rank}
)";

// The sections of the options, in order, with their titles.
constexpr std::pair<std::string_view, std::string_view> kSections[] = {
    {"WORKERS", "WORKERS"},
    {"PROGRAMS", "PROGRAMS"},
    {"OUTPUT", "OUTPUT"},
    {"SIGNALS", "SIGNALS"},
    {"RENDEZVOUS", "RENDEZVOUS"},
    {"HOSTS", "HOSTS"},
    {"RELIABILITY", "RELIABILITY"},
    {"JOB FILES", "JOB FILES"},
    {"OTHER", "OTHER"},
};

// `text` wrapped at 78 columns, each line indented by 8 spaces.
std::string wrap(const std::string& text) {
  std::istringstream words(text);
  std::string out, line, word;
  while (words >> word) {
    if (!line.empty() && 8 + line.size() + 1 + word.size() > 78) {
      out += "        " + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += "        " + line + "\n";
  return out;
}

// "-m, --module" or "--rdzv-id, --run-id ID": short spellings first, the
// '_' twins left out (the page says every flag has them).
std::string title(const FlagSpec& f) {
  std::string shorts, longs;
  for (const std::string& s : spellings(f)) {
    if (s.find('_') != std::string::npos) continue;
    std::string& to = s[1] == '-' ? longs : shorts;
    to += (to.empty() ? "" : ", ") + s;
  }
  std::string t = shorts.empty() ? longs : shorts + ", " + longs;
  if (!f.placeholder.empty()) t += " " + std::string(f.placeholder);
  return "    " + t + "\n";
}

std::string make_help() {
  std::string out(kHead);
  for (const auto& [section, heading] : kSections) {
    std::string body;
    for (const FlagSpec& f : flags()) {
      if (f.section != section) continue;
      std::string text(f.help);
      if (!f.default_text.empty()) {
        text += " Default: " + std::string(f.default_text) + ".";
      }
      if (f.type == ValueType::kSeconds && f.max_seconds != kMaxSeconds) {
        text += " At most " +
                format_seconds(std::chrono::milliseconds(
                    static_cast<int64_t>(f.max_seconds * 1e3))) +
                ".";
      }
      body += title(f) + wrap(text);
    }
    if (!body.empty()) out += "\n" + std::string(heading) + "\n" + body;
  }
  out += kTail;
  return out;
}

}  // namespace

const std::string& help_text() {
  static const std::string kText = make_help();
  return kText;
}

}  // namespace dlaunch::launcher
