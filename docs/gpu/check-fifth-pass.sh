#!/bin/bash
# The fifth pass (after a resumed parked pool's warm-up lost the prefetch, 1989425, and
# the parked-and-pinned test became a parameter of the parked test): the parked tests
# with CUDA present, and `run` on the ImageNet example at -j 8 again. OUT: where results go.
set +e
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
L=$OUT/log.txt
say() { echo "=== $(date +%T) $*" | tee -a $L; }
say machine
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; python3 -c "import torch;print(torch.__version__,torch.cuda.is_available())") 2>&1 | tee -a $L
say parked tests
timeout 90 python3 -m pytest -q -rs -p no:cacheprovider tests/measure/test_sources.py tests/measure/test_experiment.py -k "parked or resumed or kept" -v 2>&1 | grep -E "PASS|FAIL|SKIP|ERROR|passed|failed" | tee -a $L
say run imagenet -j 8
timeout 70 python3 -m bisect_pipeline run --device cuda --max-seconds 30 --json $OUT/run-imagenet-j8-fifth-pass.json .gpu/imagenet_main.py --dummy -a resnet18 -b 64 -j 8 --print-freq 1000 2>&1 | grep -E "^Bottleneck|^Verdict|^load|^augment|^collate|^handoff|^transfer" | tee -a $L
say "python processes left: $(pgrep -c -f python3)"
say end
