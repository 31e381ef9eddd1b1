#!/usr/bin/env bash
# Install what turnstream needs from the system when it is missing (Debian or Ubuntu):
# Java 17+ and Maven (the local Kafka broker), make, kcat (interop tests), venv support for python3,
# headless Chromium and its driver (the console's browser test).
# Everything else (Python packages, the broker's jars, the model) the Makefile fetches itself.
set -euo pipefail

need() { command -v "$1" >/dev/null 2>&1; }
packages=()
need java || packages+=(default-jre-headless)
need mvn || packages+=(maven)
need make || packages+=(make)
need kcat || need kafkacat || packages+=(kcat)
python3 -c "import ensurepip, venv" 2>/dev/null || packages+=(python3-venv)
need chromium || packages+=(chromium)
need chromedriver || packages+=(chromium-driver)
[ ${#packages[@]} -eq 0 ] && exit 0

if ! need apt-get; then
  echo "missing: ${packages[*]} (install them; this script knows apt-get only)" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing ${packages[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}"
version=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ "${version:-0}" -lt 17 ]; then
  echo "Java ${version:-?} is too old: the Kafka broker needs 17 or newer" >&2
  exit 1
fi
