#!/bin/bash
# The third pass (after the sync-count and allocator fixes): demo and `run` on the ImageNet
# example again, the allocator tests on the device's system Python, the fast subset with
# CUDA present (4 shards at once), the overhead benchmark. OUT: where results go.
set +e
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
L=$OUT/log.txt
BP="python3 -m bisect_pipeline"
say() { echo "=== $(date +%T) $*" | tee -a $L; }
say machine
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -c "import torch,torchvision,sys;print(sys.version.split()[0],torch.__version__,torchvision.__version__,torch.cuda.is_available())") 2>&1 | tee -a $L
say allocator tests
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/measure/test_allocator.py 2>&1 | tail -4 | tee -a $L
say demo
timeout 40 $BP demo --device cuda --max-seconds 15 --json $OUT/demo-gpu.json 2>&1 | tail -30 | tee -a $L
say run imagenet -j 0
timeout 55 $BP run --device cuda --max-seconds 30 --json $OUT/run-imagenet-j0.json .gpu/imagenet_main.py --dummy -a resnet18 -b 64 -j 0 --print-freq 1000 2>&1 | tail -30 | tee -a $L
say fast subset with CUDA present, 4 shards
FILES=(tests/test_*.py)
for k in 0 1 2 3; do
  sel=(); for i in "${!FILES[@]}"; do [ $((i % 4)) = $k ] && sel+=("${FILES[$i]}"); done
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m "not e2e" "${sel[@]}" > $OUT/fast-$k.txt 2>&1 &
done
wait
for k in 0 1 2 3; do tail -1 $OUT/fast-$k.txt | tee -a $L; grep -E '^(FAILED|ERROR)' $OUT/fast-$k.txt | tee -a $L; done
say overhead
timeout 110 python3 scripts/bench_overhead.py --device cuda --runs 3 --workers 0 --max-seconds 15 2>&1 | tail -6 | tee -a $L
say end
