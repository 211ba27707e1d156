#!/bin/sh
# devicelab device facts: key=value lines about the machine this runs on (Linux, Android, macOS).
# usage: facts.sh [WORKDIR] [ROOT]   (ROOT: prefix for /sys reads, as the sampler's, and for /proc/cpuinfo where
# ROOT has one: fixture trees in tests, a capture of another device's cpuinfo)
wd=${1:-.}
root=${2:-}
[ "$root" = / ] && root=""
android=
kv() { printf '%s=%s\n' "$1" "$2"; }
kv uname "$(uname -srm 2>/dev/null)"
kv arch "$(uname -m 2>/dev/null)"
kv hostname "$(uname -n 2>/dev/null)"
if command -v getprop >/dev/null 2>&1 && [ -n "$(getprop ro.build.version.release)" ]; then
  kv os "Android $(getprop ro.build.version.release) (SDK $(getprop ro.build.version.sdk))"
  kv android.model "$(getprop ro.product.model)"
  kv android.manufacturer "$(getprop ro.product.manufacturer)"
  kv android.soc "$(getprop ro.soc.model) $(getprop ro.board.platform)"
  kv android.abi "$(getprop ro.product.cpu.abi)"
  android=1
elif [ -r /etc/os-release ]; then
  . /etc/os-release 2>/dev/null; kv os "${PRETTY_NAME:-$NAME}"
elif command -v sw_vers >/dev/null 2>&1; then
  kv os "macOS $(sw_vers -productVersion)"
fi
cpuinfo="$root/proc/cpuinfo"; [ -r "$cpuinfo" ] || cpuinfo=/proc/cpuinfo   # a ROOT without one: this machine's
# a Mac (no /proc): sysctl's machdep.cpu.brand_string, which Linux's and Android's sysctl do not have
mac=$(sysctl -n machdep.cpu.brand_string 2>/dev/null)
if [ -n "$mac" ]; then
  kv cpu.model "$mac"
  # an Intel Mac's AVX2/AVX-512 are in leaf7_features, not in features; Apple silicon has neither key
  f="$(sysctl -n machdep.cpu.features 2>/dev/null) $(sysctl -n machdep.cpu.leaf7_features 2>/dev/null)"
  kv cpu.features "$(echo $f)"
elif [ -r "$cpuinfo" ]; then
  m=$(grep -m1 -E '^(model name|Hardware|cpu model)' "$cpuinfo" | cut -d: -f2-)
  kv cpu.model "$(echo $m)"
  f=$(grep -m1 -E '^(flags|Features)' "$cpuinfo" | cut -d: -f2-)
  kv cpu.features "$(echo $f)"
  parts=""
  while read -r count part; do [ -n "$count" ] && parts="$parts $count $part;"; done <<EOF_PARTS
$(grep -E '^CPU part' "$cpuinfo" | cut -d: -f2 | sort | uniq -c)
EOF_PARTS
  kv cpu.parts "${parts# }"
fi
n=""; [ -n "$mac" ] && n=$(sysctl -n hw.ncpu 2>/dev/null)
[ -n "$n" ] || n=$(getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null)
kv cpu.count "$n"
cl=""
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  [ -r "$c/cpufreq/cpuinfo_max_freq" ] && cl="$cl ${c##*/cpu}:$(cat "$c/cpufreq/cpuinfo_max_freq")"
done
kv cpu.max_khz "$(echo $cl)"
if [ -n "$mac" ]; then
  b=$(sysctl -n hw.memsize 2>/dev/null); [ -n "$b" ] && kv mem.total_kB $((b / 1024))
elif [ -r /proc/meminfo ]; then
  # shell reads, no awk: older Android and minimal images have none
  while read -r k v _; do
    case $k in MemTotal:) kv mem.total_kB "$v" ;; MemAvailable:) kv mem.available_kB "$v" ;; esac
  done < /proc/meminfo
fi
# one app's memory budget (host/devicelab/budget.py reckons it): Android's own accounting of what the
# low-memory killer can free, and its foreground threshold where the kernel exposes one
if [ -n "$android" ] && command -v dumpsys >/dev/null 2>&1; then
  kv mem.dumpsys_free "$(dumpsys meminfo 2>/dev/null | grep -m1 'Free RAM:')"
fi
lmk="$root/sys/module/lowmemorykiller/parameters/minfree"
[ -r "$lmk" ] && kv mem.lmk_minfree "$(cat "$lmk")"
command -v vm_stat >/dev/null 2>&1 && kv mem.vm_stat "$(vm_stat 2>/dev/null | tr '\n' ';')"
if command -v memory_pressure >/dev/null 2>&1; then
  p=$(memory_pressure -Q 2>/dev/null | grep -m1 'free percentage' | tr -dc '0-9')
  [ -n "$p" ] && kv mem.free_percent "$p"
fi
# battery full-charge capacity (energy per prompt as a share of it)
for d in "$root"/sys/class/power_supply/*; do
  t=""; { read -r t < "$d/type"; } 2>/dev/null
  [ "$t" = Battery ] || continue
  for k in energy_full charge_full voltage_now; do
    v=""; { read -r v < "$d/$k"; } 2>/dev/null; [ -n "$v" ] && kv "battery.$k" "$v"
  done
  break
done
# a Mac's: AppleRawMaxCapacity (mAh; Apple silicon's MaxCapacity is a percent), else MaxCapacity (an Intel Mac's,
# in mAh); `| |` tree prefixes (as `ioreg -l` prints them) stripped
if command -v ioreg >/dev/null 2>&1; then
  ioreg -rn AppleSmartBattery 2>/dev/null | while read -r line; do
    set -f; set -- ${line#"${line%%[!| ]*}"}
    case $1 in
      '"AppleRawMaxCapacity"') kv battery.max_mah "$3" ;; '"MaxCapacity"') kv battery.max_capacity "$3" ;;
      '"Voltage"') kv battery.mv "$3" ;;
    esac
  done
fi
mkdir -p "$wd" 2>/dev/null
free=""
{ read -r _; read -r _ _ _ free _; } <<EOF_DF
$(df -Pk "$wd" 2>/dev/null)
EOF_DF
kv storage.free_kB "$free"
kv cgroup "$(cat /proc/self/cgroup 2>/dev/null | head -n1)"
