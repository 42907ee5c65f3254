#!/usr/bin/env bash
# tests/slurm/cluster.sh - a throw-away Slurm cluster of NODES nodes on this one machine, for the tests.
#
#   cluster.sh install          apt-get install slurm-wlm, munge, iproute2 if they are missing (root)
#   cluster.sh start DIR        start munged, slurmctld and one slurmd per node, every file under DIR
#   cluster.sh stop DIR         cancel the cluster's jobs, stop its daemons, remove its namespaces
#   cluster.sh kill-node DIR N  kill every process of node N (its slurmd, its job steps, its ranks)
#   cluster.sh kill-ranks DIR N kill the training ranks of node N (hpcpar processes), nothing else
#   cluster.sh cut-link DIR N   take node N off the network, its processes left running
#
# Each node is a Linux network namespace with its own address on a private bridge, and runs its
# slurmd in a UTS namespace of its own (hostname node1, node2, ...) and a mount namespace with a
# /dev/shm and /etc/hosts of its own.  slurmctld runs in one more namespace, the "switch": it holds
# the bridge and the controller's address.  Nothing is added to the machine's own network
# namespace, so the cluster's traffic reaches only its own namespaces and nothing reaches it from
# outside.  Slurm's commands must run in the switch namespace: `start` writes wrappers for them into
# DIR/bin (put it first on PATH).
#
# To play with it by hand:
#   d=$(mktemp -d) && chmod 755 "$d" && tests/slurm/cluster.sh start "$d" && export PATH=$d/bin:$PATH
#   sinfo; sbatch ...; tests/slurm/cluster.sh stop "$d"
#
# The cluster is the caller's own: its own munge key and socket, its own namespaces (named after DIR),
# its own state, and nothing under /etc is touched, so it never meets the machine's Slurm (if it has
# one).  `ip netns add` leaves a name in /run/netns per namespace; `stop` removes them.  The daemons'
# PIDs are written to DIR/pids when each starts; `stop` kills those PIDs, then whatever still runs
# inside the cluster's namespaces, and no other process.
# Why each slurm.conf setting: tests/slurm/slurm.conf.in and docs/slurm.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODES=${SLURM_TEST_NODES:-2}        # nodes of the cluster (2 to 4 on a small machine)
CPUS=${SLURM_TEST_CPUS:-8}          # schedulable CPUs per node (more than the machine has)
SUBNET=10.199.0                     # private: it exists only inside the cluster's namespaces
CTLD_ADDR=$SUBNET.1                 # the switch namespace, on the bridge
CLIENTS=(sbatch srun salloc scancel squeue scontrol sinfo)

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

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurm-wlm)
    command -v munged >/dev/null || missing+=(munge)
    command -v ip >/dev/null || missing+=(iproute2)        # the namespaces, the bridge, the veths
    if (( ${#missing[@]} == 0 )); then
        say "slurm, munge and iproute2 already installed"
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

# --- names -------------------------------------------------------------------------------------

# The namespaces are named after DIR's full path (a checksum of it), so two clusters never share one;
# DIR/namespaces lists the ones a cluster made, for `stop`.
ns_prefix() { echo "hpcpar-$(printf '%s' "$1" | md5sum | cut -c1-8)"; }
switch_ns() { echo "$(ns_prefix "$1")-switch"; }
node_ns() { echo "$(ns_prefix "$1")-node$2"; }
node_addr() { echo "$SUBNET.$(( 10 + $1 ))"; }

# --- the network: a bridge in the switch namespace, a veth pair per node -----------------------

make_network() {
    local dir=$1 sw n ns
    sw=$(switch_ns "$dir")
    ip netns add "$sw"
    echo "$sw" >>"$dir/namespaces"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" addr add "$CTLD_ADDR/24" dev br0
    ip -n "$sw" link set br0 up
    for (( n = 1; n <= NODES; n++ )); do
        ns=$(node_ns "$dir" "$n")
        ip netns add "$ns"
        echo "$ns" >>"$dir/namespaces"
        # both ends are created inside the namespaces: no interface ever appears in the machine's own
        ip link add eth0 netns "$ns" type veth peer name "port$n" netns "$sw"
        ip -n "$sw" link set "port$n" master br0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$(node_addr "$n")/24" dev eth0
        ip -n "$ns" link set eth0 up
    done
    # every name of the cluster, for the daemons' own /etc/hosts (MPI looks up the nodes' hostnames)
    {
        echo "127.0.0.1 localhost"
        echo "$CTLD_ADDR ctld"
        for (( n = 1; n <= NODES; n++ )); do echo "$(node_addr "$n") node$n"; done
    } >"$dir/hosts"
}

# in_node DIR NS HOSTNAME CMD...: the command as process NS's hostname HOSTNAME, with a /dev/shm of
# its own (MPI's shared memory between the ranks of one node stays on that node) and /etc/hosts.
in_node() {
    local dir=$1 ns=$2 host=$3
    shift 3
    # exec: in start_daemon's background job $! must become the daemon itself.  nsenter, not
    # `ip netns exec`, which remounts /sys and so hides the cgroup file system slurmd looks for.
    exec nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private \
        "$HERE/cluster.sh" enter "$host" "$dir/hosts" "$@"
}

# (inside the new namespaces) name the node, give it its own files, become the daemon
enter_node() {
    local host=$1 hosts=$2
    shift 2
    hostname "$host"
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm
    mount --bind "$hosts" /etc/hosts
    exec "$@"
}

# --- daemons -----------------------------------------------------------------------------------

# Start a daemon in the foreground of a background job, so that $! is the daemon itself (every
# wrapper above execs), and record its PID at once (a failure further on must still stop it).
start_daemon() {
    local dir=$1 name=$2; shift 2
    "$@" </dev/null >"$dir/$name.out" 2>&1 &
    echo "${name%%-*} $! $name" >>"$dir/pids"
}

start_munge() {
    local dir=$1 m=$1/munge
    # munged runs as the munge user and refuses a key or socket directory that others could write;
    # everyone must be able to reach the socket, so the directories on its path are 755.  One munged
    # serves every node: its socket is a file, which a network namespace does not hide.
    chmod 755 "$dir"
    install -d -m 755 -o munge -g munge "$m"
    mungekey --create --keyfile="$m/munge.key"
    chown munge:munge "$m/munge.key"
    start_daemon "$dir" munged setpriv --reuid=munge --regid=munge --init-groups \
        munged --foreground --socket="$m/munge.socket" --key-file="$m/munge.key" \
        --log-file="$m/munged.log" --pid-file="$m/munged.pid" --seed-file="$m/munged.seed"
    wait_for munged 10 "$dir/munged.out" bash -c "munge -n -S '$m/munge.socket' | unmunge -S '$m/munge.socket'"
}

# slurm.conf: the template, then one line per node and the two partitions
write_conf() {
    local dir=$1 n
    {
        sed -e "s|@CTLD_ADDR@|$CTLD_ADDR|g" -e "s|@STATE@|$dir|g" "$HERE/slurm.conf.in"
        for (( n = 1; n <= NODES; n++ )); do
            echo "NodeName=node$n NodeAddr=$(node_addr "$n") CPUs=$CPUS State=UNKNOWN"
        done
        # jobs run in "test"; a job in "urgent" preempts them (slurm.conf.in: preemption)
        echo "PartitionName=test Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60"
        echo "PartitionName=urgent Nodes=node[1-$NODES] MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
    } >"$dir/slurm.conf"
}

# DIR/bin/<command>: Slurm's command run in the switch namespace, where the controller is reached.
# The wrapper takes DIR/bin off PATH first: a job inherits the caller's PATH (sbatch --export=ALL),
# and inside the job, on a node, srun must be Slurm's own.
# UCX_TLS: the nodes share one kernel, and UCX (the MPICH wheel's network layer) finds that out (one
# boot id) and would move the bytes between "nodes" through shared memory and process_vm_readv,
# never through the network.  TCP only, as between real machines; inside a node MPICH's own shared
# memory still carries the bytes.
write_clients() {
    local dir=$1 sw cmd exe
    sw=$(switch_ns "$dir")
    mkdir -p "$dir/bin"
    for cmd in "${CLIENTS[@]}"; do
        exe=$(command -v "$cmd") || die "no $cmd on PATH"
        cat >"$dir/bin/$cmd" <<EOF
#!/bin/bash
# $cmd of the test cluster in $dir (cluster.sh): run in its switch namespace
PATH=\${PATH//"$dir/bin:"/}
export SLURM_CONF=$dir/slurm.conf UCX_TLS=tcp,self
exec nsenter --net=/run/netns/$sw $exe "\$@"
EOF
        chmod 755 "$dir/bin/$cmd"
    done
}

all_idle() { [[ $("$1/bin/sinfo" -h -o %t | sort -u) == idle ]] && (( $("$1/bin/sinfo" -h -o %D) == NODES )); }

start_cluster() {
    local dir=$1 n
    [[ $(id -u) == 0 ]] || die "the test cluster runs its daemons as root and makes namespaces"
    [[ -d $dir && ! -e $dir/pids ]] || die "$dir: give an existing directory that holds no cluster yet"
    dir=$(cd "$dir" && pwd)
    # A fresh state directory each time: a node remembered from an earlier run comes back drained.
    mkdir -p "$dir/ctld" "$dir/slurmd"
    : >"$dir/pids"
    : >"$dir/namespaces"
    start_munge "$dir"
    make_network "$dir"
    write_conf "$dir"
    write_clients "$dir"
    start_daemon "$dir" slurmctld in_node "$dir" "$(switch_ns "$dir")" ctld slurmctld -D -f "$dir/slurm.conf"
    wait_for slurmctld 30 "$dir/slurmctld.out" "$dir/bin/scontrol" ping
    for (( n = 1; n <= NODES; n++ )); do
        mkdir -p "$dir/slurmd/node$n"
        start_daemon "$dir" "slurmd-node$n" in_node "$dir" "$(node_ns "$dir" "$n")" "node$n" \
            slurmd -D -N "node$n" -f "$dir/slurm.conf"
    done
    wait_for "the nodes" 30 "$dir/slurmd-node1.out" all_idle "$dir"
    say "up: $NODES nodes, $("$dir/bin/sinfo" -h -p test -o '%N %c CPUs each, %t'), partitions test and urgent, addresses $SUBNET.0/24" \
        "(PATH=$dir/bin:\$PATH)"
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
    local dir=$1 tries=50
    "$dir/bin/scancel" --quiet --user="$(id -un)" 2>/dev/null || return 0
    while [[ -n $("$dir/bin/squeue" -h -o %i 2>/dev/null) ]] && (( tries-- > 0 )); do sleep 0.2; done
}

# kill_namespace NS: every process in the network namespace NS (`ip netns pids` lists exactly those).
kill_namespace() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    if [[ -n ${pids// } ]]; then
        # shellcheck disable=SC2086  # a list of PIDs
        kill -KILL $pids 2>/dev/null || true
    fi
}

# kill_node DIR N: node N dies at once, as a machine that loses power: its slurmd, its steps, its ranks.
kill_node() {
    local dir=$1 n=$2 ns
    ns=$(node_ns "$(cd "$dir" && pwd)" "$n")
    grep -qx "$ns" "$dir/namespaces" || die "no node $n in the cluster of $dir"
    kill_namespace "$ns"
    say "node$n killed: every process in $ns"
}

# kill_ranks DIR N: the ranks of node N die at once (a node's GPUs or memory failing), SIGKILL - the
# processes running `hpcpar train` (each rank and its guard); its slurmd and the MPI launcher's daemon stay.
kill_ranks() {
    local dir=$1 n=$2 ns pid killed=0
    ns=$(node_ns "$(cd "$dir" && pwd)" "$n")
    grep -qx "$ns" "$dir/namespaces" || die "no node $n in the cluster of $dir"
    for pid in $(ip netns pids "$ns"); do
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "bin/hpcpar train "; then
            kill -KILL "$pid" 2>/dev/null && killed=$(( killed + 1 ))
        fi
    done
    say "node$n's ranks killed: $killed process(es) in $ns"
}

# cut_link DIR N: node N drops off the network, its processes still running (a switch port that died).
cut_link() {
    local dir=$1 n=$2 ns
    ns=$(node_ns "$(cd "$dir" && pwd)" "$n")
    grep -qx "$ns" "$dir/namespaces" || die "no node $n in the cluster of $dir"
    ip -n "$ns" link set eth0 down
    say "node$n cut off: its link is down"
}

stop_cluster() {
    local dir=$1 name pid ns
    [[ -f $dir/pids ]] || return 0
    dir=$(cd "$dir" && pwd)
    # Jobs first, while the slurmds can still end their steps; then the daemons, newest first.
    if [[ -x $dir/bin/scancel ]]; then
        cancel_jobs "$dir"
    fi
    tac "$dir/pids" | while read -r name pid _; do
        stop_pid "$name" "$pid"
    done
    # whatever is left in the namespaces (a step of a killed node), then the namespaces themselves
    # (which takes the veths and the bridge with them)
    while read -r ns; do
        kill_namespace "$ns"
        ip netns del "$ns" 2>/dev/null || say "could not remove the namespace $ns"
    done < <(cat "$dir/namespaces" 2>/dev/null)
    rm -f "$dir/pids" "$dir/namespaces"
    say "stopped"
}

case ${1:-} in
    install) install_packages ;;
    start) start_cluster "${2:?usage: cluster.sh start DIR}" ;;
    stop) stop_cluster "${2:?usage: cluster.sh stop DIR}" ;;
    kill-node) kill_node "${2:?usage: cluster.sh kill-node DIR N}" "${3:?usage: cluster.sh kill-node DIR N}" ;;
    kill-ranks) kill_ranks "${2:?usage: cluster.sh kill-ranks DIR N}" "${3:?usage: cluster.sh kill-ranks DIR N}" ;;
    cut-link) cut_link "${2:?usage: cluster.sh cut-link DIR N}" "${3:?usage: cluster.sh cut-link DIR N}" ;;
    enter) shift; enter_node "$@" ;;
    *) die "usage: cluster.sh install | start DIR | stop DIR | kill-node DIR N | kill-ranks DIR N | cut-link DIR N" ;;
esac
