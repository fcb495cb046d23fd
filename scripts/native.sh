#!/usr/bin/env bash
# Build dtprof's native kernel (DDP's buckets recorded at about no cost) for the torch in .venv:
# `dtprof build-native`, once per torch build. Needs a C++ compiler: installed here with apt-get
# when there is none and we are root (CI). Without one, recording uses the Python kernel.
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
    echo "native: no C++ compiler: DDP's buckets will be recorded by the Python kernel" >&2
    exit 0
  fi
fi
if ! dtprof build-native 2>&1 | tail -n 3; then
  echo "native: the build failed; DDP's buckets will be recorded by the Python kernel" >&2
fi
