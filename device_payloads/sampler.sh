#!/bin/sh
# devicelab telemetry sampler: POSIX sh (dash, busybox ash, toybox/mksh on Android, bash, macOS sh).
#
# usage: sampler.sh -o OUT.csv [-p PID] [-i INTERVAL_MS] [-T SLOW_MS] [-R ROOT] [-s STOPFILE] [-n MAX_TICKS] [-S]
#
# Samples every counter it can read (current, voltage, power, charge/energy, RAPL, hwmon rails, CPU
# frequency per cpufreq policy) once per interval (default 100 ms), and the slow sources (thermal zones,
# battery level/status/temperature, hwmon temperatures — a phone has dozens of zones, and they change
# over seconds) every SLOW_MS (default 1000) and at the last tick, leaving their cells empty between;
# until PID exits, STOPFILE appears or MAX_TICKS ticks were taken. Output is one wide CSV: comment lines '# ...' describe the sources
# (thermal zone types, RAPL domain names and ranges, hwmon names), then a header
# 'tick,t_s,<source path>...' and one row per tick. Values are copied raw (µA, µV, m°C, kHz, µJ,
# kB) — the host normalizes units and signs. Paths are relative to ROOT (default '/') so tests can
# point the sampler at a fixture tree.
#
# Cost: no process is started per tick. The reads are done by one long-lived awk, fed a line per tick
# (awk reads a file in one read(2); a shell's `read` takes one, plus a poll under busybox, per byte),
# or by the shell's builtins where the device has no awk. The shell paces itself with `read -t` on a private FIFO where the
# shell supports fractional timeouts (busybox ash, mksh — Android's sh —, bash ≥ 4, ksh93). A shell
# without (dash; macOS's /bin/sh, bash 3.2) would need one `sleep` process per tick, ~1 ms of CPU, i.e.
# 1% of a core at 10 Hz: so the sampler re-runs itself under the first shell on the device that has it
# (busybox sh, mksh, bash, ksh; measured cheapest first) and only paces with `sleep` when there is none
# or -S (stay in this shell) is given. The '# pace' meta line records which.
# The payload's RSS comes from /proc/PID/statm every tick (one short line) and its VmHWM from
# /proc/PID/status once a second, read up to its VmHWM line (shells read files a byte at a time: the
# whole of status is ~1.5 kB, most of the sampler's reads).
out=""; pid=""; interval=100; slow_ms=1000; root=""; stopfile=""; maxticks=0; stay=""
while getopts "o:p:i:T:R:s:n:S" opt; do
  case $opt in
    o) out=$OPTARG ;; p) pid=$OPTARG ;; i) interval=$OPTARG ;; T) slow_ms=$OPTARG ;; R) root=${OPTARG%/} ;;
    s) stopfile=$OPTARG ;; n) maxticks=$OPTARG ;; S) stay=1 ;;
    *) echo "usage: $0 -o OUT [-p PID] [-i MS] [-T SLOW_MS] [-R ROOT] [-s STOP] [-n N] [-S]" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "sampler: -o OUT is required" >&2; exit 2; }
case $interval$slow_ms in ''|*[!0-9]*) echo "sampler: -i and -T take milliseconds" >&2; exit 2 ;; esac
[ "$interval" -gt 0 ] || { echo "sampler: -i must be > 0 ms" >&2; exit 2; }
# fractional `read -t` here? (dash: "Illegal option -t"; bash 3.2: "invalid timeout specification")
readt_probe='{ read -t 0.001 _x < /dev/null; } 2>&1'       # prints nothing where it works
if [ -z "$stay" ] && [ -z "${DEVICELAB_SAMPLER_VIA:-}" ] && [ -n "$(eval "$readt_probe")" ]; then
  for via in busybox mksh bash ksh; do
    command -v "$via" >/dev/null 2>&1 || continue
    sh_=$via; [ "$via" = busybox ] && sh_="busybox sh"
    [ -z "$($sh_ -c "$readt_probe" 2>&1)" ] || continue
    DEVICELAB_SAMPLER_VIA=$via; export DEVICELAB_SAMPLER_VIA
    exec $sh_ "$0" "$@"
  done
fi
nap=$(printf '%d.%03d' $((interval / 1000)) $((interval % 1000)))
hwm_every=$((1000 / interval)); [ "$hwm_every" -ge 1 ] || hwm_every=1
slow_every=$((slow_ms / interval)); [ "$slow_every" -ge 1 ] || slow_every=1
pagekb=$(getconf PAGESIZE 2>/dev/null || echo 4096); pagekb=$((pagekb / 1024))
pace=sleep
fifo="$out.pace"
if rm -f "$fifo" && mkfifo "$fifo" 2>/dev/null && exec 3<>"$fifo"; then
  rm -f "$fifo"     # the open descriptor keeps it; nothing is ever written to it
  err=$( { read -t 0.001 _x <&3; } 2>&1 )
  [ -z "$err" ] && pace=readt
fi

files=""      # space-separated list of readable counter files (absolute, under root), read every tick
slow=""       # slowly changing sources (temperatures, level, status), read every SLOW_MS and at the last tick
add() { for f in "$@"; do [ -r "$f" ] && files="$files $f"; done; }
adds() { for f in "$@"; do [ -r "$f" ] && slow="$slow $f"; done; }
# collected and written once: printf is no builtin in mksh (Android's sh), a process per line
_meta=""
meta() { _meta="$_meta# $*
"; }
# a rail label as one word ("POM 5V IN" -> POM_5V_IN): meta lines are split on blanks
word() { _o=""; _r=$1; while :; do case $_r in *" "*) _o="$_o${_r%% *}_"; _r=${_r#* } ;; *) l="$_o$_r"; return ;; esac; done; }

{
  meta "devicelab-sampler v1 interval_ms=$interval slow_interval_ms=$((slow_every * interval)) root=${root:-/} pid=${pid:--}"
  for d in "$root"/sys/class/power_supply/*; do
    [ -d "$d" ] || continue
    t=""; { read -r t < "$d/type"; } 2>/dev/null
    meta "power_supply ${d#"$root"/} type=$t"
    # batt_current_ua_now: Samsung's own µA reading beside a current_now in mA (the host decides the unit by it)
    for k in current_now voltage_now power_now charge_counter charge_now energy_now batt_current_ua_now; do add "$d/$k"; done
    for k in capacity status temp; do adds "$d/$k"; done
  done
  for z in "$root"/sys/class/thermal/thermal_zone*; do
    [ -r "$z/temp" ] || continue
    t=""; { read -r t < "$z/type"; } 2>/dev/null
    meta "thermal_zone ${z#"$root"/} type=$t"
    adds "$z/temp"
  done
  # one frequency per cpufreq policy (a cluster shares its clock), else per CPU
  policies=0
  for c in "$root"/sys/devices/system/cpu/cpufreq/policy[0-9]*; do
    [ -r "$c/scaling_cur_freq" ] || continue
    mx=""; rel=""; { read -r mx < "$c/cpuinfo_max_freq"; } 2>/dev/null; { read -r rel < "$c/related_cpus"; } 2>/dev/null
    cpus=""; for x in $rel; do cpus="${cpus:+$cpus,}$x"; done
    meta "cpufreq ${c#"$root"/} max_khz=$mx cpus=$cpus"
    add "$c/scaling_cur_freq"; policies=$((policies + 1))
  done
  [ $policies -gt 0 ] || for c in "$root"/sys/devices/system/cpu/cpu[0-9]*; do
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
      l=""; { read -r l < "${f%_input}_label"; } 2>/dev/null; word "$l"
      [ -n "$l" ] && meta "hwmon_label ${f#"$root"/} label=$l"
      case ${f##*/} in temp*) adds "$f" ;; *) add "$f" ;; esac
    done
  done
  # older Jetsons (L4T 32: Nano, TX2, Xavier): INA3221 rails through the iio driver, mW, rail_name_N
  for d in "$root"/sys/bus/i2c/drivers/ina3221x/*/iio:device*; do
    for f in "$d"/in_power[0-9]*_input; do
      [ -r "$f" ] || continue
      k=${f##*/in_power}; k=${k%_input}
      l=""; { read -r l < "$d/rail_name_$k"; } 2>/dev/null; word "$l"
      meta "rail ${f#"$root"/} label=$l"
      add "$f"
    done
  done
  # GPUs: Adreno (kgsl: clock Hz, busy/total since the last read, temperature), devfreq GPUs (Mali and
  # others: the clock in Hz), Tegra/Jetson (load in per mille)
  for g in "$root"/sys/class/kgsl/kgsl-3d0; do
    [ -d "$g" ] || continue
    meta "gpu ${g#"$root"/} type=kgsl"
    add "$g/gpuclk" "$g/gpubusy"; adds "$g/temp"
  done
  for g in "$root"/sys/class/devfreq/*; do
    case ${g##*/} in *gpu*|*mali*|*kgsl*|*sgx*|*pvr*) ;; *) continue ;; esac
    [ -r "$g/cur_freq" ] || continue
    meta "gpu ${g#"$root"/} type=devfreq"
    add "$g/cur_freq"
  done
  for g in "$root"/sys/devices/gpu.0 "$root"/sys/devices/platform/gpu.0 "$root"/sys/devices/platform/*.gpu; do
    [ -r "$g/load" ] || continue
    meta "gpu ${g#"$root"/} type=tegra"
    add "$g/load"
  done
  for r in "$root"/sys/class/powercap/intel-rapl:* "$root"/sys/class/powercap/intel-rapl/intel-rapl:*; do
    [ -r "$r/energy_uj" ] || continue
    n=""; mx=""; { read -r n < "$r/name"; } 2>/dev/null; { read -r mx < "$r/max_energy_range_uj"; } 2>/dev/null
    meta "rapl ${r#"$root"/} name=$n max_energy_range_uj=$mx"
    add "$r/energy_uj"
  done
  [ -r /proc/uptime ] && clock=proc || clock=none
  # the reads: one long-lived awk fed a line per tick (buffered reads: one read(2) a file, and no
  # process per tick) where the device has awk and mkfifo; else the shell itself, a byte per read(2)
  reader=sh
  if [ -z "${DEVICELAB_SAMPLER_NO_AWK:-}" ] && command -v awk >/dev/null 2>&1; then
    tickf="$out.ticks"
    rm -f "$tickf" && mkfifo "$tickf" 2>/dev/null && reader=awk
    # mawk (Debian's awk) fills its whole input buffer before it starts: ask it for a line at a time
    case $(awk -W version 2>&1 < /dev/null) in *mawk*) awk_opt="-W interactive" ;; *) awk_opt="" ;; esac
  fi
  meta "clock $clock"
  meta "pace $pace${DEVICELAB_SAMPLER_VIA:+ via=$DEVICELAB_SAMPLER_VIA} reader=$reader"

  hdr="tick,t_s"
  for f in $files $slow; do hdr="$hdr,${f#"$root"/}"; done
  [ -n "$pid" ] && hdr="$hdr,proc/$pid/VmRSS_kB,proc/$pid/VmHWM_kB"
  printf '%s%s\n' "$_meta" "$hdr"

  tick=0
  if [ $reader = awk ]; then
    # awk gets "TICK LAST" lines; it ends the run itself when the payload's /proc entry goes (or reads
    # as a zombie's zeros), reading the slow sources on that last tick too
    awk $awk_opt -v fast="$files" -v slow="$slow" -v pid="$pid" -v pagekb="$pagekb" -v slow_every="$slow_every" -v hwm_every="$hwm_every" \
        -v clock="$clock" '
      BEGIN { nf = split(fast, F, " "); ns = split(slow, S, " "); proc_ok = 0; hwm = "" }
      function rd(f,   v) { v = ""; if ((getline v < f) <= 0) v = ""; close(f); return v }
      {
        tick = $1; last = ($2 == 1); up = ""
        if (clock == "proc") { split(rd("/proc/uptime"), U, " "); up = U[1] }
        rss = ""
        if (pid != "") {
          split(rd("/proc/" pid "/statm"), M, " ")
          # gone: its entry unreadable once it was read, or the zeros of a zombie (even at the first tick: a
          # payload that ended before the sampler started, its parent not yet waiting; never a kernel thread)
          if (M[2] + 0 > 0) { rss = M[2] * pagekb; proc_ok = 1 } else if (proc_ok || M[2] == "0") last = 1
          st = "/proc/" pid "/status"
          if (rss != "" && tick % hwm_every == 0) {
            while ((getline v < st) > 0) if (v ~ /^VmHWM:/) { split(v, H, " "); hwm = H[2]; break }
            close(st) }
        }
        line = tick "," up
        for (i = 1; i <= nf; i++) line = line "," rd(F[i])
        if (tick % slow_every == 0 || last) { for (i = 1; i <= ns; i++) line = line "," rd(S[i]) }
        else { for (i = 1; i <= ns; i++) line = line "," }
        if (pid != "") line = line "," rss "," hwm
        print line; fflush()
        if (last) exit
      }' < "$tickf" &
    apid=$!
    exec 4> "$tickf"; rm -f "$tickf"
    trap '' PIPE                 # awk gone: the next write fails instead of killing this shell
    # stderr of the whole loop, not of each command: a redirection costs an open and descriptor moves
    # (mksh also reports a signal that cuts the `read -t` wait short, e.g. SIGCHLD, as an error: not one)
    while :; do
      last=0
      [ -n "$pid" ] && ! kill -0 "$pid" && last=1
      [ -n "$stopfile" ] && [ -e "$stopfile" ] && last=1
      [ "$maxticks" -gt 0 ] && [ $((tick + 1)) -ge "$maxticks" ] && last=1
      echo "$tick $last" >&4 || break
      [ $last = 1 ] && break
      tick=$((tick + 1))
      if [ $pace = readt ]; then read -t "$nap" _x <&3; else sleep "$nap"; fi
    done 2>/dev/null
    exec 4>&-
    wait "$apid"
  else
    # stderr of the whole loop, not of each read: a redirection per read costs an open of /dev/null
    # and three descriptor moves (with the shell's reads of a phone's files: 15 % of the sampler's CPU)
    while :; do
      up=""; [ $clock = proc ] && read -r up _ < /proc/uptime
      last=0; rss=""
      if [ -n "$pid" ]; then
        res=""
        read -r _sz res _ < "/proc/$pid/statm"
        [ -n "$res" ] && [ "$res" != 0 ] && rss=$((res * pagekb))   # a zombie's statm reads all zeros
        [ -n "$rss" ] && proc_ok=1
        if [ $((tick % hwm_every)) -eq 0 ] && [ -n "$rss" ]; then
          while read -r k val _; do
            case $k in VmHWM:) hwm=$val; break ;; esac   # stop there: a third of the file
          done < "/proc/$pid/status"
        fi
        kill -0 "$pid" || last=1
        [ -z "$rss" ] && [ -n "${proc_ok:-}" ] && last=1   # exited (a zombie has no VmRSS)
        [ "$res" = 0 ] && last=1   # a zombie from the first tick: it ended before the sampler started
      fi
      [ -n "$stopfile" ] && [ -e "$stopfile" ] && last=1
      [ "$maxticks" -gt 0 ] && [ $((tick + 1)) -ge "$maxticks" ] && last=1
      line="$tick,$up"
      for f in $files; do v=""; read -r v < "$f"; line="$line,$v"; done
      if [ $((tick % slow_every)) -eq 0 ] || [ $last = 1 ]; then
        for f in $slow; do v=""; read -r v < "$f"; line="$line,$v"; done
      else
        for f in $slow; do line="$line,"; done
      fi
      [ -n "$pid" ] && line="$line,$rss,${hwm:-}"
      echo "$line"
      tick=$((tick + 1))
      [ $last = 1 ] && break
      if [ $pace = readt ]; then read -t "$nap" _x <&3; else sleep "$nap"; fi
    done 2>/dev/null
  fi
} > "$out"
