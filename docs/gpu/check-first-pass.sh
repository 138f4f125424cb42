#!/bin/bash
# The GPU check of issue 32, one pass. DEV=cuda on the device; OUT: where results go.
set +e
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
DEV=${DEV:-cuda}; S=${S:-1}   # S: budget scale (1 on the device)
L=$OUT/log.txt
say() { echo "=== $(date +%T) $*" | tee -a $L; }
say machine
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; python3 -c "import torch,torchvision,sys;print(sys.version.split()[0],torch.__version__,torchvision.__version__,torch.version.cuda,torch.cuda.is_available())") 2>&1 | tee -a $L
python3 -m pip install -q --no-deps --no-build-isolation -e . >>$L 2>&1 || say "pip -e failed"
BP="python3 -m bisect_pipeline"
say cuda tests
timeout $((100*S)) python3 -m pytest -q -rs -p no:cacheprovider --durations=8 tests/measure/test_devices.py tests/pipeline/test_state.py tests/pipeline/test_step.py tests/advise/test_advice.py tests/measure/test_isolate.py::test_cuda_counts_a_planted_item_sync_per_step tests/test_batch_structures.py::test_custom_batch_pins_and_moves_itself_on_cuda > $OUT/tests.txt 2>&1; echo "pytest rc $?" | tee -a $L; tail -25 $OUT/tests.txt >> $L
say gpu_check
timeout $((160*S)) python3 scripts/gpu_check.py --max-seconds $((15*S)) --json $OUT/gpu_check.json 2>&1 | tail -40 | tee -a $L
say demo
timeout $((50*S)) $BP demo --device $DEV --max-seconds $((15*S)) --json $OUT/demo-gpu.json 2>&1 | tail -45 | tee -a $L
for j in 0 8; do
  say run imagenet -j $j
  timeout $((65*S)) $BP run --device $DEV --max-seconds $((30*S)) --json $OUT/run-imagenet-j$j.json .gpu/imagenet_main.py --dummy -a resnet18 -b 64 -j $j --print-freq 1000 2>&1 | tail -45 | tee -a $L
done
say overhead
timeout $((70*S)) python3 scripts/bench_overhead.py --device $DEV --runs 1 --workers 0,2 --max-seconds $((12*S)) 2>&1 | tail -8 | tee -a $L
say end
