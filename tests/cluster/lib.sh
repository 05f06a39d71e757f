# Shared by tests/cluster/*.sh (sourced): logging, and the cgroup that holds every process
# the harness starts, so that stopping it leaves no process and no cgroup behind.
#
# Every process the harness starts runs in `<hierarchy>/<group>/system` of each mounted cgroup
# hierarchy (v1 controllers, the named systemd hierarchy, v2). The node's kubelet puts pods
# under `<group>` too (its cgroupRoot), so one walk of `<group>` finds every process: the
# control plane, containerd and its shims, and every container.

die() { echo "${0##*/}: $*" >&2; exit 1; }
log() { echo "${0##*/}: $*" >&2; }

# cgroup_mounts: every mounted cgroup hierarchy (v1 and v2), one mount point a line.
cgroup_mounts() {
  awk '$9 == "cgroup" || $9 == "cgroup2" { print $5 }' /proc/self/mountinfo | sort -u
}

# cgroup_version: 2 when /sys/fs/cgroup is the unified hierarchy, else 1.
cgroup_version() {
  [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]] && echo 2 || echo 1
}

# cgroup_create <group>: <group>/system in every hierarchy, ready for processes.
cgroup_create() {
  local group=$1 m
  while read -r m; do
    mkdir -p "$m/$group/system" || die "cannot create the cgroup $m/$group (is this run as root?)"
    if [[ -f $m/cpuset.cpus && ! -f $m/cgroup.controllers ]]; then
      # cgroup v1 cpuset: a new group has no CPUs and no memory nodes until given its parent's.
      cat "$m/cpuset.cpus" >"$m/$group/cpuset.cpus"
      cat "$m/cpuset.mems" >"$m/$group/cpuset.mems"
      cat "$m/cpuset.cpus" >"$m/$group/system/cpuset.cpus"
      cat "$m/cpuset.mems" >"$m/$group/system/cpuset.mems"
    fi
    if [[ -f $m/cgroup.controllers && $m == /sys/fs/cgroup ]]; then
      # cgroup v2: the kubelet's pods under <group> need its controllers.
      local c
      for c in cpu cpuset memory pids io hugetlb; do
        grep -qw "$c" "$m/$group/cgroup.controllers" && echo "+$c" >"$m/$group/cgroup.subtree_control" 2>/dev/null || true
      done
    fi
  done < <(cgroup_mounts)
}

# cgroup_join <group> <pid>: moves a process into <group>/system of every hierarchy.
cgroup_join() {
  local group=$1 pid=$2 m
  while read -r m; do
    [[ -d $m/$group/system ]] && echo "$pid" >"$m/$group/system/cgroup.procs"
  done < <(cgroup_mounts)
}

# cgroup_pids <group>: every process in <group> and below, in any hierarchy.
cgroup_pids() {
  local group=$1 m
  while read -r m; do
    [[ -d $m/$group ]] && find "$m/$group" -name cgroup.procs -exec cat {} + 2>/dev/null
  done < <(cgroup_mounts) | sort -un
}

# cgroup_kill <group>: SIGKILLs every process in <group> until none is left, then removes
# <group> and every cgroup below it. Fails when something is left.
cgroup_kill() {
  local group=$1 m pids i
  for ((i = 0; i < 50; i++)); do
    pids=$(cgroup_pids "$group")
    [[ -z $pids ]] && break
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    sleep 0.1
  done
  [[ -z $(cgroup_pids "$group") ]] || { log "processes left in cgroup $group: $(cgroup_pids "$group" | tr '\n' ' ')"; return 1; }
  while read -r m; do
    [[ -d $m/$group ]] || continue
    for ((i = 0; i < 50; i++)); do
      find "$m/$group" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [[ -d $m/$group ]] || break
      sleep 0.1
    done
    [[ -d $m/$group ]] && { log "cannot remove the cgroup $m/$group"; return 1; }
  done < <(cgroup_mounts)
  return 0
}

# start_in <group> <log> <command...>: starts a command in the background inside <group>
# and prints its PID. The command is entered into the cgroup before it runs.
start_in() {
  local group=$1 logfile=$2
  shift 2
  (
    cgroup_join "$group" "$BASHPID"
    exec "$@"
  ) >"$logfile" 2>&1 </dev/null &
  echo $!
}
