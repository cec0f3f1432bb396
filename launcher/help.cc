#include "launcher/cli.h"

namespace dlaunch::launcher {

const std::string& help_text() {
  static const std::string kText = R"(NAME
    dlaunch - start, watch and restart a group of distributed workers
    (a torchrun equivalent)

SYNOPSIS
    dlaunch [options] PROG [ARGS...]
    dlaunch [options] -m MODULE [ARGS...]

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

WORKERS
    --nproc-per-node, --nproc_per_node N|cpu|gpu|auto
        Workers on this node (default 1). cpu: one per CPU; gpu: one per
        visible CUDA device; auto: gpu if any, else cpu.
    --max-restarts N
        Restarts of the whole group after a failure (default 0).
    --role NAME
        Role name (ROLE_NAME, console prefix; default "default").
    --rdzv-id, --run-id ID
        Run id (TORCHELASTIC_RUN_ID, log folder; default random).
    --master-addr HOST
        MASTER_ADDR (default 127.0.0.1).
    --master-port PORT
        MASTER_PORT (default: a free port, new for every restart).
    --term-timeout SECONDS
        Grace period between SIGTERM (or a forwarded signal) and SIGKILL
        (default 30).

PROGRAMS
    -m, --module
        Run PROG as a Python module (python3 -u -m PROG).
    --no-python
        Execute PROG directly, even when it ends in .py.
    --python PATH
        Interpreter for .py programs and modules (default $PYTHON, else
        python3).

OUTPUT
    --log-dir DIR
        Write logs to DIR/RUN_ID/attempt_K/LOCAL_RANK/{stdout,stderr}.log
        and the run summary to DIR/RUN_ID/summary.json.
    -r, --redirects V
        Streams sent only to the log files: 0 none, 1 stdout, 2 stderr,
        3 both, or per local rank like 0:3,1:0 (default 0).
    -t, --tee V
        Streams sent to the log files and the console; same values.
    --local-ranks-filter R[,R...]
        Show only these local ranks on the console (files keep all).
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
        Console prefix with ${role_name}, ${local_rank} and ${rank}.

SIGNALS
    --signals-to-handle LIST
        Signals that stop the job (default SIGTERM,SIGINT,SIGHUP,SIGQUIT):
        forwarded to every worker's process group, SIGKILL after
        --term-timeout, then dlaunch exits 128+signal. A second one kills
        at once. SIGUSR1 and SIGUSR2 are forwarded and the job goes on.

RENDEZVOUS (one node for now)
    --standalone            Host the rendezvous store locally (default on
                            one node without --rdzv-endpoint).
    --nnodes 1, --node-rank 0, --rdzv-backend static|c10d,
    --rdzv-endpoint HOST:PORT, --rdzv-conf K=V,...
                            Accepted as torchrun does.
    --monitor-interval S, --start-method M
                            Accepted for compatibility; dlaunch detects
                            exits through events, without polling.

    Every flag may be spelled with '-' or '_' and may come from a
    PET_<FLAG> variable (PET_NPROC_PER_NODE=4); the command line wins.

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
    dlaunch --nproc-per-node gpu --max-restarts 3 --log-dir logs -t 3 train.py
    dlaunch --nproc-per-node 8 --no-python ./worker --shard ${local_rank}
)";
  return kText;
}

}  // namespace dlaunch::launcher
