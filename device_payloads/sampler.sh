#!/bin/sh
# devicelab telemetry sampler: POSIX sh (dash, busybox ash, toybox/mksh on Android, bash, macOS sh).
#
# usage: sampler.sh -o OUT.csv [-p PID] [-i INTERVAL_MS] [-R ROOT] [-s STOPFILE] [-n MAX_TICKS]
#
# Samples every counter it can read, once per interval, until PID exits, STOPFILE appears or
# MAX_TICKS ticks were taken. Output is one wide CSV: comment lines '# ...' describe the sources
# (thermal zone types, RAPL domain names and ranges, hwmon names), then a header
# 'tick,t_s,<source path>...' and one row per tick. Values are copied raw (µA, µV, m°C, kHz, µJ,
# kB) — the host normalizes units and signs. Paths are relative to ROOT (default '/') so tests can
# point the sampler at a fixture tree.
#
# Cost: the loop uses only shell builtins. It paces itself with `read -t` on a private FIFO where the
# shell supports it (bash, busybox ash, mksh — Android's sh), else with one `sleep` per tick (dash).
# The payload's RSS comes from /proc/PID/statm every tick (one short line) and its VmHWM from
# /proc/PID/status once a second (shells read files a byte at a time: status is ~1.5 kB).
out=""; pid=""; interval=100; root=""; stopfile=""; maxticks=0
while getopts "o:p:i:R:s:n:" opt; do
  case $opt in
    o) out=$OPTARG ;; p) pid=$OPTARG ;; i) interval=$OPTARG ;; R) root=${OPTARG%/} ;;
    s) stopfile=$OPTARG ;; n) maxticks=$OPTARG ;; *) echo "usage: $0 -o OUT [-p PID] [-i MS] [-R ROOT] [-s STOP] [-n N]" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "sampler: -o OUT is required" >&2; exit 2; }
case $interval in ''|*[!0-9]*) echo "sampler: -i takes milliseconds" >&2; exit 2 ;; esac
nap=$(printf '%d.%03d' $((interval / 1000)) $((interval % 1000)))
hwm_every=$((1000 / interval)); [ "$hwm_every" -ge 1 ] || hwm_every=1
pagekb=$(getconf PAGESIZE 2>/dev/null || echo 4096); pagekb=$((pagekb / 1024))
pace=sleep
fifo="$out.pace"
if rm -f "$fifo" && mkfifo "$fifo" 2>/dev/null && exec 3<>"$fifo"; then
  rm -f "$fifo"     # the open descriptor keeps it; nothing is ever written to it
  err=$( { read -t 0.001 _x <&3; } 2>&1 )
  [ -z "$err" ] && pace=readt
fi

files=""      # space-separated list of readable counter files (absolute, under root)
add() { for f in "$@"; do [ -r "$f" ] && files="$files $f"; done; }
meta() { printf '# %s\n' "$*"; }

{
  meta "devicelab-sampler v1 interval_ms=$interval root=${root:-/} pid=${pid:--}"
  for d in "$root"/sys/class/power_supply/*; do
    [ -d "$d" ] || continue
    t=""; { read -r t < "$d/type"; } 2>/dev/null
    meta "power_supply ${d#"$root"/} type=$t"
    for k in current_now voltage_now power_now capacity status temp charge_counter charge_now energy_now; do
      add "$d/$k"
    done
  done
  for z in "$root"/sys/class/thermal/thermal_zone*; do
    [ -r "$z/temp" ] || continue
    t=""; { read -r t < "$z/type"; } 2>/dev/null
    meta "thermal_zone ${z#"$root"/} type=$t"
    add "$z/temp"
  done
  for c in "$root"/sys/devices/system/cpu/cpu[0-9]*; do
    [ -r "$c/cpufreq/scaling_cur_freq" ] || continue
    mx=""; { read -r mx < "$c/cpufreq/cpuinfo_max_freq"; } 2>/dev/null
    meta "cpufreq ${c#"$root"/} max_khz=$mx"
    add "$c/cpufreq/scaling_cur_freq"
  done
  for h in "$root"/sys/class/hwmon/hwmon* "$root"/sys/bus/i2c/drivers/ina3221*/*/hwmon/hwmon*; do
    [ -d "$h" ] || continue
    n=""; { read -r n < "$h/name"; } 2>/dev/null
    meta "hwmon ${h#"$root"/} name=$n"
    for f in "$h"/power*_input "$h"/energy*_input "$h"/curr*_input "$h"/in*_input "$h"/temp*_input; do
      [ -r "$f" ] || continue
      l=""; { read -r l < "${f%_input}_label"; } 2>/dev/null
      [ -n "$l" ] && meta "hwmon_label ${f#"$root"/} label=$l"
      add "$f"
    done
  done
  for r in "$root"/sys/class/powercap/intel-rapl:* "$root"/sys/class/powercap/intel-rapl/intel-rapl:*; do
    [ -r "$r/energy_uj" ] || continue
    n=""; mx=""; { read -r n < "$r/name"; } 2>/dev/null; { read -r mx < "$r/max_energy_range_uj"; } 2>/dev/null
    meta "rapl ${r#"$root"/} name=$n max_energy_range_uj=$mx"
    add "$r/energy_uj"
  done
  [ -r /proc/uptime ] && clock=proc || clock=none
  meta "clock $clock"
  meta "pace $pace"

  hdr="tick,t_s"
  for f in $files; do hdr="$hdr,${f#"$root"/}"; done
  [ -n "$pid" ] && hdr="$hdr,proc/$pid/VmRSS_kB,proc/$pid/VmHWM_kB"
  echo "$hdr"

  tick=0
  while :; do
    up=""; [ $clock = proc ] && { read -r up _ < /proc/uptime; } 2>/dev/null
    line="$tick,$up"
    for f in $files; do v=""; { read -r v < "$f"; } 2>/dev/null; line="$line,$v"; done
    alive=1
    if [ -n "$pid" ]; then
      rss=""; res=""
      { read -r _sz res _ < "/proc/$pid/statm"; } 2>/dev/null
      [ -n "$res" ] && [ "$res" != 0 ] && rss=$((res * pagekb))   # a zombie's statm reads all zeros
      if [ $((tick % hwm_every)) -eq 0 ] || [ -z "$rss" ]; then
        { while read -r k val _; do
            case $k in VmHWM:) hwm=$val ;; esac
          done < "/proc/$pid/status"; } 2>/dev/null
      fi
      line="$line,$rss,${hwm:-}"
      kill -0 "$pid" 2>/dev/null || alive=0
      [ -z "$rss" ] && alive=0   # exited (zombie has no VmRSS)
    fi
    echo "$line"
    tick=$((tick + 1))
    [ $alive = 1 ] || break
    [ -n "$stopfile" ] && [ -e "$stopfile" ] && break
    [ "$maxticks" -gt 0 ] && [ "$tick" -ge "$maxticks" ] && break
    if [ $pace = readt ]; then read -t "$nap" _x <&3; else sleep "$nap"; fi
  done
} > "$out"
