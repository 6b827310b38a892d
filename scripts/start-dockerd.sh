#!/usr/bin/env bash
# Start dockerd when it is not running (idempotent), for the Docker transport's tests and testbed.
# --iptables=false: the daemon must not rewrite this machine's root iptables (mlchaos faults live in
# namespaces; a user's own daemon keeps its settings: this script leaves a running daemon alone).
# Exit 0 when a daemon answers; exit 1 with the reason otherwise (tests then skip with that reason).
set -uo pipefail
log() { printf '[dockerd] %s\n' "$*"; }
if docker info >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then log "not root: cannot start dockerd"; exit 1; fi
if ! command -v dockerd >/dev/null 2>&1; then log "dockerd is not installed (Debian package docker.io)"; exit 1; fi
logfile=/var/log/mlchaos-dockerd.log
log "starting dockerd (log: $logfile)"
setsid nohup dockerd --iptables=false >"$logfile" 2>&1 </dev/null &
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then log "dockerd is up"; exit 0; fi
    sleep 0.5
done
log "dockerd did not answer within 30 s; last log lines:"
tail -5 "$logfile" >&2
exit 1
