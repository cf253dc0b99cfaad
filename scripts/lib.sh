# Helpers shared by scripts/suites.sh, scripts/crash.sh and scripts/nbd.sh (sourced; they
# set $bin).

# The pid of the daemon serving mount point $1, from its stats attribute.
daemon_pid() { "$bin" stat "$1" --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p'; }

# Wait up to $2 seconds (default 60) for process $1 to be gone: no /proc entry, or a
# zombie whose last thread has exited (its new parent may be slow to reap it; a killed
# process's leader turns zombie while other threads may still be dropping its locks).
wait_gone() {
    local pid=$1 polls=$((${2:-60} * 50))
    for _ in $(seq "$polls"); do
        [[ -r /proc/$pid/status ]] || return 0
        awk '/^State:/ { z = ($2 == "Z") } /^Threads:/ { t = $2 } END { exit !(z && t == 1) }' "/proc/$pid/status" 2>/dev/null && return 0
        sleep 0.02
    done
    return 1
}

# FUSE over io_uring (Linux 6.14+) stays off until root sets the fuse module's
# enable_uring parameter. Turn it on, saying so; fail where the kernel has no such
# parameter or it cannot be set (not root).
fuse_uring_param=/sys/module/fuse/parameters/enable_uring
enable_fuse_uring() {
    [[ -e $fuse_uring_param ]] || return 1
    [[ $(cat "$fuse_uring_param") == Y ]] && return 0
    echo Y 2>/dev/null >"$fuse_uring_param" || return 1
    echo "turned on FUSE over io_uring: $fuse_uring_param = Y"
}

# Run a named check ("$@"), print its outcome and time, and count it in $passed or
# $failed (the sourcing script sets both to 0).
check() {
    local name=$1 start=$SECONDS
    shift
    echo "== $name"
    if "$@"; then
        passed=$((passed + 1))
        echo "-- $name: ok ($((SECONDS - start)) s)"
    else
        failed=$((failed + 1))
        echo "-- $name: FAILED ($((SECONDS - start)) s)"
    fi
}
