#!/usr/bin/env bash
# tests/slurm/cluster.sh - a throw-away single-node Slurm cluster on localhost, for the tests.
#
#   cluster.sh install     apt-get install slurm-wlm and munge if they are missing (needs root)
#   cluster.sh start DIR   start munged, slurmctld and slurmd with every file they write under DIR
#   cluster.sh stop DIR    cancel the cluster's jobs, then stop exactly the daemons `start DIR` started
#
# To play with it by hand:
#   d=$(mktemp -d) && tests/slurm/cluster.sh start "$d" && export SLURM_CONF=$d/slurm.conf
#   sinfo; sbatch ...; tests/slurm/cluster.sh stop "$d"
#
# The cluster is the caller's own: its own munge key and socket, its own ports, its own state, and
# nothing under /etc or /run is touched, so it never meets the machine's Slurm (if it has one).  The
# daemons' PIDs are written to DIR/pids when each starts; `stop` kills those PIDs and no others.
# Why each slurm.conf setting: tests/slurm/slurm.conf.in and docs/slurm.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CPUS=${SLURM_TEST_CPUS:-8}          # schedulable CPUs of the one node (more than the machine has)

say() { echo "cluster: $*"; }
die() { echo "cluster: error: $*" >&2; exit 1; }

# Poll until a command succeeds: the daemons start in well under a second, so poll fast, but give
# up with the daemon's log rather than hang a CI run.
wait_for() {
    local what=$1 seconds=$2 log=$3; shift 3
    local tries=$(( seconds * 5 ))
    until "$@" >/dev/null 2>&1; do
        (( tries-- > 0 )) || { tail -n 20 "$log" >&2 || true; die "$what not ready after ${seconds}s (log: $log)"; }
        sleep 0.2
    done
}

# A TCP port on localhost that nothing listens on, from $1 upwards (a refused connection = free).
free_port() {
    local port=$1
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        port=$(( port + 1 ))
    done
    echo "$port"
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurm-wlm)
    command -v munged >/dev/null || missing+=(munge)
    if (( ${#missing[@]} == 0 )); then
        say "slurm and munge already installed"
        return
    fi
    [[ $(id -u) == 0 ]] || die "installing ${missing[*]} needs root (or install them yourself)"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The package lists of a fresh machine may be missing or stale: update only when needed (and
    # show apt's messages only then).
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
}

# Start a daemon in the foreground of a background job, so that $! is the daemon itself, and
# record its PID at once (a failure further on must still be able to stop it).
start_daemon() {
    local dir=$1 name=$2; shift 2
    "$@" </dev/null >"$dir/$name.out" 2>&1 &
    echo "$name $!" >>"$dir/pids"
}

start_munge() {
    local dir=$1 m=$1/munge
    # munged runs as the munge user and refuses a key or socket directory that others could write;
    # everyone must be able to reach the socket, so the directories on its path are 755.
    chmod 755 "$dir"
    install -d -m 755 -o munge -g munge "$m"
    mungekey --create --keyfile="$m/munge.key"
    chown munge:munge "$m/munge.key"
    start_daemon "$dir" munged setpriv --reuid=munge --regid=munge --init-groups \
        munged --foreground --socket="$m/munge.socket" --key-file="$m/munge.key" \
        --log-file="$m/munged.log" --pid-file="$m/munged.pid" --seed-file="$m/munged.seed"
    wait_for munged 10 "$dir/munged.out" bash -c "munge -n -S '$m/munge.socket' | unmunge -S '$m/munge.socket'"
}

write_conf() {
    local dir=$1 host ctld_port slurmd_port first_job_id
    host=$(hostname -s)
    ctld_port=$(free_port 6817)
    slurmd_port=$(free_port $(( ctld_port + 1 )))
    # a block of 100 job ids per second, recycled after a week (slurm.conf.in says why)
    first_job_id=$(( $(date +%s) % 600000 * 100 + 1 ))
    sed -e "s|@HOST@|$host|g" -e "s|@STATE@|$dir|g" -e "s|@CPUS@|$CPUS|g" \
        -e "s|@CTLD_PORT@|$ctld_port|g" -e "s|@SLURMD_PORT@|$slurmd_port|g" \
        -e "s|@FIRST_JOB_ID@|$first_job_id|g" "$HERE/slurm.conf.in" >"$dir/slurm.conf"
    say "$host, $CPUS CPUs, slurmctld port $ctld_port, slurmd port $slurmd_port"
}

node_idle() { [[ $(sinfo -h -o %t) == idle ]]; }

start_cluster() {
    local dir=$1
    [[ $(id -u) == 0 ]] || die "the test cluster runs its daemons as root"
    [[ -d $dir && ! -e $dir/pids ]] || die "$dir: give an existing directory that holds no cluster yet"
    # A fresh state directory each time: a node remembered from an earlier run comes back drained.
    mkdir -p "$dir/ctld" "$dir/slurmd"
    : >"$dir/pids"
    start_munge "$dir"
    write_conf "$dir"
    export SLURM_CONF=$dir/slurm.conf
    start_daemon "$dir" slurmctld slurmctld -D -f "$SLURM_CONF"
    wait_for slurmctld 30 "$dir/slurmctld.out" scontrol ping
    start_daemon "$dir" slurmd slurmd -D -f "$SLURM_CONF"
    wait_for "the node" 30 "$dir/slurmd.out" node_idle
    say "up: $(sinfo -h -o '%P %D node(s) %c CPUs %t') (SLURM_CONF=$SLURM_CONF)"
}

# Is PID still the process named NAME?  (A PID can be reused after its process ended.)
is_running() { [[ $(cat "/proc/$2/comm" 2>/dev/null) == "$1" ]]; }

stop_pid() {
    local name=$1 pid=$2 tries=50
    is_running "$name" "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    while is_running "$name" "$pid" && (( tries-- > 0 )); do sleep 0.2; done
    if is_running "$name" "$pid"; then
        say "$name ($pid) ignored SIGTERM for 10 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

cancel_jobs() {
    local tries=50
    scancel --quiet --user="$(id -un)" 2>/dev/null || return 0
    while [[ -n $(squeue -h -o %i 2>/dev/null) ]] && (( tries-- > 0 )); do sleep 0.2; done
}

# MPICH keeps a job's shared memory in /dev/shm/mpich_*, and a job killed by MPI_Abort never
# removes it.  Remove those created since the cluster started that no process has mapped any more.
remove_leaked_shm() {
    local since=$1 f
    for f in /dev/shm/mpich_*; do
        [[ -f $f && $f -nt $since ]] || continue
        grep -qsF "$f" /proc/[0-9]*/maps || rm -f "$f"
    done
}

stop_cluster() {
    local dir=$1 name pid
    [[ -f $dir/pids ]] || return 0
    export SLURM_CONF=$dir/slurm.conf
    # Jobs first, while slurmd can still end their steps; then the daemons, newest first.
    if [[ -f $SLURM_CONF ]]; then
        cancel_jobs
        remove_leaked_shm "$SLURM_CONF"
    fi
    tac "$dir/pids" | while read -r name pid; do
        stop_pid "$name" "$pid"
    done
    rm -f "$dir/pids"
    say "stopped"
}

case ${1:-} in
    install) install_packages ;;
    start) start_cluster "${2:?usage: cluster.sh start DIR}" ;;
    stop) stop_cluster "${2:?usage: cluster.sh stop DIR}" ;;
    *) die "usage: cluster.sh install | start DIR | stop DIR" ;;
esac
