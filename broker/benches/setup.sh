#!/bin/sh
# Installs the servers the brokers benchmark runs beside fissionlog-broker
# (nats-server for NATS JetStream, redis-server for Redis Streams) from
# Debian's packages when they are missing. The benchmark starts them itself,
# as child processes on free loopback ports: the services the packages may
# enable are not needed (and are stopped if this script started them).
#
#   broker/benches/setup.sh
#   cargo bench -p fissionlog-broker --bench brokers
set -eu

missing=""
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || missing="$missing nats-server"
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || missing="$missing redis-server"

if [ -z "$missing" ]; then
    echo "nats-server and redis-server are installed"
    exit 0
fi

sudo=""
if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
fi

echo "installing:$missing"
$sudo apt-get update -qq
# policy-rc.d may or may not keep the packages' services from starting;
# the benchmark does not use them either way.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing
for s in $missing; do
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$s" 2>/dev/null; then
        $sudo systemctl stop "$s" || true
    fi
done
nats-server --version 2>/dev/null || /usr/sbin/nats-server --version
redis-server --version
