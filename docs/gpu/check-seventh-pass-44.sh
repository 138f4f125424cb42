#!/bin/bash
# Issue 44 on a GPU (about 5 minutes, no internet): --max-seconds as the whole run's bound
# and a short script on a fast step.
#   1. `run --tune --patch` on the torchvision classification reference at -j 4 with
#      --max-seconds 60 and 120: the wall times (target: within --max-seconds + the
#      reported start-up + 5 s), the search's best, the change's check;
#   2. the PyTorch MNIST example at its default 14 epochs under `run --device cuda`
#      (target: a verdict before the script ends: exit 0, no `source.ended`);
#   3. a syncing step (resnet18, loss.item() each step, 4 pinned workers, batch 128 of
#      uint8 images) against a hand loop over the same epochs (scripts/bench_syncing_step.py).
# Carried (ignored paths, the lead copies them in before the run):
#   .gpu/examples   pytorch/examples at any recent commit: mnist/main.py is enough
#                   (git -C /tmp/examples archive HEAD mnist | tar -x -C .gpu/examples)
#   .gpu/vision     pytorch/vision's references/classification (train.py, presets.py,
#                   transforms.py, utils.py, sampler.py); not mirrored on the 2-core machine
#                   (fetch github:pytorch/vision, then git archive HEAD references/classification)
# A part whose files are absent says so and is skipped. OUT: where results go.
set +e
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
L=$OUT/log.txt
BP="python3 -m bisect_pipeline"
ROOT=$PWD
say() { echo "=== $(date +%T) $*" | tee -a $L; }
walled() {  # walled NAME LIMIT CMD...: the command's wall time, appended to the log
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s.%N)
  timeout $limit "$@" > $OUT/$name.txt 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  echo "$name: exit $rc, wall $(python3 -c "print(round($t1 - $t0, 1))") s" | tee -a $L
  tail -25 $OUT/$name.txt >> $L
}
summary() {  # summary JSON MAX: the run's plan, start-up, verdict, the search's best and the check
  python3 - "$1" "$2" <<'EOF' 2>&1 | tee -a $L
import json, sys
d = json.load(open(sys.argv[1])); run = d.get("run") or {}; t = d.get("tune") or {}
print(f"  max {sys.argv[2]}: elapsed {run.get('elapsed_s')} s, start-up {run.get('startup_s')} s, plan {run.get('budget')}")
print(f"  verdict {d.get('bottleneck')}; source.ended {(d.get('source') or {}).get('ended')}; expected {(d.get('source') or {}).get('expected')}")
print(f"  epoch start {run.get('epoch_start')}")
if t:
    print(f"  best {(t.get('best') or {}).get('settings')}: {t.get('summary')}")
    print(f"  change checked: {t.get('applied_outcome')}; reason {t.get('applied_reason')}")
EOF
  ../shared/tools/check-report "$1" 2>&1 | tail -2 | tee -a $L
}
say machine
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; git log --oneline -1; python3 -c "import torch,torchvision,sys;print(sys.version.split()[0],torch.__version__,torchvision.__version__,torch.cuda.is_available())") 2>&1 | tee -a $L
say data
mkdir -p $OUT/data $OUT/run
python3 - $OUT/data <<'EOF' 2>&1 | tee -a $L
import os, sys
sys.path.insert(0, "scripts")
import bench_public_scripts as pub, bench_tune
data = sys.argv[1]
pub.make_data("mnist", data, data)
if not os.path.exists(os.path.join(data, "photos", ".generated")):  # 8 classes of camera-sized JPEGs
    bench_tune.write_jpegs(os.path.join(data, "photos"), per_class=96, val=4, photo=True, classes=8)
    open(os.path.join(data, "photos", ".generated"), "w").close()
print("data ready")
EOF
ln -sfn $OUT/data $OUT/run/data
TV=$ROOT/.gpu/vision/references/classification/train.py
for M in 60 120; do
  say "tv-classification run --tune --patch -j 4 --max-seconds $M"
  if [ -f $TV ]; then
    mkdir -p $OUT/run/tv-$M && cd $OUT/run/tv-$M
    walled tv-$M $((M + 90)) $BP run --device cuda --tune --patch p.diff --max-seconds $M --json $OUT/run-tv-$M.json \
      $TV --data-path $OUT/data/photos --model resnet18 --device cuda -b 64 -j 4 --epochs 30 --print-freq 100 \
      --train-crop-size 176 --val-resize-size 232 --val-crop-size 224 --output-dir $OUT/run/tv-$M
    cp -f p.diff $OUT/tv-$M.diff 2>/dev/null
    [ -f $OUT/run-tv-$M.json ] && summary $OUT/run-tv-$M.json $M
    cd $ROOT
  else
    say "skipped: $TV is not carried"
  fi
done
say "MNIST example, default epochs, run --device cuda"
if [ -f .gpu/examples/mnist/main.py ]; then
  mkdir -p $OUT/run/mnist && cd $OUT/run/mnist  # it reads ../data
  walled mnist 90 $BP run --device cuda --json $OUT/run-mnist-default.json $ROOT/.gpu/examples/mnist/main.py
  [ -f $OUT/run-mnist-default.json ] && summary $OUT/run-mnist-default.json 30
  cd $ROOT
else
  say "skipped: .gpu/examples/mnist/main.py is not carried"
fi
say "syncing step against a hand loop (64-batch and 8-batch epochs)"
timeout 100 python3 scripts/bench_syncing_step.py --device cuda --workers 4 --batch-size 128 --epoch-batches 64 --runs 1 --max-seconds 20 2>&1 | tail -4 | tee -a $L
timeout 80 python3 scripts/bench_syncing_step.py --device cuda --workers 4 --batch-size 128 --epoch-batches 8 --runs 1 --max-seconds 20 2>&1 | tail -4 | tee -a $L
say "python processes left: $(pgrep -c -f 'python3')"
say end
