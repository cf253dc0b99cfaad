#!/bin/bash
cd /work/main
for r in 1 2; do
  for b in new kv; do
    echo "=== round $r build $b"
    /usr/bin/python3 bench/nvstore.py --systems alignfs --patterns append2k,cross4k --jobs 1,8 --rounds 1 --seconds 8 --alignfs /tmp/alignfs-$b --out /tmp/kvab/out-$r-$b 2>&1 | grep -E "^\| (append2k|cross4k)"
  done
done
