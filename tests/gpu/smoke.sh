#!/bin/bash
# tests/gpu/smoke.sh BUILD - mount with the GPU tier, write and read back
# checkpoints through GPU, host and SSD, and print what the tiers did.
set -u
B=${1:-build-gpu}
W=$(mktemp -d /tmp/tierfs-smoke.XXXXXX)
mkdir -p "$W/b" "$W/m"
"$B/tierfs" "$W/b" "$W/m" -f -o gpu=0,gpu_cache=${GPU_CACHE:-1G},host_cache=${HOST_CACHE:-2G},log=info > "$W/log" 2>&1 &
pid=$!
for _ in $(seq 50); do mountpoint -q "$W/m" && break; sleep 0.1; done
python3 - "$W/m" <<'PY'
import os, sys, hashlib, time, json
m = sys.argv[1]
sums = {}
t0 = time.time()
for i in range(24):
    data = os.urandom(64 << 20)
    p = os.path.join(m, "ck%02d" % i)
    with open(p, "wb") as f:
        f.write(data)
    sums[p] = hashlib.sha256(data).hexdigest()
    print(p, os.getxattr(p, "user.tierfs.state").decode())
print("write %.2f s" % (time.time() - t0))
for p in sorted(sums, reverse=True):
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    d = b""
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        d += b
    os.close(fd)
    assert hashlib.sha256(d).hexdigest() == sums[p], p
print("all 24 files read back OK")
print(json.dumps(json.loads(os.getxattr(m, "user.tierfs.stats")), indent=1))
PY
rc=$?
umount "$W/m"; wait $pid; echo "daemon rc $?"
cat "$W/log"
for f in "$W"/b/ck*; do :; done
ls -la "$W/b" | head -5
rm -rf "$W"
exit $rc
