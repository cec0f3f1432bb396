#!/usr/bin/env bash
# Multi-host launch from one command, timed (issue 10's target): 8 "hosts"
# (127.0.0.2-9) behind an sshd of this script's own, one `true` worker
# each, from the head's command to the job done, pre-flight included, for
# --launcher ssh and --launcher pdsh (-R ssh), next to two rounds of
# `pdsh -R ssh -w HOSTS true` (a pre-flight and a start) and OpenMPI's
# `mpirun` over the same ssh (one orted per host, the launcher horovodrun
# uses), plus --launcher ssh shipping itself to every host
# (--remote-dlaunch pointing at nothing; into this script's own
# XDG_CACHE_HOME, so after the warmup that row runs the cached copies).
# hyperfine medians; note the load average it prints.
# Usage: bench/multihost_launch.sh [BUILD_DIR] [RUNS]
set -euo pipefail
build=${1:-build}
runs=${2:-10}
dlaunch=$(realpath "$build/bin/dlaunch")
dir=$(mktemp -d /tmp/dlaunch-bench-sshd.XXXXXX)
trap 'kill $(cat "$dir/sshd.pid" 2>/dev/null) 2>/dev/null; rm -rf "$dir"' EXIT
ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$dir/user_key"
cp "$dir/user_key.pub" "$dir/authorized_keys"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
{
  echo "Port $port"
  for i in 2 3 4 5 6 7 8 9; do echo "ListenAddress 127.0.0.$i"; done
  echo "HostKey $dir/host_key"
  echo "AuthorizedKeysFile $dir/authorized_keys"
  echo "PidFile $dir/sshd.pid"
  printf 'UsePAM no\nStrictModes no\nPasswordAuthentication no\n'
  printf 'PermitRootLogin yes\nMaxStartups 100\nMaxSessions 100\nLogLevel ERROR\n'
  echo "AcceptEnv XDG_CACHE_HOME"
} > "$dir/sshd_config"
mkdir -p /run/sshd
/usr/sbin/sshd -f "$dir/sshd_config"
for _ in $(seq 100); do
  [ -s "$dir/sshd.pid" ] && break
  sleep 0.05
done
opts="-p $port -i $dir/user_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
hosts=127.0.0.[2-9]
export PDSH_SSH_ARGS_APPEND="$opts"
sshargs="-i $dir/user_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
mpi=()
if command -v mpirun >/dev/null; then
  mpi=(-n "mpirun over ssh (8 orted)"
    "mpirun --allow-run-as-root --host 127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5,127.0.0.6,127.0.0.7,127.0.0.8,127.0.0.9 -np 8 --mca plm_rsh_args '-p $port $sshargs' true")
fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
hyperfine -N --warmup 1 --runs "$runs" --export-json "$dir/out.json" \
  -n "dlaunch --launcher ssh" \
  "$dlaunch --launcher ssh --hosts $hosts --local-addr 127.0.0.1 --ssh-port $port --ssh-args '$sshargs' true" \
  -n "dlaunch --launcher pdsh (-R ssh)" \
  "env PDSH_RCMD_TYPE=ssh $dlaunch --launcher pdsh --hosts $hosts --local-addr 127.0.0.1 true" \
  -n "dlaunch --launcher ssh, shipped (cached)" \
  "$dlaunch --launcher ssh --hosts $hosts --local-addr 127.0.0.1 --ssh-port $port --ssh-args '$sshargs -o SetEnv=XDG_CACHE_HOME=$dir/cache' --remote-dlaunch /nonexistent/dlaunch true" \
  "${mpi[@]}" \
  -n "2x pdsh -R ssh true" \
  "sh -c 'pdsh -R ssh -w $hosts true && pdsh -R ssh -w $hosts true'"
python3 - "$dir/out.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
for x in r:
    print(f"{x['command']:40s} median {x['median']*1e3:8.1f} ms")
base = r[-1]["median"]
for x in r[:-1]:
    print(f"{x['command']:40s} {x['median']/base:.2f}x two pdsh rounds")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
