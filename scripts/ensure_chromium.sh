#!/usr/bin/env bash
# Make sure a headless Chromium is available for tests/test_built_book.py.
# Uses CHROMIUM if set, else chromium / chromium-browser / google-chrome on PATH; on a
# Debian-like machine where we are root, installs Debian's `chromium` package.
set -euo pipefail
for c in "${CHROMIUM:-}" chromium chromium-browser google-chrome; do
  if [ -n "$c" ] && command -v "$c" >/dev/null 2>&1; then
    echo "browser: $(command -v "$c")"; exit 0
  fi
done
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "browser: installing Debian's chromium package"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  command -v chromium
  exit 0
fi
echo "browser: no Chromium found. Install Debian/Ubuntu's 'chromium' package (or set CHROMIUM to a Chrome/Chromium executable); the browser test needs it." >&2
exit 1
