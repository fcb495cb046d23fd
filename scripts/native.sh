#!/usr/bin/env bash
# Build dtprof's native libraries: the profiler-trace reader, and the kernel that records DDP's
# buckets at about no cost for the torch in .venv (`dtprof build-native`, each once per version).
# Needs a C++ compiler, and zlib's headers for the reader to inflate gzipped traces itself:
# installed here with apt-get when missing and we are root (CI). Without a compiler, profiler
# traces are read and DDP's buckets recorded by Python; without zlib, Python inflates.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
need=()
command -v c++ >/dev/null || need+=(g++)
[ -f /usr/include/zlib.h ] || need+=(zlib1g-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "native: installing ${need[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${need[@]}" >/dev/null
  elif ! command -v c++ >/dev/null; then
    echo "native: no C++ compiler: Python will read profiler traces and record DDP's buckets" >&2
    exit 0
  else
    echo "native: no zlib headers: Python will inflate gzipped profiler traces" >&2
  fi
fi
if ! dtprof build-native 2>&1 | tail -n 4; then
  echo "native: a build failed; what it would have done is done by Python" >&2
fi
