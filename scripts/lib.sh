# Helpers shared by scripts/suites.sh and scripts/crash.sh (sourced; they set $bin).

# The pid of the daemon serving mount point $1, from its stats attribute.
daemon_pid() { "$bin" stat "$1" --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p'; }

# Wait up to $2 seconds (default 60) for process $1 to be gone: no /proc entry, or a
# zombie (its new parent may be slow to reap it, and a zombie has finished its work).
wait_gone() {
    local pid=$1 polls=$((${2:-60} * 50))
    for _ in $(seq "$polls"); do
        [[ -r /proc/$pid/stat ]] || return 0
        [[ $(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1) == Z ]] && return 0
        sleep 0.02
    done
    return 1
}
