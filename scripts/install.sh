#!/usr/bin/env bash
# Install alignfs for `mount -t fuse.alignfs` and /etc/fstab (docs/OPERATING.md): the
# release binary as $PREFIX/bin/alignfs (PREFIX default /usr/local) and the mount
# helper /sbin/mount.fuse.alignfs, a link to it that mount(8) runs for file systems of
# type fuse.alignfs. Builds the binary first unless --no-build. Root only.
#   scripts/install.sh [--no-build] [--uninstall]
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${PREFIX:-/usr/local}
# mount(8) looks for its helpers in /sbin (on merged-/usr systems, /usr/sbin).
helper_dir=${HELPER_DIR:-/sbin}
build=1
for arg in "$@"; do
    case $arg in
    --no-build) build=0 ;;
    --uninstall)
        rm -f "$helper_dir/mount.fuse.alignfs" "$prefix/bin/alignfs"
        echo "install: removed $prefix/bin/alignfs and $helper_dir/mount.fuse.alignfs"
        exit 0
        ;;
    *) echo "usage: scripts/install.sh [--no-build] [--uninstall]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) == 0 ]] || { echo "install: run as root (it writes $prefix/bin and $helper_dir)" >&2; exit 1; }
command -v fusermount3 >/dev/null 2>&1 || echo "install: note: fuse3 is not installed (apt-get install fuse3)" >&2
if ((build)); then
    cargo build --release --locked -p alignfs-cli
fi
install -D -m 0755 target/release/alignfs "$prefix/bin/alignfs"
ln -sfn "$prefix/bin/alignfs" "$helper_dir/mount.fuse.alignfs"
echo "install: $prefix/bin/alignfs, and $helper_dir/mount.fuse.alignfs for mount -t fuse.alignfs"
