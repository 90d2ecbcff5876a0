export LD_LIBRARY_PATH=$PWD/.devlibs
B=$PWD/build-gpu
OUT=$OUT timeout 200 bench/bench_balance_mount.sh $B 1024 1792 5 2G > $OUT/balance.txt 2>&1
cat $OUT/balance.txt
TIERFS_BIN=$B/tierfs TIERFS_GPUS=0:1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpus.py tests/test_stat_tool.py -k "gpu" > $OUT/pytest-gpus.txt 2>&1
tail -3 $OUT/pytest-gpus.txt; grep -E "^E  |FAILED" $OUT/pytest-gpus.txt | head
RUNS=4 SECONDS_EACH=40 TIERFS_GPU=0:1 GPU_CACHE=48M timeout 150 tests/gpu/torture.sh > $OUT/torture.txt 2>&1
grep -E "PASS|FAIL" $OUT/torture.txt | sort -u | tail -5
grep -h "links measured" $OUT/bbm-*.log
