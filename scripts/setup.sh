#!/usr/bin/env bash
# Idempotent set-up for `make demo` and `make test`: a .venv with torch 2.13.0 (CPU) and the project, and,
# as root, the Debian packages and daemons that the fault families need. Safe to run again and again.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
TORCH_VERSION=2.13.0   # pinned: this version comes as a CPU build from local disk; others download GBs

log() { printf '[setup] %s\n' "$*"; }

# --- system packages (root only; each installed only when missing) -------------------------------------
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    need=()
    command -v iptables >/dev/null 2>&1 || need+=(iptables)
    command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
    command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
    command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
    command -v ip >/dev/null 2>&1 || need+=(iproute2)
    command -v pgrep >/dev/null 2>&1 || need+=(procps)
    command -v haproxy >/dev/null 2>&1 || need+=(haproxy)   # the serving fleet scenario's load balancer
    command -v strace >/dev/null 2>&1 || need+=(strace)     # checkpoint_torn_write cuts a save at a byte offset
    command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev) # the clock fault's shim (native/clockshift.c)
    # the Slurm testbed (`mlchaos testbed up --slurm`): Debian's slurm-wlm is exactly these three, plus munge
    command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
    command -v slurmd >/dev/null 2>&1 || [ -x /usr/sbin/slurmd ] || need+=(slurmd)
    command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
    command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
    command -v etcd >/dev/null 2>&1 || need+=(etcd-server)   # `mlchaos testbed up --etcd`: the etcd-v2 store scenario
    if [ ${#need[@]} -gt 0 ]; then
        log "installing Debian packages: ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq || log "apt-get update failed; trying the install anyway"
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
            || log "WARNING: could not install ${need[*]}; tests needing them will skip with the reason"
    fi
else
    log "not root (or no apt-get): skipping system packages; tests needing them skip with the reason"
fi

# --- daemons (root only) ---------------------------------------------------------------------------------
if [ "$(id -u)" = "0" ]; then
    bash scripts/start-dockerd.sh || log "WARNING: no Docker daemon; Docker tests skip with the reason"
fi

# --- python environment ---------------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    log "installing torch==$TORCH_VERSION (CPU)"
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
fi
stamp="$VENV/.mlchaos-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing mlchaos (editable) with dev extras"
    "$VENV/bin/pip" install -q -e ".[dev]" "torch==$TORCH_VERSION"
    touch "$stamp"
fi
if ! "$VENV/bin/python" -c "import torchft" 2>/dev/null; then
    log "installing the torchft extra (pinned in pyproject.toml) for the torchft scenarios"
    "$VENV/bin/pip" install -q -e ".[torchft]" "torch==$TORCH_VERSION" \
        || log "WARNING: torchft did not install; the torchft tests skip with the reason"
fi
if ! "$VENV/bin/python" -c "import lightning" 2>/dev/null; then
    log "installing the lightning extra for the Lightning callback's test (12 s here, torch untouched)"
    "$VENV/bin/pip" install -q -e ".[lightning]" "torch==$TORCH_VERSION" \
        || log "WARNING: lightning did not install; the Lightning test skips with the reason"
fi
if ! "$VENV/bin/python" -c "import etcd" 2>/dev/null; then
    log "installing the etcd extra (python-etcd) for torch's etcd-v2 rendezvous (rdzv_backend: etcd-v2)"
    "$VENV/bin/pip" install -q -e ".[etcd]" "torch==$TORCH_VERSION" \
        || log "WARNING: python-etcd did not install; the etcd store test skips with the reason"
fi
# The clock fault's LD_PRELOAD shim, rebuilt when its source is newer (injectors/clock/shim.py finds it here).
shim="$VENV/lib/mlchaos/clockshift.so"
if [ ! -f "$shim" ] || [ native/clockshift.c -nt "$shim" ]; then
    if command -v gcc >/dev/null 2>&1; then
        log "building the clock shim ($shim)"
        mkdir -p "$(dirname "$shim")"
        gcc -O2 -shared -fPIC -Wall -Wextra -Werror -o "$shim.tmp" native/clockshift.c -ldl && mv "$shim.tmp" "$shim" \
            || log "WARNING: the clock shim did not build; clock faults are refused with the reason"
    else
        log "WARNING: no gcc: the clock shim is not built; clock faults are refused with the reason"
    fi
fi
# Byte-code for the checkout's own modules (1 s; up-to-date files are skipped): where PYTHONDONTWRITEBYTECODE is
# set, as in this project's CI image, every process (each rank, each CLI call) would compile them from source again.
"$VENV/bin/python" -m compileall -q -j 0 chaos injectors tests benchmarks >/dev/null \
    || log "WARNING: byte-compiling the checkout failed; every process compiles it from source"
log "ready: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), $("$VENV/bin/mlchaos" --help >/dev/null && echo mlchaos ok)"
