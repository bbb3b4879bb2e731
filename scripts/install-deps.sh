#!/usr/bin/env bash
# Installs crun's build and test dependencies, all from Debian 12 packages. Idempotent.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q \
  build-essential cmake ninja-build ccache pkg-config \
  libboost-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libabsl-dev libssl-dev libc-ares-dev libre2-dev zlib1g-dev \
  libspdlog-dev libcli11-dev nlohmann-json3-dev catch2 libgloo-dev libtorch-dev libxxhash-dev \
  python3 python3-venv python3-torch python3-wheel python3-yaml dpkg-dev \
  iproute2 nftables procps time openssl elfutils gdb \
  slurmctld slurmd slurm-client munge \
  etcd-server etcd-client golang-etcd-server-dev \
  clang libclang-rt-14-dev clang-format-14
# Prometheus (its server scrapes crun in the tests; promtool checks the page), without the
# node exporter it recommends.
$SUDO apt-get install -y -q --no-install-recommends prometheus
# A real browser for the goodput timeline's test (headless, from Debian: nothing downloads one).
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
