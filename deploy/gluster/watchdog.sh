#!/usr/bin/env bash
# watchdog.sh ALIGNFS MOUNTPOINT BRICK PIDFILE: keep a GlusterFS brick out of service while the
# alignfs mount under it is not served.
#
# glusterfsd's own health check did not stop a brick whose FUSE file system vanished: the
# brick went on answering clients with errors. Here `alignfs health --watch` probes the
# mount every second and returns as soon as the daemon is gone or stops answering for 5 s;
# the brick process is then stopped, so clients drop it at once and write to the other
# replicas. While the mount stays unhealthy any restarted brick is stopped again; once it
# is served again (`cluster.sh recover`), watching resumes.
set -uo pipefail
alignfs=$1 mnt=$2 brick=$3 pidfile=$4
echo $$ >"$pidfile"
probe=
# Stopping the watchdog stops its probe too.
trap '[[ -n $probe ]] && kill "$probe" 2>/dev/null; exit 0' TERM INT

log() { echo "$(date '+%F %T') watchdog $mnt: $*"; }

brick_pids() { pgrep -f -- "glusterfsd .*--brick-name $brick( |$)"; }

stop_brick() {
    local pids
    pids=$(brick_pids) || return 0
    log "stopping brick $brick (pid $pids)"
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 30); do brick_pids >/dev/null || return 0; sleep 0.1; done
    kill -KILL $pids 2>/dev/null
}

log "watching (brick $brick)"
while true; do
    "$alignfs" health --watch 1 --timeout 5 --quiet "$mnt" &
    probe=$!
    wait "$probe"
    status=$?
    probe=
    [[ $status == 1 ]] || { log "alignfs health exited with $status; giving up"; exit "$status"; }
    stop_brick
    until "$alignfs" health --quiet --timeout 5 "$mnt" >/dev/null; do
        stop_brick
        sleep 1
    done
    log "mount served again; watching"
done
