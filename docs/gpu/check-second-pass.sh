#!/bin/bash
set +e
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
L=$OUT/log.txt
say() { echo "=== $(date +%T) $*" | tee -a $L; }
say gpu_check
timeout 220 python3 scripts/gpu_check.py --max-seconds 15 --json $OUT/gpu_check.json 2>&1 | tail -40 | tee -a $L
say syncprobe
timeout 60 python3 .gpu/syncprobe.py > $OUT/syncprobe.txt 2>&1; echo "rc $? SYNC lines: $(grep -c '^SYNC' $OUT/syncprobe.txt)" | tee -a $L
grep -A13 -m3 '^SYNC' $OUT/syncprobe.txt >> $L; grep 'syncs Syncs' $OUT/syncprobe.txt >> $L
say cuda sync tests
timeout 60 python3 -m pytest -q -rs -p no:cacheprovider tests/measure/test_isolate.py 2>&1 | tail -6 | tee -a $L
say overhead
timeout 110 python3 scripts/bench_overhead.py --device cuda --runs 3 --workers 0 --max-seconds 15 2>&1 | tail -6 | tee -a $L
say non-e2e suite with CUDA present
timeout 75 python3 -m pytest -q -p no:cacheprovider -m "not e2e" -x 2>&1 > $OUT/nonE2E.txt; echo "rc $?" | tee -a $L; tail -15 $OUT/nonE2E.txt >> $L
say end
