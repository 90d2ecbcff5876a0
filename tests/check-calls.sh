#!/bin/sh
# The layering rule on the calls of this build (tools/check-calls): no
# cycle of calls between the files of fs/, store/ and tiers/, no call from
# fs/ to gpu/, none from common/ to the rooms.  Run by make check from the build directory, whose objects
# have their call graphs beside them (.ci, -fcallgraph-info); exits 77
# (skipped) where the compiler wrote none.
: "${TIERFS_SRCDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
exec python3 "$TIERFS_SRCDIR/tools/check-calls" --srcdir "$TIERFS_SRCDIR" .
