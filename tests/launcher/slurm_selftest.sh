#!/usr/bin/env bash
# Self-test of tests/launcher/lib/slurm.sh: a private 2-node Slurm cluster on
# this machine runs srun, srun inside salloc (how dshim-run --launcher slurm
# is used), --kill-on-bad-exit and sbatch; after slurm_down nothing of it is
# left.  Prints what the launcher can rely on (variables inside an
# allocation, exit codes, timings).  Skips (exit 77) without root or Slurm.
# ($VARS in single quotes are meant for the tasks, not this shell)
# shellcheck source-path=SCRIPTDIR disable=SC2016
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/slurm.sh
source "$here/lib/slurm.sh"

if ! why=$(slurm_available); then
    echo "SKIP: $why"
    exit 77
fi
trap slurm_down EXIT
trap 'exit 143' TERM INT

passed=0
failed=0
ok() {
    echo "ok: $*"
    passed=$((passed + 1))
}
bad() {
    echo "FAIL: $*"
    failed=$((failed + 1))
}
now() {
    date +%s.%N
}
secs() {  # secs START — seconds since START, 2 decimals
    awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'
}
# distinct COLUMN FILE — number of distinct values in column COLUMN of FILE
distinct() {
    awk -v c="$1" '{ print $c }' "$2" | sort -u | wc -l
}

t0=$(now)
slurm_up 2 8
ok "slurm_up 2 nodes in $(secs "$t0") s ($(sinfo -h -o '%D nodes %T %N'), MULTIPLE_SLURMD=$(scontrol show config | awk '/^MULTIPLE_SLURMD/ { print $3 }'))"
work=$SLURM_TEST_DIR/work
mkdir -p "$work"
cd "$work"

# 1. srun -N1 -n4: four tasks with distinct ranks.
if timeout 30 srun -N1 -n4 bash -c 'echo $SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS' >out1 2>err1 &&
   [ "$(wc -l <out1)" = 4 ] && [ "$(distinct 1 out1)" = 4 ] && [ "$(distinct 2 out1)" = 4 ] &&
   [ "$(awk '$3 != 4' out1)" = "" ]; then
    ok "srun -N1 -n4: procid/localid/ntasks = $(sort -n out1 | tr '\n' ',' | sed 's/,$//')"
else
    bad "srun -N1 -n4 (rc/out/err follow)"; cat out1 err1
fi

# 2. srun -N2 -n4: tasks spread over both slurmds.
if timeout 30 srun -N2 -n4 bash -c 'echo $SLURM_PROCID $SLURM_NODEID $SLURMD_NODENAME $SLURM_LOCALID' >out2 2>err2 &&
   [ "$(distinct 1 out2)" = 4 ] && [ "$(distinct 2 out2)" = 2 ] && [ "$(distinct 3 out2)" = 2 ]; then
    ok "srun -N2 -n4: procid nodeid node localid = $(sort -n out2 | tr '\n' ',' | sed 's/,$//')"
else
    bad "srun -N2 -n4"; cat out2 err2
fi

# 3. Inside an allocation (the launcher's situation): salloc runs the command
#    here with SLURM_JOB_ID etc. set; srun inside it launches into the job.
if timeout 30 salloc -N2 -n4 bash -c 'env | grep "^SLURM" | sort >alloc.env
        srun bash -c "echo \$SLURM_PROCID \$SLURM_JOB_ID \$SLURM_STEP_ID \$SLURMD_NODENAME
                      if [ \$SLURM_PROCID = 0 ]; then env | grep ^SLURM | sort >task.env; fi"' >out3 2>err3 &&
   [ "$(distinct 1 out3)" = 4 ] && grep -q '^SLURM_JOB_ID=' alloc.env &&
   [ "$(distinct 2 out3)" = 1 ] && [ "$(awk '{ print $2 }' out3 | head -1)" = "$(sed -n 's/^SLURM_JOB_ID=//p' alloc.env)" ]; then
    ok "salloc -N2 -n4 + srun: $(sort -n out3 | tr '\n' ',' | sed 's/,$//') (procid jobid stepid node)"
    echo "  SLURM_* set inside the allocation (before srun):"
    sed 's/^/    /' alloc.env
    timeout 30 salloc -n3 bash -c 'env | grep "^SLURM" | cut -d= -f1 | sort | tr "\n" " "' >alloc1.names 2>/dev/null || true
    echo "  names with salloc -n3 (1 node): $(cat alloc1.names)"
    echo "  SLURM_* in task 0 of that srun: $(cut -d= -f1 task.env | tr '\n' ' ')"
else
    bad "salloc + srun"; cat out3 err3 alloc.env 2>/dev/null || true
fi

# 4. --kill-on-bad-exit: one task fails, the other is killed at once.
t=$(now)
rc=0
timeout 60 srun --kill-on-bad-exit=1 -n2 bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 60' >out4 2>err4 || rc=$?
el=$(secs "$t")
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && awk -v e="$el" 'BEGIN { exit !(e < 15) }'; then
    ok "srun --kill-on-bad-exit=1 -n2 (task 1 exits 3, task 0 sleeps): srun rc=$rc after $el s"
    sed 's/^/    /' err4
else
    bad "srun --kill-on-bad-exit: rc=$rc after $el s"; cat out4 err4
fi

# 5. Plain failure without --kill-on-bad-exit: srun returns the task's code.
rc=0
timeout 30 srun -n2 bash -c 'exit $((SLURM_PROCID + 4))' >out5 2>err5 || rc=$?
if [ "$rc" = 5 ]; then
    ok "srun -n2 with tasks exiting 4 and 5: srun rc=$rc (the largest)"
else
    bad "srun -n2 exiting 4/5: rc=$rc"; cat out5 err5
fi

# 6. sbatch: a batch script that itself calls srun; slurm_wait_job returns
#    its status (`sbatch --wait` does too, but notices the end up to 10 s late).
cat >job.sh <<'EOF'
#!/bin/bash
#SBATCH -n 2
echo "batch on $SLURMD_NODENAME job $SLURM_JOB_ID ntasks $SLURM_NTASKS"
srun bash -c 'echo task $SLURM_PROCID'
EOF
t=$(now)
rc=0
id=$(timeout 30 sbatch --parsable -o job.out job.sh 2>err6) && slurm_wait_job "$id" 60 || rc=$?
el=$(secs "$t")
if [ "$rc" = 0 ] && grep -q '^batch on n' job.out && [ "$(grep -c '^task' job.out)" = 2 ]; then
    ok "sbatch --parsable + slurm_wait_job: job $id rc=0 after $el s; job.out: $(sort job.out | tr '\n' ';')"
else
    bad "sbatch: job ${id:-?} rc=$rc after $el s"; cat err6 job.out 2>/dev/null || true
fi
printf '#!/bin/bash\nexit 7\n' >fail.sh
t=$(now)
rc=0
id=$(timeout 30 sbatch --parsable -o /dev/null fail.sh 2>err7) && slurm_wait_job "$id" 60 || rc=$?
el=$(secs "$t")
if [ "$rc" = 7 ]; then
    ok "sbatch of a script exiting 7: slurm_wait_job rc=$rc after $el s"
else
    bad "sbatch --wait on a failing script: rc=$rc"; cat err7
fi

# 7. slurm_down leaves nothing: no process of ours, no temp dir, ports closed.
dir=$SLURM_TEST_DIR
ports=$(sed -n 's/^SlurmctldPort=//p; s/^NodeName=.* Port=\([0-9]*\).*/\1/p' "$SLURM_CONF" | tr '\n' ' ')
cd /
t=$(now)
slurm_down
el=$(secs "$t")
left=$(_slurm_strays "$dir" | tr '\n' ' ')
open=""
for p in $ports; do
    _slurm_listening "$p" && open="$open $p"
done
if [ -z "$left" ] && [ ! -e "$dir" ] && [ -z "$open" ] && [ -z "${SLURM_CONF:-}" ]; then
    ok "slurm_down in $el s: no process, dir, or listener (ports $ports) left"
else
    bad "slurm_down left: pids [$left] dir $( [ -e "$dir" ] && echo "$dir" ) ports [$open]"
fi
slurm_down   # idempotent
echo "slurm_selftest: $passed passed, $failed failed"
[ "$failed" = 0 ]
