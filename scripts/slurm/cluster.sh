#!/usr/bin/env bash
# A private one-node Slurm cluster for testing this project's batch scripts.
#
#   cluster.sh install          install slurm-wlm and munge when missing (apt-get)
#   cluster.sh start  [DIR]     start munged, slurmctld, slurmd; wait until the node is idle
#   cluster.sh stop   [DIR]     cancel jobs, stop the daemons, wait until they are gone
#   cluster.sh status [DIR]     exit 0 when the cluster in DIR is up and its node usable
#
# Everything (slurm.conf, munge key and socket, state, spool, logs, pid files) lives in DIR,
# so the cluster never touches /etc/slurm, /etc/munge or a cluster this machine belongs to:
# its own munge key, its own munge socket, free TCP ports, a node name of its own.
# DIR defaults to $CPU_DIST_SLURM_DIR; `start` without either makes a fresh folder under
# ${TMPDIR:-/tmp}. `start` prints one line, SLURM_CONF=DIR/slurm.conf, on stdout (messages go
# to stderr) and writes DIR/env.sh; export SLURM_CONF (or source env.sh) before sbatch/srun.
# `start` is idempotent: on a DIR whose cluster is up it only prints that line again.
# No systemd: the daemons are started directly and stopped by the pids they recorded.
set -euo pipefail

readonly START_TIMEOUT_S="${CPU_DIST_SLURM_START_TIMEOUT:-60}"
readonly STOP_TIMEOUT_S="${CPU_DIST_SLURM_STOP_TIMEOUT:-30}"

log() { echo "cluster.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# --- install -----------------------------------------------------------------------------

have_slurm() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null &&
        command -v srun >/dev/null && command -v munged >/dev/null && command -v mungekey >/dev/null
}

do_install() {
    if have_slurm; then return 0; fi
    [[ $(id -u) -eq 0 ]] || die "slurm-wlm/munge are missing and installing them needs root"
    command -v apt-get >/dev/null || die "slurm-wlm/munge are missing and there is no apt-get"
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    # A stale package index is the usual reason for a failed install: update once, retry.
    if ! apt-get install -y -q slurm-wlm munge >&2; then
        apt-get update -q >&2 || true
        apt-get install -y -q slurm-wlm munge >&2 || die "apt-get install slurm-wlm munge failed"
    fi
    have_slurm || die "slurm-wlm/munge installed but their programs are not on PATH"
}

# --- helpers -----------------------------------------------------------------------------

# A TCP port nobody listens on, from the dynamic range. Connecting to a closed loopback port
# fails at once, so this probe is fast; the small race with other programs is harmless for a
# test cluster (the daemon would fail to bind and `start` would report it).
free_port() {
    local port i
    for i in $(seq 1 200); do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
            echo "${port}"
            return 0
        fi
    done
    die "found no free TCP port"
}

# Alive and not a zombie: a daemon that exited stays a zombie until its parent (here often
# pid 1, which in some containers never reaps) collects it, and kill -0 still succeeds on it.
pid_alive() {
    [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null || return 1
    local state
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)
    [[ "${state}" != Z && "${state}" != X ]]
}

read_pid() { [[ -s "$1" ]] && tr -dc '0-9' <"$1" || true; }

# Wait until "$@" succeeds or $1 seconds pass; returns the command's last status.
wait_for() {
    local timeout_s=$1
    shift
    local deadline=$((SECONDS + timeout_s))
    while ! "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

resolve_dir() {
    local dir="${1:-${CPU_DIST_SLURM_DIR:-}}"
    [[ -n "${dir}" ]] || return 1
    # An absolute path: slurm.conf and the daemons must not depend on the caller's cwd.
    mkdir -p "${dir}"
    (cd "${dir}" && pwd -P)
}

# --- configuration -----------------------------------------------------------------------

write_config() {
    local dir=$1
    local ctld_port slurmd_port host cpus node cluster user
    user=$(id -un)
    ctld_port=$(free_port)
    slurmd_port=$(free_port)
    while [[ "${slurmd_port}" == "${ctld_port}" ]]; do slurmd_port=$(free_port); done
    host=$(hostname -s)
    cpus=$(nproc)
    node="cpudist${ctld_port}"
    cluster="cpudist${ctld_port}"
    mkdir -p "${dir}"/{munge,state,spool,log,run,tmp}
    chmod 700 "${dir}" "${dir}/munge"
    # An empty plugin stack: /etc/slurm/plugstack.conf belongs to the machine, not to us.
    : >"${dir}/plugstack.conf"
    cat >"${dir}/slurm.conf" <<EOF
# Private one-node test cluster written by scripts/slurm/cluster.sh; nothing outside
# ${dir} is read or written by it.
ClusterName=${cluster}
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
SlurmUser=${user}
SlurmdUser=${user}
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job is held (Reason=BeginTime) for cred_expire + 1 s before it may
# start again; Slurm's default of 120 s made the requeue test wait two minutes. 10 s still
# leaves a launch credential ample time to reach slurmd on a busy node (the minimum is 5).
AuthInfo=socket=${dir}/munge/munge.socket,cred_expire=10
StateSaveLocation=${dir}/state
SlurmdSpoolDir=${dir}/spool
SlurmctldPidFile=${dir}/run/slurmctld.pid
SlurmdPidFile=${dir}/run/slurmd.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd.log
PlugStackConfig=${dir}/plugstack.conf
TmpFS=${dir}/tmp
# No cgroups, no systemd: plain /proc process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobContainerType=job_container/none
SwitchType=switch/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# The main scheduling pass every second (default 60 s): a job whose begin time passes, as a
# requeued job's does, starts only at that pass, not on an event such as a submit.
SchedulerParameters=sched_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MailProg=/bin/true
# sbatch --wait polls every 2 s only while 2 s < MinJobAge/2; beyond that its interval
# grows to 8 s and 32 s, which would dominate the time of a short job.
MinJobAge=4
KillWait=5
InactiveLimit=0
SlurmdTimeout=300
SlurmctldTimeout=120
NodeName=${node} NodeAddr=127.0.0.1 NodeHostname=${host} CPUs=${cpus} State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    echo "${node}" >"${dir}/node_name"
    echo "export SLURM_CONF=${dir}/slurm.conf" >"${dir}/env.sh"
}

# --- status ------------------------------------------------------------------------------

# The node's state as sinfo sees it (idle, mixed, allocated, down*, ...), or nothing.
node_state() {
    local dir=$1
    SLURM_CONF="${dir}/slurm.conf" timeout 10 sinfo -h -N -n "$(cat "${dir}/node_name")" -o '%T' 2>/dev/null || true
}

node_idle() { [[ "$(node_state "$1")" == idle ]]; }

daemons_alive() {
    local dir=$1
    pid_alive "$(read_pid "${dir}/run/munged.pid")" &&
        pid_alive "$(read_pid "${dir}/run/slurmctld.pid")" &&
        pid_alive "$(read_pid "${dir}/run/slurmd.pid")"
}

cluster_up() {
    local dir=$1 state
    [[ -f "${dir}/slurm.conf" ]] || return 1
    daemons_alive "${dir}" || return 1
    state=$(node_state "${dir}")
    # Busy is fine for `status`; an unusable node (down, drained, not responding) is not.
    [[ "${state}" =~ ^(idle|mixed|allocated|completing)$ ]]
}

do_status() {
    local dir
    dir=$(resolve_dir "${1:-}") || die "no cluster folder given (argument or CPU_DIST_SLURM_DIR)"
    if cluster_up "${dir}"; then
        log "up: ${dir} (node $(cat "${dir}/node_name"): $(node_state "${dir}"))"
        return 0
    fi
    log "not up: ${dir}"
    return 1
}

# --- start -------------------------------------------------------------------------------

show_logs() {
    local dir=$1 f
    for f in "${dir}"/log/*.log; do
        [[ -f "$f" ]] || continue
        log "---- last lines of $f"
        tail -n 20 "$f" >&2 || true
    done
}

start_munged() {
    local dir=$1
    if pid_alive "$(read_pid "${dir}/run/munged.pid")"; then return 0; fi
    if [[ ! -s "${dir}/munge/munge.key" ]]; then
        mungekey --create --keyfile="${dir}/munge/munge.key" >&2 ||
            dd if=/dev/urandom of="${dir}/munge/munge.key" bs=1024 count=1 status=none
        chmod 400 "${dir}/munge/munge.key"
    fi
    # --force: munged refuses some ownership/permission layouts (e.g. root, a folder under
    # /tmp); the folder is ours and mode 700, so overriding those checks is safe here.
    munged --force \
        --socket="${dir}/munge/munge.socket" \
        --key-file="${dir}/munge/munge.key" \
        --pid-file="${dir}/run/munged.pid" \
        --log-file="${dir}/log/munged.log" \
        --seed-file="${dir}/munge/munged.seed" \
        </dev/null >>"${dir}/log/munged.out" 2>&1 || return 1
    wait_for 10 munge_works "${dir}"
}

munge_works() {
    munge -n -S "$1/munge/munge.socket" 2>/dev/null | unmunge -S "$1/munge/munge.socket" >/dev/null 2>&1
}

start_slurmctld() {
    local dir=$1
    if pid_alive "$(read_pid "${dir}/run/slurmctld.pid")"; then return 0; fi
    # -c: a fresh controller state every time; -i: ignore state it cannot read.
    slurmctld -c -i -f "${dir}/slurm.conf" </dev/null >>"${dir}/log/slurmctld.out" 2>&1 || return 1
    wait_for 20 ctld_ping "${dir}"
}

ctld_ping() { SLURM_CONF="$1/slurm.conf" timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurmd() {
    local dir=$1
    if pid_alive "$(read_pid "${dir}/run/slurmd.pid")"; then return 0; fi
    slurmd -f "${dir}/slurm.conf" -N "$(cat "${dir}/node_name")" </dev/null \
        >>"${dir}/log/slurmd.out" 2>&1 || return 1
    wait_for 10 pid_alive_file "${dir}/run/slurmd.pid"
}

pid_alive_file() { pid_alive "$(read_pid "$1")"; }

do_start() {
    local dir="${1:-${CPU_DIST_SLURM_DIR:-}}"
    if [[ -z "${dir}" ]]; then
        dir=$(mktemp -d "${TMPDIR:-/tmp}/cpu_dist-slurm.XXXXXX")
    fi
    dir=$(resolve_dir "${dir}")
    if cluster_up "${dir}"; then
        log "already up: ${dir}"
        echo "SLURM_CONF=${dir}/slurm.conf"
        return 0
    fi
    do_install
    # Half-started leftovers (a crashed daemon, a stale pid file) are stopped first, so a
    # retry starts from a known state; the config (ports, key) is kept when it exists.
    stop_daemons "${dir}"
    [[ -f "${dir}/slurm.conf" ]] || write_config "${dir}"
    local t0=${SECONDS}
    if ! start_munged "${dir}"; then
        show_logs "${dir}"
        stop_daemons "${dir}"
        die "munged did not start"
    fi
    if ! start_slurmctld "${dir}"; then
        show_logs "${dir}"
        stop_daemons "${dir}"
        die "slurmctld did not start"
    fi
    if ! start_slurmd "${dir}" || ! wait_for "${START_TIMEOUT_S}" node_idle "${dir}"; then
        log "node state: '$(node_state "${dir}")'"
        show_logs "${dir}"
        stop_daemons "${dir}"
        die "the node did not become idle within ${START_TIMEOUT_S} s"
    fi
    log "up in $((SECONDS - t0)) s: ${dir} (node $(cat "${dir}/node_name"))"
    echo "SLURM_CONF=${dir}/slurm.conf"
}

# --- stop --------------------------------------------------------------------------------

# Send TERM to a recorded pid, wait, then KILL; only that pid, never a name pattern.
stop_pid() {
    local name=$1 pidfile=$2 pid
    pid=$(read_pid "${pidfile}")
    if pid_alive "${pid}"; then
        kill -TERM "${pid}" 2>/dev/null || true
        if ! wait_for "${STOP_TIMEOUT_S}" not_alive "${pid}"; then
            log "${name} (pid ${pid}) ignored TERM; killing it"
            kill -KILL "${pid}" 2>/dev/null || true
            wait_for 5 not_alive "${pid}" || log "warning: ${name} (pid ${pid}) is still alive"
        fi
    fi
    rm -f "${pidfile}"
}

not_alive() { ! pid_alive "$1"; }

none_alive() {
    local pid
    for pid in "$@"; do pid_alive "${pid}" && return 1; done
    return 0
}

# Job processes (slurmstepd and the tasks under it) outlive slurmd. A slurmstepd is ours when
# it holds a file of DIR open (slurmd's log, its spool sockets); it and its descendants are
# stopped by pid, never by a name pattern.
cluster_pids() {
    local dir=$1 p exe steps="" ppid
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        exe=$(readlink "/proc/$p/exe" 2>/dev/null || true)
        if [[ "${exe}" == */slurmstepd* ]] &&
            ls -l "/proc/$p/fd" 2>/dev/null | grep -qF -- "-> ${dir}/"; then
            steps+=" $p"
        fi
    done
    [[ -n "${steps}" ]] || return 0
    # Descendants: repeat the ppid scan until the set stops growing.
    local set=" ${steps} " grew=1
    while ((grew)); do
        grew=0
        for p in /proc/[0-9]*; do
            p=${p#/proc/}
            [[ "${set}" == *" $p "* ]] && continue
            ppid=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || true)
            if [[ -n "${ppid}" && "${set}" == *" ${ppid} "* ]]; then
                set+="$p "
                grew=1
            fi
        done
    done
    echo ${set}
}

no_jobs() { [[ -z "$(SLURM_CONF="$1/slurm.conf" timeout 10 squeue -h -o %i 2>/dev/null)" ]]; }

stop_daemons() {
    local dir=$1
    [[ -d "${dir}/run" ]] || return 0
    if [[ -f "${dir}/slurm.conf" ]] && pid_alive "$(read_pid "${dir}/run/slurmctld.pid")"; then
        SLURM_CONF="${dir}/slurm.conf" timeout 10 scancel --full --quiet -u "$(id -un)" 2>/dev/null || true
        wait_for "${STOP_TIMEOUT_S}" no_jobs "${dir}" || log "warning: jobs still listed after scancel"
    fi
    stop_pid slurmd "${dir}/run/slurmd.pid"
    stop_pid slurmctld "${dir}/run/slurmctld.pid"
    local pids pid
    pids=$(cluster_pids "${dir}")
    if [[ -n "${pids}" ]]; then
        log "ending job processes left by slurmd: ${pids}"
        # slurmstepd and srun do not simply exit on TERM: give all of them 5 s together.
        for pid in ${pids}; do kill -TERM "${pid}" 2>/dev/null || true; done
        wait_for 5 none_alive ${pids} || true
        for pid in ${pids}; do pid_alive "${pid}" && kill -KILL "${pid}" 2>/dev/null; done
        wait_for 5 none_alive ${pids} || log "warning: still alive: ${pids}"
    fi
    stop_pid munged "${dir}/run/munged.pid"
}

do_stop() {
    local dir
    dir=$(resolve_dir "${1:-}") || die "no cluster folder given (argument or CPU_DIST_SLURM_DIR)"
    stop_daemons "${dir}"
    log "stopped: ${dir}"
}

case "${1:-}" in
install) do_install ;;
start) do_start "${2:-}" ;;
stop) do_stop "${2:-}" ;;
status) do_status "${2:-}" ;;
*)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
