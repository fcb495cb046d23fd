#!/usr/bin/env bash
# What dtprof's native code needs, then the kernel that records DDP's buckets at about no cost
# for the torch in .venv (`dtprof build-native`, once per torch build). The profiler-trace
# reader is built by the install itself (setup.py), where a C++ compiler is there: this script
# runs once before it (`--compiler`: installs g++ and zlib's headers with apt-get when missing
# and we are root, as in CI) and once after. Without a compiler, profiler traces are read and
# DDP's buckets recorded by Python; without zlib, Python inflates gzipped traces.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--compiler" ]; then
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
    else
      echo "native: no zlib headers: Python will inflate gzipped profiler traces" >&2
    fi
  fi
  exit 0
fi
. .venv/bin/activate
if ! dtprof build-native 2>&1 | tail -n 4; then
  echo "native: a build failed; what it would have done is done by Python" >&2
fi
