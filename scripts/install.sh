#!/usr/bin/env bash
# Install alignfs as a system service (docs/OPERATING.md):
#   - the release binary as $PREFIX/bin/alignfs (PREFIX default /usr/local);
#   - the mount helper $HELPER_DIR/mount.fuse.alignfs (default /sbin), a link to it that
#     mount(8) runs for file systems of type fuse.alignfs (`mount -t`, /etc/fstab);
#   - the systemd units alignfs-mount@, alignfs-nbd@ and alignfs-s3@ in $SYSTEMD_DIR
#     (default /etc/systemd/system), and example instance files in $ALIGNFS_ETC (default
#     /etc/alignfs; existing files are kept);
#   - docs/OPERATING.md in $PREFIX/share/doc/alignfs, and the Grafana dashboard
#     deploy/grafana/alignfs.json in $PREFIX/share/alignfs/grafana.
# Builds the binary first unless --no-build. Root only.
#   scripts/install.sh [--no-build] [--uninstall]
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${PREFIX:-/usr/local}
# mount(8) looks for its helpers in /sbin (on merged-/usr systems, /usr/sbin).
helper_dir=${HELPER_DIR:-/sbin}
systemd_dir=${SYSTEMD_DIR:-/etc/systemd/system}
etc=${ALIGNFS_ETC:-/etc/alignfs}
units=(alignfs-mount@.service alignfs-nbd@.service alignfs-s3@.service)
build=1
for arg in "$@"; do
    case $arg in
    --no-build) build=0 ;;
    --uninstall)
        rm -f "$helper_dir/mount.fuse.alignfs" "$prefix/bin/alignfs" "$prefix/share/doc/alignfs/OPERATING.md" \
            "$prefix/share/alignfs/grafana/alignfs.json"
        for unit in "${units[@]}"; do rm -f "$systemd_dir/$unit"; done
        echo "install: removed alignfs, its mount helper, units and docs ($etc is kept)"
        exit 0
        ;;
    *) echo "usage: scripts/install.sh [--no-build] [--uninstall]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) == 0 ]] || { echo "install: run as root (it writes $prefix/bin, $helper_dir and $systemd_dir)" >&2; exit 1; }
command -v fusermount3 >/dev/null 2>&1 || echo "install: note: fuse3 is not installed (apt-get install fuse3)" >&2
if ((build)); then
    cargo build --release --locked -p alignfs-cli
fi
install -D -m 0755 target/release/alignfs "$prefix/bin/alignfs"
ln -sfn "$prefix/bin/alignfs" "$helper_dir/mount.fuse.alignfs"
install -D -m 0644 docs/OPERATING.md "$prefix/share/doc/alignfs/OPERATING.md"
install -D -m 0644 deploy/grafana/alignfs.json "$prefix/share/alignfs/grafana/alignfs.json"
mkdir -p "$systemd_dir" "$etc"
for unit in "${units[@]}"; do
    # The units name the default paths; point them at the ones installed to.
    sed -e "s|/usr/local/bin/alignfs|$prefix/bin/alignfs|g" \
        -e "s|/usr/local/share/doc/alignfs|$prefix/share/doc/alignfs|g" \
        -e "s|/etc/alignfs/|$etc/|g" "deploy/systemd/$unit" >"$systemd_dir/$unit"
    chmod 0644 "$systemd_dir/$unit"
done
for example in deploy/systemd/example-*.conf; do
    [[ -e $etc/$(basename "$example") ]] || install -m 0644 "$example" "$etc/"
done
# Only a booted systemd has units to reload.
if [[ -d /run/systemd/system ]] && [[ $systemd_dir == /etc/systemd/system ]]; then
    systemctl daemon-reload
fi
echo "install: $prefix/bin/alignfs, $helper_dir/mount.fuse.alignfs, units in $systemd_dir, examples in $etc"
