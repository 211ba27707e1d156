#!/bin/sh
# devicelab CPU governor pinning (rooted phones, boards): optional, recorded in every row's provenance.
#
# usage: governor.sh set GOVERNOR STATEFILE [ROOT]   pin every cpufreq policy, saving the old governors
#        governor.sh restore STATEFILE [ROOT]        put the saved governors back, remove STATEFILE
#
# Prints one line: "pinned N GOVERNOR", "restored N", or "unsupported: REASON" (exit 0 in every case:
# an unpinned device still measures, the host records that it was not pinned).
set -u
cmd=${1:-}; shift || true
case $cmd in
  set) gov=$1; state=$2; root=${3:-}; root=${root%/} ;;
  restore) state=$1; root=${2:-}; root=${root%/} ;;
  *) echo "usage: $0 set GOVERNOR STATEFILE [ROOT] | restore STATEFILE [ROOT]" >&2; exit 2 ;;
esac
policies=""
for p in "$root"/sys/devices/system/cpu/cpufreq/policy[0-9]*; do
  [ -r "$p/scaling_governor" ] && policies="$policies $p"
done
if [ -z "$policies" ]; then
  for p in "$root"/sys/devices/system/cpu/cpu[0-9]*/cpufreq; do
    [ -r "$p/scaling_governor" ] && policies="$policies $p"
  done
fi
if [ "$cmd" = restore ]; then
  [ -r "$state" ] || { echo "restored 0"; exit 0; }
  n=0
  while read -r p g; do
    [ -n "$p" ] && { echo "$g" > "$p/scaling_governor"; } 2>/dev/null && n=$((n + 1))
  done < "$state"
  rm -f "$state"
  echo "restored $n"
  exit 0
fi
[ -n "$policies" ] || { echo "unsupported: no cpufreq scaling_governor under ${root:-/}sys/devices/system/cpu"; exit 0; }
p1=${policies# }; p1=${p1%% *}
avail=""; { read -r avail < "$p1/scaling_available_governors"; } 2>/dev/null
case " $avail " in
  *" $gov "*) ;;
  *) [ -n "$avail" ] && { echo "unsupported: governor $gov not offered (available: $avail)"; exit 0; } ;;
esac
: > "$state" 2>/dev/null || { echo "unsupported: cannot write $state"; exit 0; }
n=0
for p in $policies; do
  old=""; { read -r old < "$p/scaling_governor"; } 2>/dev/null
  if { echo "$gov" > "$p/scaling_governor"; } 2>/dev/null; then
    echo "$p $old" >> "$state"; n=$((n + 1))
  else
    # undo what was pinned so far: never leave a device half-pinned
    while read -r q g; do { echo "$g" > "$q/scaling_governor"; } 2>/dev/null; done < "$state"
    rm -f "$state"
    echo "unsupported: permission denied writing $p/scaling_governor (needs root)"
    exit 0
  fi
done
echo "pinned $n $gov"
