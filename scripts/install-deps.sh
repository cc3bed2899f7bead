#!/usr/bin/env bash
# Installs every build and test dependency of attnres from Debian 12 packages.
# Idempotent: re-running it only re-checks what is installed.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev nlohmann-json3-dev libcli11-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  clang clang-format libclang-rt-14-dev
  python3 python3-jinja2
  libboost-dev
  openmpi-bin libopenmpi-dev bc
)
# Node.js and npm run the openai-client tests of `attnres serve` (tests/npm). A machine that has
# node from elsewhere (it brings its own npm) keeps it; Debian's packages fill what is missing.
if ! command -v node >/dev/null 2>&1; then
  pkgs+=(nodejs npm)
elif ! command -v npm >/dev/null 2>&1; then
  pkgs+=(npm)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all ${#pkgs[@]} packages present"
