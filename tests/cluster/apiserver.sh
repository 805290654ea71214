#!/usr/bin/env bash
# Stop or (re)start only the kube-apiserver of a cluster started by up.sh, with
# exactly the command line, port and etcd recorded at up time
# (WORKDIR/run/kube-apiserver.cmd). For tests of "apiserver goes away and comes back".
#
#   tests/cluster/apiserver.sh stop|start|restart|status [WORKDIR]
#
# start waits until /readyz answers (up to 240 s). status exits 0 if it is running.
set -euo pipefail
TC_SCRIPT=apiserver.sh
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ACTION=${1:-}; WORK=${2:-$TC_DEFAULT_WORK}
case $ACTION in stop|start|restart|status) ;; *)
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
[ -f "$WORK/run/kube-apiserver.cmd" ] || tc_die "no cluster recorded in $WORK (run up.sh first)"
WORK=$(cd "$WORK" && pwd)

start() {
  if tc_pid kube-apiserver >/dev/null; then tc_log "kube-apiserver already running"; return 0; fi
  tc_pid etcd >/dev/null || tc_die "etcd is not running; use up.sh"
  local cmd
  eval "cmd=($(cat "$WORK/run/kube-apiserver.cmd"))"
  tc_launch kube-apiserver "${cmd[@]}" || exit 1
  TC_WAIT_FOR=kube-apiserver tc_wait 240 "kube-apiserver /readyz" tc_api_get /readyz || {
    tail -n 40 "$WORK/logs/kube-apiserver.log" >&2; exit 1; }
  tc_log "kube-apiserver ready"
}

case $ACTION in
  stop) tc_stop kube-apiserver 30 ;;
  start) start ;;
  restart) tc_stop kube-apiserver 30; start ;;
  status) tc_pid kube-apiserver >/dev/null ;;
esac
