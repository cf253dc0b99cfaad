#!/bin/bash
# webproxy and fileserver under a memory cap of 20 % of the 1 GiB file set (+160 MiB for the
# daemon), scrap old vs new build, alternating; ext4 beside under the same cap.
MACRO=${MACRO:-$PWD/target/release/alignfs-macro}
: "${OLD:?OLD=path of the old alignfs}" "${NEW:?NEW=path of the new alignfs}"
mkdir -p "${WORK:=/var/tmp/stream-reads}/mnt" && cd "$WORK"
CG=/sys/fs/cgroup/memory/capab
data=$((512*2*1024*1024)); cap=$((data/5 + 160*1024*1024)); smem=$((data/5))
mkdir -p $CG; echo $cap > $CG/memory.limit_in_bytes
inc() { sh -c "echo \$\$ > $CG/cgroup.procs && exec \"\$@\"" sh "$@"; }
for w in webproxy fileserver; do
for round in 1 2; do
  for b in old new ext4; do
    common="--workload $w --files 512 --seed $((7+round)) --mean-file 2097152 --write-io 1048576"
    if [ $b = ext4 ]; then rm -rf e4/c; mkdir -p e4; d=e4/c; $MACRO prepare $common --dir $d >/dev/null
    else A=$( [ $b = old ] && echo "$OLD" || echo "$NEW" ); $A mkfs --force --profile scrap --ssd ssd.img:8G >/dev/null 2>&1; $A mount --ssd ssd.img mnt >/dev/null 2>&1
      d=mnt/c; $MACRO prepare $common --dir $d >/dev/null; $A umount mnt >/dev/null
      inc $A mount --ssd ssd.img --scrap-mem $smem mnt >/dev/null 2>&1; fi
    sync; echo 3 > /proc/sys/vm/drop_caches
    r=$(inc $MACRO run $common --dir $d --seconds 8 | python3 -c 'import json,sys; print(json.load(sys.stdin)["mib_per_s"])')
    img=""; [ $b != ext4 ] && img="image cached $(( $(fincore -b -n -o RES ssd.img | tr -d ' ') >> 20 )) MiB" && $A umount mnt >/dev/null
    echo "$w round $round $b: $r MiB/s $img"
  done
done; done
rmdir $CG
