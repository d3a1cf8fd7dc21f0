#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver (/usr/bin/chromium, /usr/bin/chromedriver) for the
# dashboard's browser test, unless they are there already. Idempotent; prints nothing on success.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
echo "[browser] installing chromium and chromium-driver (apt)" >&2
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq chromium chromium-driver >&2
