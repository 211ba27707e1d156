#!/bin/sh
# devicelab: every readable thermal zone now, one line each: `ZONE RAW TYPE` (thermal_zone7 45000 cpu-1-0-usr),
# RAW as the kernel gives it. Nothing when there is none.
# The host converts each zone before it takes the hottest (telemetry/sources/thermal_zones.py): one SoC's zones
# mix units (m°C by ABI, some drivers d°C or °C) and not every zone is a temperature (a battery-current-limit
# zone gives mA, mV or a percentage), so the largest raw number is not the hottest zone.
# usage: thermal.sh [ROOT]
root=${1:-}; root=${root%/}
for z in "$root"/sys/class/thermal/thermal_zone*; do
  v=""; { read -r v < "$z/temp"; } 2>/dev/null
  case $v in ''|*[!0-9-]*) continue ;; esac
  t=""; { read -r t < "$z/type"; } 2>/dev/null
  echo "${z##*/} $v $t"
done
