#!/bin/sh
# devicelab payload runner: runs one payload under the telemetry sampler.
#
# usage: run_payload.sh OUTDIR INTERVAL_MS ROOT -- COMMAND [ARG...]
#
# OUTDIR receives: stdout.tsv (each stdout line prefixed by its arrival time on the sampler's clock and
# a tab), stderr.txt, telemetry.csv (sampler.sh), clock (start/end on the sampler clock and the
# epoch), pids, exit_code. The runner's exit status is the payload's.
set -u
outdir=$1; interval=$2; root=$3; shift 3
[ "${1:-}" = "--" ] && shift
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$outdir" || exit 125
now() { up=""; { read -r up _ < /proc/uptime; } 2>/dev/null; echo "${up:-}"; }
fifo="$outdir/.stdout.fifo"
rm -f "$fifo"; mkfifo "$fifo" || exit 125
# optional resource conditions, recorded by the host in the cell's provenance:
#   DEVICELAB_CGROUP=DIR     run the payload inside this cgroup (CPU quota; made by cgroup.sh)
#   DEVICELAB_CONTENTION=N   N busy-looping shells co-run with the payload
#   DEVICELAB_NVIDIA_SMI=1   NVIDIA GPUs: nvidia-smi's power, memory, utilisation, temperature, SM clock and
#                            throttle reasons beside the payload at the sampler's interval, into nvidia-smi.csv
#   DEVICELAB_CURRENT=FILE   the device's "what runs now" file: OUTDIR is written to it while the payload runs (a
#                            later session stops what an earlier one, killed, left running: its pids are in OUTDIR)
#   DEVICELAB_LIMIT_S=N      stop the payload (TERM) once it has run N seconds: a payload that runs until stopped
#                            (a sustained-speed run); stopped so, its exit status is 0 and `clock` says limit_s=N
#   DEVICELAB_POWERMETRICS=root|sudo   macOS: powermetrics (the SoC's CPU/GPU/ANE energy, thermal pressure,
#                            cluster clocks) beside the payload into powermetrics.plist, as root or by `sudo -n`
spins=""
n=${DEVICELAB_CONTENTION:-0}
while [ "$n" -gt 0 ]; do
  sh -c 'while :; do :; done' & spins="$spins $!"
  n=$((n - 1))
done
pm=""
case ${DEVICELAB_POWERMETRICS:-} in
  root|sudo)
    pmi=$interval; [ "$pmi" -lt 100 ] && pmi=100
    asroot=""; [ "$DEVICELAB_POWERMETRICS" = sudo ] && asroot="sudo -n"
    $asroot powermetrics -i "$pmi" -b 1 -f plist -s cpu_power,gpu_power,thermal -o "$outdir/powermetrics.plist" \
      > /dev/null 2> "$outdir/powermetrics.err" &
    pm=$! ;;
esac
nv=""
if [ "${DEVICELAB_NVIDIA_SMI:-}" = 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=timestamp,index,name,power.draw,memory.used,utilization.gpu,temperature.gpu,clocks.sm,clocks_throttle_reasons.active \
    --format=csv,nounits -lms "$interval" > "$outdir/nvidia-smi.csv" 2> /dev/null &
  nv=$!
fi
{ echo "start_s=$(now)"; echo "start_epoch=$(date +%s)"; } > "$outdir/clock"
if [ -n "${DEVICELAB_CGROUP:-}" ]; then
  procs="$DEVICELAB_CGROUP/cgroup.procs"; [ -e "$procs" ] || procs="$DEVICELAB_CGROUP/tasks"
  ( echo 0 > "$procs" && exec "$@" ) > "$fifo" 2> "$outdir/stderr.txt" &
else
  "$@" > "$fifo" 2> "$outdir/stderr.txt" &
fi
pid=$!
lim=""
if [ -n "${DEVICELAB_LIMIT_S:-}" ]; then
  # a watcher that polls each second, so it ends within a second of a payload that ends on its own
  ( n=0
    while [ "$n" -lt "$DEVICELAB_LIMIT_S" ] && kill -0 "$pid" 2>/dev/null; do sleep 1; n=$((n + 1)); done
    kill -0 "$pid" 2>/dev/null && : > "$outdir/.limit" && kill "$pid" 2>/dev/null ) &
  lim=$!
fi
# the sampler moves itself to a shell that paces with `read -t` (no process per tick) when this one can't
${DEVICELAB_SAMPLER_SHELL:-sh} "$here/sampler.sh" -o "$outdir/telemetry.csv" -p "$pid" -i "$interval" -R "$root" &
spid=$!
spin_list=""
for sp in $spins; do spin_list="${spin_list:+$spin_list,}$sp"; done
echo "runner=$$ payload=$pid sampler=$spid${spin_list:+ spin=$spin_list}${pm:+ powermetrics=$pm}" > "$outdir/pids"
[ -n "${DEVICELAB_CURRENT:-}" ] && echo "$outdir" > "$DEVICELAB_CURRENT"
while IFS= read -r line; do
  up=""; { read -r up _ < /proc/uptime; } 2>/dev/null
  printf '%s\t%s\n' "$up" "$line"
done < "$fifo" > "$outdir/stdout.tsv"
wait "$pid"; rc=$?
if [ -n "$lim" ]; then
  wait "$lim" 2>/dev/null
  [ -e "$outdir/.limit" ] && { rc=0; rm -f "$outdir/.limit"; echo "limit_s=$DEVICELAB_LIMIT_S" >> "$outdir/clock"; }
fi
[ -n "$spins" ] && kill $spins 2>/dev/null
wait "$spid" 2>/dev/null
# SIGTERM (a background job of this shell ignores SIGINT; sudo passes TERM on); line-buffered output
# leaves at most the sample in progress torn, which the host's parser skips
if [ -n "$pm" ]; then
  kill "$pm" 2>/dev/null
  n=0; while kill -0 "$pm" 2>/dev/null && [ "$n" -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
  kill -9 "$pm" 2>/dev/null; wait "$pm" 2>/dev/null
fi
[ -n "$nv" ] && { kill "$nv" 2>/dev/null; wait "$nv" 2>/dev/null; }
{ echo "end_s=$(now)"; echo "end_epoch=$(date +%s)"; } >> "$outdir/clock"
echo "$rc" > "$outdir/exit_code"
[ -n "${DEVICELAB_CURRENT:-}" ] && rm -f "$DEVICELAB_CURRENT"
rm -f "$fifo"
exit "$rc"
