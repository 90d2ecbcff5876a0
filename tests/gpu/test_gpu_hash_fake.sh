#!/bin/sh
#
# tests/gpu/test_gpu_hash_fake.sh - test_gpu_hash against a fake libcuda
# (tests/gpu/fake_libcuda.c, built by make check as
# tests/gpu/fakecuda/libcuda.so.1): gpu_hash.c's launches, batching and
# errors and the test's own checks, end to end without a GPU.  The hashes
# come from libxxhash inside the fake; the kernels themselves are checked by
# tests/unit/test_hash_kernel_cpu (and on a GPU by tests/gpu/run.sh).
# Run by `make check` from the build directory.
#
set -u
fake=$PWD/tests/gpu/fakecuda
prog=$PWD/tests/gpu/test_gpu_hash
[ -f "$fake/libcuda.so.1" ] && [ -x "$prog" ] || {
	echo "SKIP: $fake/libcuda.so.1 or $prog not built"
	exit 77
}
LD_LIBRARY_PATH=$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
TIERFS_HASH_BENCH_MIB=256 TIERFS_HASH_REPS=1 "$prog" >test_gpu_hash_fake.out 2>&1
rc=$?
cat test_gpu_hash_fake.out
# the fake must have been the driver: a real GPU here would test nothing new
grep -q '^INFO: device 0: FAKE device' test_gpu_hash_fake.out || {
	echo "FAIL: the fake libcuda was not the one loaded"
	exit 1
}
exit $rc
