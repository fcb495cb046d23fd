#!/usr/bin/env bash
# Build dtprof's native libraries: the profiler-trace reader, and the kernel that records DDP's
# buckets at about no cost for the torch in .venv (`dtprof build-native`, each once per version).
# Needs a C++ compiler: installed here with apt-get when there is none and we are root (CI).
# Without one, profiler traces are read and DDP's buckets recorded by Python.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
if ! command -v c++ >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "native: installing a C++ compiler (apt-get install g++)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq g++ >/dev/null
  else
    echo "native: no C++ compiler: Python will read profiler traces and record DDP's buckets" >&2
    exit 0
  fi
fi
if ! dtprof build-native 2>&1 | tail -n 4; then
  echo "native: a build failed; what it would have done is done by Python" >&2
fi
