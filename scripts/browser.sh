#!/usr/bin/env bash
# Headless Chromium for the dashboard's browser test: the Debian package, installed only when
# /usr/bin/chromium is missing and we are root (CI); otherwise the test skips itself.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "browser: no /usr/bin/chromium and not root with apt-get: the browser test will skip" >&2
  exit 0
fi
echo "browser: installing chromium (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq chromium >/dev/null
