#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver for the MLflow-UI browser test (no browser download by any test tool).
# Idempotent; needs root (CI runs as root on this machine kind).
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
echo "== installing Debian chromium + chromium-driver (browser test)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || {
  apt-get update -q >/dev/null
  apt-get install -y -q chromium chromium-driver >/dev/null
}
/usr/bin/chromium --version
