#!/bin/bash
# Issue 58's sweep, run outside the repository (docs/offpolicy-cpu.md, "How the sweep runs").
#   sweep.sh start       remake the fixed clone if this machine lost it, then resume the sweep
#                        (a run with checkpoints resumes; a run recorded here is skipped)
#   sweep.sh pause|cont  stop and continue every process of it (for an idle measurement)
#   sweep.sh stop        end it (the next start resumes from checkpoints)
#   sweep.sh status      whether it runs, the runs recorded and the log's last line
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
RUNS=${RUNS:-/work/runs/offpolicy-cpu}
PY=${PY:-$REPO/.venv/bin/python}

tree() { pstree -p "$(cat "$RUNS/pid")" | grep -o '([0-9]*)' | tr -d '()'; }
running() { [ -f "$RUNS/pid" ] && kill -0 "$(cat "$RUNS/pid")" 2>/dev/null; }

case "${1:-status}" in
start)
  if running; then echo "already running (pid $(cat "$RUNS/pid"))"; exit 0; fi
  if [ ! -d "$RUNS/src" ]; then
    mkdir -p "$RUNS/records"
    git clone -q "$REPO" "$RUNS/src"
    git -C "$RUNS/src" checkout -q 61ceb3b
    git -C "$RUNS/src" -c user.name=sapo -c user.email=sapo@local am -q \
      "$REPO/docs/offpolicy-cpu/clone.patch"
    echo "clone remade at $(git -C "$RUNS/src" rev-parse --short HEAD) (61ceb3b + clone.patch)"
  fi
  mkdir -p "$RUNS/records"
  cp -rn "$REPO"/docs/offpolicy-cpu/records/* "$RUNS/records/"  # committed runs are skipped
  cd "$RUNS/src"
  export PYTHONPATH=$RUNS/src HF_HUB_OFFLINE=1 DO_NOT_TRACK=true PREFECT_SERVER_ANALYTICS_ENABLED=false
  setsid nohup nice -n 19 "$PY" -c 'from flows.cli import main; main()' experiment \
    -c examples/offpolicy-cpu.yaml --records "$RUNS/records" >> "$RUNS/sweep.log" 2>&1 &
  echo $! > "$RUNS/pid"
  echo "started (pid $!), log $RUNS/sweep.log"
  ;;
pause) for p in $(tree); do kill -STOP "$p" 2>/dev/null || true; done ;;
cont) for p in $(tree); do kill -CONT "$p" 2>/dev/null || true; done ;;
stop)
  pids=$(tree)
  for p in $pids; do kill -CONT "$p" 2>/dev/null || true; kill -TERM "$p" 2>/dev/null || true; done
  sleep 10
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  ;;
status)
  if running; then echo "running (pid $(cat "$RUNS/pid"))"; else echo "not running"; fi
  echo "recorded: $(ls "$RUNS/records" 2>/dev/null | wc -l) of 30"
  tail -n 1 "$RUNS/sweep.log" 2>/dev/null || true
  ;;
*) echo "usage: sweep.sh start|pause|cont|stop|status" >&2; exit 2 ;;
esac
