#!/usr/bin/env bash
# A local GlusterFS cluster whose bricks live on alignfs mounts, built from network and
# mount namespaces on this machine. docs/SCALE-OUT.md explains the layout and the same
# steps on separate machines.
#
#   cluster.sh up [--nodes N] [--bricks alignfs|ext4] [--replica R]   bring it up (default 3 nodes, replica 3)
#   cluster.sh down                       remove every daemon, mount, namespace and file it made
#   cluster.sh status                     nodes, brick health, gluster volume status
#   cluster.sh exec NODE CMD...           run CMD inside node NODE (1..N) or `client`
#   cluster.sh kill-alignfs NODE          kill -9 node NODE's alignfs daemon (a failure drill)
#   cluster.sh recover NODE               remount NODE's alignfs, restart its brick, heal, wait
#   cluster.sh rebuild NODE               NODE lost its devices: format anew, reset-brick, full heal
#   cluster.sh heal-wait [SECS]           wait until self-heal has nothing left to do
#   cluster.sh brick-sums NODE            md5 of every file in NODE's brick (outside .glusterfs)
#
# Nodes are network namespaces afg-n1..N plus afg-client, joined by a bridge that lives
# in a namespace of its own (afg-sw) on 10.213.7.0/24: nothing is added to the host's
# network namespace. Each node also has a persistent mount namespace in which
# /var/lib/glusterd, /run and /var/log/glusterfs are private directories and its alignfs
# volume is mounted. A watchdog per node (`alignfs health --watch`) stops the node's brick
# process as soon as its alignfs mount stops answering.
#
# Environment: AFG_NAME (namespace name prefix, default afg), AFG_STATE (default
# /var/tmp/alignfs-gluster), AFG_SHM (fast tiers, default /dev/shm/alignfs-gluster),
# AFG_FAST_SIZE (256M), AFG_SSD_SIZE (2G), ALIGNFS (binary, default
# target/release/alignfs of this checkout). Clusters with different AFG_NAME and
# AFG_STATE can coexist.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
STATE=${AFG_STATE:-/var/tmp/alignfs-gluster}
SHM=${AFG_SHM:-/dev/shm/alignfs-gluster}
FAST_SIZE=${AFG_FAST_SIZE:-256M}
SSD_SIZE=${AFG_SSD_SIZE:-2G}
ALIGNFS=${ALIGNFS:-$repo/target/release/alignfs}
NAME=${AFG_NAME:-afg}
[[ $NAME =~ ^[a-z][a-z0-9]{0,5}$ ]] || { echo "cluster.sh: AFG_NAME must be 1-6 lowercase letters or digits" >&2; exit 1; }
SUBNET=10.213.7
SWITCH=$NAME-sw
BRIDGE=$NAME-br
VOLUME=gv0
CLIENT_MNT=$STATE/client/mnt

die() { echo "cluster.sh: $*" >&2; exit 1; }
say() { echo "cluster: $*"; }

node_ns() { [[ $1 == client ]] && echo "$NAME-client" || echo "$NAME-n$1"; }
node_ip() { [[ $1 == client ]] && echo "$SUBNET.100" || echo "$SUBNET.$((10 + $1))"; }
node_dir() { [[ $1 == client ]] && echo "$STATE/client" || echo "$STATE/n$1"; }
brick_mnt() { echo "$(node_dir "$1")/mnt"; }
brick_path() {
    if [[ $BRICKS == ext4 ]]; then echo "$(node_dir "$1")/ext4/brick"; else echo "$(brick_mnt "$1")/brick"; fi
}

# Run a command inside a node: its network namespace and its persistent mount namespace.
in_node() {
    local node=$1; shift
    nsenter --net="/run/netns/$(node_ns "$node")" --mount="$STATE/ns/$(node_ns "$node")" -- "$@"
}

load_config() {
    [[ -f $STATE/cluster.env ]] || die "no cluster here ($STATE/cluster.env is missing); run \`cluster.sh up\`"
    # shellcheck source=/dev/null
    source "$STATE/cluster.env"
}

nodes() { seq 1 "$NODES"; }

gluster_cli() { in_node 1 gluster --mode=script "$@"; }

# ---- bring-up -----------------------------------------------------------------------

make_network() {
    ip netns add "$SWITCH"
    ip -n "$SWITCH" link add "$BRIDGE" type bridge
    ip -n "$SWITCH" link set "$BRIDGE" up
    local node ns
    for node in $(nodes) client; do
        ns=$(node_ns "$node")
        ip netns add "$ns"
        # Both ends are created inside our namespaces: the host's never sees them.
        ip -n "$SWITCH" link add "p-$ns" type veth peer name eth0 netns "$ns"
        ip -n "$SWITCH" link set "p-$ns" master "$BRIDGE" up
        ip -n "$ns" addr add "$(node_ip "$node")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
}

# A mount namespace per node that outlives its processes: unshare bind-mounts it onto a
# file, which must sit on a private mount so the bind does not propagate.
make_mount_namespaces() {
    mkdir -p "$STATE/ns"
    mount --bind "$STATE/ns" "$STATE/ns"
    mount --make-private "$STATE/ns"
    local node ns dir
    for node in $(nodes) client; do
        ns=$(node_ns "$node")
        dir=$(node_dir "$node")
        mkdir -p "$dir"/{glusterd,run/gluster,run/lock,log,mnt}
        cp -a /var/lib/glusterd/. "$dir/glusterd/" 2>/dev/null || true
        touch "$STATE/ns/$ns"
        unshare --mount="$STATE/ns/$ns" --propagation private true
        in_node "$node" mount --bind "$dir/glusterd" /var/lib/glusterd
        in_node "$node" mount --bind "$dir/run" /run
        in_node "$node" mount --bind "$dir/log" /var/log/glusterfs
    done
}

mount_alignfs() {
    local node=$1 dir
    dir=$(node_dir "$node")
    in_node "$node" "$ALIGNFS" mount --fast "$SHM/n$node-fast" --ssd "$dir/ssd.img" \
        --log "$dir/alignfs.log" -o allow_other "$(brick_mnt "$node")" >/dev/null
}

start_watchdog() {
    local node=$1
    local dir
    dir=$(node_dir "$node")
    in_node "$node" setsid "$here/watchdog.sh" "$ALIGNFS" "$(brick_mnt "$node")" "$(brick_path "$node")" \
        "$dir/watchdog.pid" >>"$dir/watchdog.log" 2>&1 </dev/null &
}

start_glusterd() {
    local node=$1
    in_node "$node" glusterd --pid-file=/run/glusterd.pid
    local i
    for i in $(seq 100); do
        in_node "$node" gluster --mode=script pool list >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "glusterd on node $node did not start (see $(node_dir "$node")/log/glusterd.log)"
}

# What the cluster runs on, installed when missing (Debian/Ubuntu).
ensure_packages() {
    local missing=() tool package
    for tool in glusterd:glusterfs-server mount.glusterfs:glusterfs-client ip:iproute2 nsenter:util-linux \
        pgrep:procps fio:fio; do
        command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
    done
    ((${#missing[@]})) || return 0
    command -v apt-get >/dev/null || die "missing: ${missing[*]} (install them)"
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

up() {
    local replica=""
    NODES=3
    BRICKS=alignfs
    while (($#)); do
        case $1 in
            --nodes) NODES=$2; shift 2 ;;
            --bricks) BRICKS=$2; shift 2 ;;
            --replica) replica=$2; shift 2 ;;
            *) die "unknown option $1" ;;
        esac
    done
    [[ $NODES =~ ^[1-9][0-9]?$ ]] || die "--nodes must be 1..99"
    [[ $BRICKS == alignfs || $BRICKS == ext4 ]] || die "--bricks must be alignfs or ext4"
    replica=${replica:-$NODES}
    ((NODES % replica == 0)) || die "--nodes must be a multiple of --replica"
    [[ -e $STATE/cluster.env ]] && die "a cluster already exists in $STATE; run \`cluster.sh down\` first"
    [[ $EUID == 0 ]] || die "needs root (namespaces, mounts)"
    ensure_packages
    [[ $BRICKS == ext4 ]] || [[ -x $ALIGNFS ]] || die "$ALIGNFS is missing: cargo build --release -p alignfs-cli"

    # Half a bring-up is torn down again, so a failure leaves nothing behind.
    trap 'echo "cluster.sh: bring-up failed; tearing down" >&2; down >/dev/null 2>&1 || true' ERR
    mkdir -p "$STATE" "$SHM"
    printf 'NODES=%s\nBRICKS=%s\nREPLICA=%s\n' "$NODES" "$BRICKS" "$replica" >"$STATE/cluster.env"
    make_network
    make_mount_namespaces
    local node bricks=()
    for node in $(nodes); do
        if [[ $BRICKS == alignfs ]]; then
            "$ALIGNFS" mkfs --fast "$SHM/n$node-fast:$FAST_SIZE" --ssd "$(node_dir "$node")/ssd.img:$SSD_SIZE" >/dev/null
            mount_alignfs "$node"
            start_watchdog "$node"
        else
            mkdir -p "$(dirname "$(brick_path "$node")")"
        fi
        start_glusterd "$node"
        bricks+=("$(node_ip "$node"):$(brick_path "$node")")
    done
    for node in $(seq 2 "$NODES"); do
        gluster_cli peer probe "$(node_ip "$node")" >/dev/null
    done
    wait_for "all peers connected" 30 peers_connected
    local force=()
    # ext4 bricks are plain directories on the root file system, which gluster only takes
    # with `force`; alignfs bricks are file systems of their own and need none.
    [[ $BRICKS == ext4 ]] && force=(force)
    local replicate=()
    ((replica > 1)) && replicate=(replica "$replica")
    gluster_cli volume create "$VOLUME" "${replicate[@]}" transport tcp "${bricks[@]}" "${force[@]}" >/dev/null
    gluster_cli volume start "$VOLUME" >/dev/null
    wait_for "bricks online" 60 bricks_online "$NODES"
    mount_client
    trap - ERR
    say "up: $NODES nodes, $BRICKS bricks, volume $VOLUME mounted in the client at $CLIENT_MNT"
    say "run commands there with: $0 exec client CMD..."
}

mount_client() {
    local backups=() node
    for node in $(seq 2 "$NODES"); do backups+=("$(node_ip "$node")"); done
    local opts=""
    ((${#backups[@]})) && opts="-o backup-volfile-servers=$(IFS=:; echo "${backups[*]}")"
    # shellcheck disable=SC2086
    in_node client mount -t glusterfs $opts "$(node_ip 1):/$VOLUME" "$CLIENT_MNT"
}

peers_connected() {
    [[ $(gluster_cli pool list 2>/dev/null | grep -c Connected) == "$NODES" ]]
}

bricks_online() {
    [[ $(online_bricks) == "$1" ]]
}

# How many bricks glusterd reports online.
online_bricks() {
    gluster_cli volume status "$VOLUME" detail 2>/dev/null | grep -c '^Online.*: Y' || true
}

wait_for() {
    local what=$1 secs=$2; shift 2
    local i
    for i in $(seq $((secs * 10))); do
        "$@" && return 0
        sleep 0.1
    done
    die "timed out after ${secs}s waiting for $what"
}

# ---- teardown -----------------------------------------------------------------------

# Every process whose network namespace is one of ours.
our_pids() {
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$NAME-"); do
        ip netns pids "$ns" 2>/dev/null || true
    done
}

down() {
    [[ -d $STATE || -d $SHM ]] || [[ -n $(ip netns list | grep -E "^$NAME-" || true) ]] || { say "nothing to tear down"; return 0; }
    [[ -f $STATE/cluster.env ]] && source "$STATE/cluster.env"
    local node ns pids
    # Unmount the client first so nothing writes while the bricks go away, then stop
    # gluster; then unmount alignfs cleanly (checkpoint) while its daemon still runs.
    if [[ -e $STATE/ns/$(node_ns client) ]]; then
        in_node client umount -l "$CLIENT_MNT" 2>/dev/null || true
    fi
    for node in $(seq 1 "${NODES:-0}"); do
        stop_watchdog "$node"
    done
    pids=$(our_pids | tr '\n' ' ')
    for pid in $pids; do
        case $(cat "/proc/$pid/comm" 2>/dev/null) in gluster*) kill -9 "$pid" 2>/dev/null || true ;; esac
    done
    for node in $(seq 1 "${NODES:-0}"); do
        ns=$(node_ns "$node")
        [[ -e $STATE/ns/$ns ]] || continue
        unmount_alignfs "$node"
    done
    # Anything left (a hung daemon, a watchdog's child) goes now.
    pids=$(our_pids | tr '\n' ' ')
    [[ -n ${pids// } ]] && kill -9 $pids 2>/dev/null || true
    if [[ -d $STATE/ns ]]; then
        for ns in "$STATE"/ns/*; do
            [[ -e $ns ]] && umount "$ns" 2>/dev/null || true
        done
        umount "$STATE/ns" 2>/dev/null || true
    fi
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$NAME-"); do
        ip netns del "$ns"
    done
    rm -rf "$STATE" "$SHM"
    say "down: no namespaces, mounts, processes or files of the cluster remain"
}

# ---- operations ---------------------------------------------------------------------

status() {
    load_config
    local node
    for node in $(nodes); do
        printf 'node %s (%s): ' "$node" "$(node_ip "$node")"
        if [[ $BRICKS == alignfs ]]; then
            in_node "$node" "$ALIGNFS" health --timeout 2 "$(brick_mnt "$node")" || true
        else
            echo "ext4 brick"
        fi
    done
    gluster_cli volume status "$VOLUME"
}

kill_alignfs() {
    load_config
    local node=$1 pid
    [[ $BRICKS == alignfs ]] || die "the bricks are not on alignfs"
    pid=$(in_node "$node" "$ALIGNFS" stat --json "$(brick_mnt "$node")" | sed -n 's/.*"pid": \([0-9]*\).*/\1/p')
    [[ -n $pid ]] || die "node $node has no running alignfs daemon"
    kill -9 "$pid"
    say "killed node $node's alignfs daemon (pid $pid)"
}

# Unmount a node's alignfs: cleanly (checkpoint) while its daemon runs, else detach.
unmount_alignfs() {
    local node=$1 mnt
    mnt=$(brick_mnt "$node")
    in_node "$node" timeout 60 "$ALIGNFS" umount "$mnt" >/dev/null 2>&1 || in_node "$node" umount -l "$mnt" 2>/dev/null || true
}

stop_watchdog() {
    local pidfile
    pidfile=$(node_dir "$1")/watchdog.pid
    [[ -f $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
}

# Ask for a heal (`full` or an index heal). The self-heal daemon also starts on its own when
# it reconnects to the brick; asking fails while it has not reconnected yet, so ask a few
# times.
start_heal() {
    local i
    for i in $(seq 20); do
        gluster_cli volume heal "$VOLUME" "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
}

recover() {
    load_config
    local node=$1 mnt
    [[ $BRICKS == alignfs ]] || die "the bricks are not on alignfs"
    mnt=$(brick_mnt "$node")
    if ! in_node "$node" "$ALIGNFS" health -q --timeout 2 "$mnt" >/dev/null; then
        # A brick still running on the dead mount would only return errors: stop it first.
        stop_brick "$node"
        unmount_alignfs "$node"
        mount_alignfs "$node"
        say "node $node: alignfs remounted (journal replayed)"
    fi
    local pidfile
    pidfile=$(node_dir "$node")/watchdog.pid
    if ! { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }; then
        start_watchdog "$node"
    fi
    gluster_cli volume start "$VOLUME" force >/dev/null
    wait_for "node $node's brick online" 60 bricks_online "$NODES"
    start_heal
    say "node $node: brick restarted, healing"
    heal_wait 300
}

# A node whose fast tier or SSD is gone (a reboot with a tmpfs fast tier, a dead device):
# a new, empty volume and brick, refilled from the other replicas.
rebuild() {
    load_config
    local node=$1 brick dir
    [[ $BRICKS == alignfs ]] || die "the bricks are not on alignfs"
    brick="$(node_ip "$node"):$(brick_path "$node")"
    dir=$(node_dir "$node")
    stop_watchdog "$node"
    stop_brick "$node"
    unmount_alignfs "$node"
    "$ALIGNFS" mkfs --force --fast "$SHM/n$node-fast:$FAST_SIZE" --ssd "$dir/ssd.img:$SSD_SIZE" >/dev/null
    mount_alignfs "$node"
    in_node "$node" mkdir -p "$(brick_path "$node")"
    start_watchdog "$node"
    say "node $node: new alignfs volume mounted"
    gluster_cli volume reset-brick "$VOLUME" "$brick" start >/dev/null
    gluster_cli volume reset-brick "$VOLUME" "$brick" "$brick" commit force >/dev/null
    wait_for "node $node's brick online" 60 bricks_online "$NODES"
    start_heal full
    say "node $node: brick reset, full heal started"
    heal_wait 600
}

stop_brick() {
    local node=$1 pid
    pid=$(pgrep -f -- "glusterfsd .*--brick-name $(brick_path "$node")( |$)" || true)
    [[ -n $pid ]] && kill -9 $pid 2>/dev/null || true
}

# Entries still waiting for heal, summed over all bricks.
pending_heals() {
    gluster_cli volume heal "$VOLUME" info summary 2>/dev/null |
        awk -F: '/Total Number of entries:/ { n += $2; seen++ } END { if (!seen) exit 1; print n }'
}

heal_wait() {
    load_config
    local secs=${1:-300} start=$SECONDS pending
    while ((SECONDS - start < secs)); do
        if pending=$(pending_heals) && [[ $pending == 0 ]] && bricks_online "$NODES"; then
            say "heal complete after $((SECONDS - start)) s"
            return 0
        fi
        sleep 1
    done
    die "heal not complete after ${secs}s (pending: ${pending:-unknown})"
}

brick_sums() {
    load_config
    local node=$1 brick
    brick=$(brick_path "$node")
    in_node "$node" sh -c "cd '$brick' && find . -path ./.glusterfs -prune -o -type f -print0 | sort -z | xargs -0 -r md5sum"
}

cmd=${1:-}
shift || true
case $cmd in
    up) up "$@" ;;
    down) down ;;
    status) status ;;
    exec)
        load_config
        [[ $# -ge 2 ]] || die "usage: cluster.sh exec NODE CMD..."
        node=$1; shift
        in_node "$node" "$@"
        ;;
    kill-alignfs) [[ $# == 1 ]] || die "usage: cluster.sh kill-alignfs NODE"; kill_alignfs "$1" ;;
    recover) [[ $# == 1 ]] || die "usage: cluster.sh recover NODE"; recover "$1" ;;
    rebuild) [[ $# == 1 ]] || die "usage: cluster.sh rebuild NODE"; rebuild "$1" ;;
    heal-wait) heal_wait "${1:-300}" ;;
    brick-sums) [[ $# == 1 ]] || die "usage: cluster.sh brick-sums NODE"; brick_sums "$1" ;;
    -h | --help | help | "") awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" ;;
    *) die "unknown command $cmd (see --help)" ;;
esac
