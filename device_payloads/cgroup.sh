#!/bin/sh
# devicelab CPU quota: a cgroup the lab creates for one cell and removes after it.
# usage: cgroup.sh create NAME QUOTA_US PERIOD_US   → prints the cgroup folder, or 'unsupported: REASON'
#        cgroup.sh remove DIR
# cgroup v2 (cpu.max) where the cpu controller is enabled, else v1 (cpu.cfs_quota_us / cpu.cfs_period_us).
act=$1
if [ "$act" = remove ]; then
  d=$2
  case $d in */devicelab-*) ;; *) echo "refusing to remove $d" >&2; exit 2 ;; esac
  [ -d "$d" ] || exit 0
  procs=cgroup.procs; [ -e "$d/$procs" ] || procs=tasks
  # a payload's last process leaves the cgroup a moment after it has exited, and the kernel refuses to remove a
  # cgroup that still holds one (EBUSY): tried again for 10 s, then what is left is moved to the parent, 5 s more
  i=0
  until rmdir "$d" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -eq 100 ]; then
      while read -r pid; do echo "$pid" > "${d%/*}/$procs" 2>/dev/null; done < "$d/$procs"
    elif [ $i -ge 150 ]; then
      echo "could not remove $d: $(wc -l < "$d/$procs" 2>/dev/null) processes in it" >&2; exit 1
    fi
    sleep 0.1 2>/dev/null || sleep 1
  done
  exit 0
fi
name=$2; quota=$3; period=$4
for base in /sys/fs/cgroup /sys/fs/cgroup/unified; do
  if [ -r "$base/cgroup.controllers" ] && grep -qw cpu "$base/cgroup.controllers" 2>/dev/null; then
    grep -qw cpu "$base/cgroup.subtree_control" 2>/dev/null || echo +cpu > "$base/cgroup.subtree_control" 2>/dev/null
    d="$base/devicelab-$name"
    if mkdir -p "$d" 2>/dev/null && echo "$quota $period" > "$d/cpu.max" 2>/dev/null; then
      echo "v2 $d"; exit 0
    fi
  fi
done
v1=/sys/fs/cgroup/cpu
[ -d /sys/fs/cgroup/cpu,cpuacct ] && v1=/sys/fs/cgroup/cpu,cpuacct
if [ -w "$v1" ] || [ -d "$v1" ]; then
  d="$v1/devicelab-$name"
  if mkdir -p "$d" 2>/dev/null && echo "$period" > "$d/cpu.cfs_period_us" 2>/dev/null \
     && echo "$quota" > "$d/cpu.cfs_quota_us" 2>/dev/null; then
    echo "v1 $d"; exit 0
  fi
  rmdir "$d" 2>/dev/null
fi
echo "unsupported: no writable cgroup cpu controller (needs root, or a delegated cgroup v2 subtree)"
