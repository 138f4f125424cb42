#!/bin/bash
# The fourth pass (issue 30's worker pools kept between visits, parked: persistent workers
# and pin_memory under the tool, never run on a GPU before): the fast subset with CUDA
# present in 4 shards (the parked-and-pinned test among them), gpu_check.py (its 2-worker
# pinned case is a parked worker point), `run` on the ImageNet example at -j 8 (8 pinned
# workers, four worker points kept), and no worker left behind. OUT: where results go.
set +e
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
L=$OUT/log.txt
BP="python3 -m bisect_pipeline"
say() { echo "=== $(date +%T) $*" | tee -a $L; }
say machine
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -c "import torch,torchvision,sys;print(sys.version.split()[0],torch.__version__,torchvision.__version__,torch.cuda.is_available())") 2>&1 | tee -a $L
say parked and pinned tests
timeout 60 python3 -m pytest -q -rs -p no:cacheprovider tests/measure/test_sources.py tests/measure/test_experiment.py 2>&1 | tail -4 | tee -a $L
say fast subset with CUDA present, 4 shards
FILES=(tests/test_*.py)
for k in 0 1 2 3; do
  sel=(); for i in "${!FILES[@]}"; do [ $((i % 4)) = $k ] && sel+=("${FILES[$i]}"); done
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m "not e2e" "${sel[@]}" > $OUT/fast-$k.txt 2>&1 &
done
wait
for k in 0 1 2 3; do tail -1 $OUT/fast-$k.txt | tee -a $L; grep -E '^(FAILED|ERROR)' $OUT/fast-$k.txt | tee -a $L; done
say gpu_check
timeout 150 python3 scripts/gpu_check.py --max-seconds 15 --json $OUT/gpu_check.json 2>&1 | tail -30 | tee -a $L
say run imagenet -j 8
timeout 70 $BP run --device cuda --max-seconds 30 --json $OUT/run-imagenet-j8.json .gpu/imagenet_main.py --dummy -a resnet18 -b 64 -j 8 --print-freq 1000 2>&1 | tail -40 | tee -a $L
say "python processes left: $(pgrep -c -f 'python3' ) (this shell's pgrep excluded)"
say end
