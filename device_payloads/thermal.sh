#!/bin/sh
# devicelab: print the hottest thermal zone temperature (raw, usually m°C), or nothing if none.
# usage: thermal.sh [ROOT]
root=${1:-}; root=${root%/}
max=""
for z in "$root"/sys/class/thermal/thermal_zone*/temp; do
  v=""; { read -r v < "$z"; } 2>/dev/null
  case $v in ''|*[!0-9-]*) continue ;; esac
  if [ -z "$max" ] || [ "$v" -gt "$max" ]; then max=$v; fi
done
echo "$max"
