#!/usr/bin/env bash
# Installs the system packages the build needs (libxml2 headers, pkg-config, libclang for
# bindgen) when they are missing; with `--browser` Chromium too (the dashboard's tests drive it
# headless), with `--nats` nats-server (the scale-out tests run a real one, with JetStream).
# Safe to run again: it does nothing when all are present.
set -euo pipefail

missing=()
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
if ! pkg-config --exists libxml-2.0 2>/dev/null; then missing+=(libxml2-dev); fi
if ! ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 \
   || ! ls /usr/lib/llvm-*/include/clang-c >/dev/null 2>&1; then
  missing+=(libclang-dev)
fi
for flag in "$@"; do
  case "$flag" in
    --browser)
      command -v chromium >/dev/null 2>&1 || missing+=(chromium)
      command -v curl >/dev/null 2>&1 || missing+=(curl) ;;
    --nats) command -v nats-server >/dev/null 2>&1 || missing+=(nats-server) ;;
    *) echo "ensure-system-deps.sh: unknown flag $flag (known: --browser, --nats)" >&2; exit 2 ;;
  esac
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "agentserver: installing system packages: ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "agentserver: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# An install cut off half-way (a killed earlier run) leaves dpkg refusing every install until
# its configuration is finished.
if [ -n "$(ls -A /var/lib/dpkg/updates 2>/dev/null)" ]; then
  echo "agentserver: finishing an interrupted package install (dpkg --configure -a)" >&2
  $sudo dpkg --configure -a
fi
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
