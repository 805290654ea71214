# shellcheck shell=bash
# Helpers shared by up.sh, down.sh and apiserver.sh. Sourced, not executed.

TC_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TC_REPO=$(cd "$TC_HERE/../.." && pwd)
# shellcheck disable=SC2034 # used by the scripts that source this file
TC_DEFAULT_WORK=${TESTCLUSTER_WORK:-$TC_REPO/target/testcluster}

# Components in start order; down.sh stops them in reverse.
# shellcheck disable=SC2034
TC_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

tc_log() { echo "${TC_SCRIPT:-testcluster}: $*" >&2; }
tc_die() { tc_log "ERROR: $*"; exit 1; }

# tc_pid NAME -> prints the recorded pid (also the process group id) if that
# process is alive and is the recorded binary (argv[0] ends in /NAME); fails otherwise.
tc_pid() {
  local f="$WORK/run/$1.pid" pid argv0 state
  [ -f "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  case $pid in ''|*[!0-9]*) return 1 ;; esac
  # Guard against pid reuse (and a child that has not exec'd yet): argv[0] must be our binary.
  IFS= read -r -d '' argv0 <"/proc/$pid/cmdline" 2>/dev/null || return 1
  [ "${argv0##*/}" = "$1" ] || return 1
  # A zombie is as good as gone.
  read -r _ _ state _ <"/proc/$pid/stat" 2>/dev/null || return 1
  [ "$state" != Z ] || return 1
  echo "$pid"
}

# tc_launch NAME CMD... : start CMD in its own session/process group, detached
# from the terminal, stdout+stderr appended to logs/NAME.log, pid in run/NAME.pid.
tc_launch() {
  local name=$1; shift
  mkdir -p "$WORK/logs" "$WORK/run"
  echo "---- $(date -u +%FT%TZ) starting: $*" >>"$WORK/logs/$name.log"
  # Non-interactive bash: the background child is not a group leader, so setsid
  # calls setsid(2) in place and execs -> $! is the pid, pgid and sid.
  # fds 8/9 are the up/down and build locks: the daemons must not inherit them.
  setsid "$@" </dev/null >>"$WORK/logs/$name.log" 2>&1 8>&- 9>&- &
  local pid=$! i
  echo "$pid" >"$WORK/run/$name.pid"
  # Until the forked shell has exec'd (setsid, maybe env, then the binary) the pid
  # does not look like NAME yet; wait for that so tc_pid is meaningful afterwards.
  for ((i = 0; i < 300; i++)); do
    tc_pid "$name" >/dev/null && return 0
    [ -d "/proc/$pid" ] || break
    sleep 0.05
  done
  tc_log "failed to start $name (see $WORK/logs/$name.log)"
  return 1
}

# tc_stop NAME [TIMEOUT_S] : SIGTERM the process group, wait, then SIGKILL.
tc_stop() {
  local name=$1 timeout=${2:-30} pid i
  pid=$(tc_pid "$name") || { rm -f "$WORK/run/$name.pid"; return 0; }
  tc_log "stopping $name (pgid $pid)"
  kill -TERM -- "-$pid" 2>/dev/null || true
  for ((i = 0; i < timeout * 10; i++)); do
    tc_pid "$name" >/dev/null || break
    sleep 0.1
  done
  if tc_pid "$name" >/dev/null; then
    tc_log "$name did not exit after ${timeout}s, sending SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do tc_pid "$name" >/dev/null || break; sleep 0.1; done
  fi
  # Anything left in the group (children) goes too.
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$WORK/run/$name.pid"
}

# tc_wait TIMEOUT_S WHAT CMD... : poll CMD every 0.5 s until it succeeds.
# Fails early if the component named by $TC_WAIT_FOR (if set) has died.
tc_wait() {
  local timeout=$1 what=$2 i; shift 2
  for ((i = 0; i < timeout * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if [ -n "${TC_WAIT_FOR:-}" ] && ! tc_pid "$TC_WAIT_FOR" >/dev/null; then
      tc_log "$TC_WAIT_FOR exited while waiting for $what"
      return 1
    fi
    sleep 0.5
  done
  tc_log "timed out after ${timeout}s waiting for $what"
  return 1
}

tc_tails() {
  local f
  for f in "$WORK"/logs/*.log; do
    [ -f "$f" ] || continue
    echo "======== tail -n 60 $f" >&2
    tail -n 60 "$f" >&2
  done
}

# tc_free_port VAR : store a free TCP port on 127.0.0.1 (not handed out before
# by this script) in VAR. Ports are probed, not held, so there is a tiny race.
tc_free_port() {
  local p
  while :; do
    p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()' 2>/dev/null) \
      || p=$(( 20000 + RANDOM % 30000 ))
    case " ${TC_TAKEN:-} " in *" $p "*) continue ;; esac
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then continue; fi   # in use
    TC_TAKEN="${TC_TAKEN:-} $p"
    printf -v "$1" '%s' "$p"
    return 0
  done
}

# curl against the apiserver with the admin client certificate.
tc_api_get() {
  curl -fsS --max-time 5 --cacert "$WORK/pki/ca.crt" --cert "$WORK/pki/admin.crt" \
    --key "$WORK/pki/admin.key" "https://$(cat "$WORK/run/apiserver.host" 2>/dev/null || echo 127.0.0.1):$(cat "$WORK/run/apiserver.port")$1"
}
