#!/bin/bash
# The sixth pass (issue 30's later work: the replay's fast path in tree.replace and
# recording, a tie's projected rounds in the verdict; nothing ran on a GPU since 7422e85):
# the fast subset with CUDA present in 4 shards (its skips listed: no CUDA test may skip),
# gpu_check.py, the demo, `run` on the ImageNet example at -j 8, no worker left behind.
# OUT: where results go.
set +e
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
L=$OUT/log.txt
BP="python3 -m bisect_pipeline"
say() { echo "=== $(date +%T) $*" | tee -a $L; }
say machine
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -c "import torch,torchvision,sys;print(sys.version.split()[0],torch.__version__,torchvision.__version__,torch.cuda.is_available())") 2>&1 | tee -a $L
say fast subset with CUDA present, 4 shards
FILES=(tests/test_*.py)
for k in 0 1 2 3; do
  sel=(); for i in "${!FILES[@]}"; do [ $((i % 4)) = $k ] && sel+=("${FILES[$i]}"); done
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rs -m "not e2e" "${sel[@]}" > $OUT/fast-$k.txt 2>&1 &
done
wait
for k in 0 1 2 3; do tail -1 $OUT/fast-$k.txt | tee -a $L; grep -E '^(FAILED|ERROR|SKIPPED)' $OUT/fast-$k.txt | tee -a $L; done
say gpu_check
timeout 150 python3 scripts/gpu_check.py --max-seconds 15 --json $OUT/gpu_check-sixth-pass.json 2>&1 | tail -30 | tee -a $L
say demo
timeout 45 $BP demo --device cuda --max-seconds 15 --json $OUT/demo-gpu-sixth-pass.json 2>&1 | tail -30 | tee -a $L
say run imagenet -j 8
timeout 70 $BP run --device cuda --max-seconds 30 --json $OUT/run-imagenet-j8-sixth-pass.json .gpu/imagenet_main.py --dummy -a resnet18 -b 64 -j 8 --print-freq 1000 2>&1 | tail -40 | tee -a $L
say "python processes left: $(pgrep -c -f 'python3')"
say end
