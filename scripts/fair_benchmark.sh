#!/usr/bin/env bash
# The fair benchmark (issue 31) end to end: training seeds 0, 1 and 2 under protocol `equalized`
# (every method, all four agent types, every GenComm onboarding epoch scored on the test set) and the
# LiDAR pair m1, m3 under protocol `reference`, as four main jobs run JOBS at a time on one shared
# dataset, then their seed archives combined into ARCHIVE (results.json, REPORT.md).
#
#   bash scripts/fair_benchmark.sh [--jobs N] [--out DIR] [--data DIR] [--archive DIR] [--quick] [--dry_run|--status]
#
# Every job is resumable: after a stop, the same command goes on where each job was. A job's log is
# OUT/logs/<job>.log; a job that fails stops the script once the running ones end (the others keep
# their progress). --dry_run prints the commands and runs nothing. --status prints, from another
# terminal, each job's state (pending, running, stopped, failed, finished), its current step and the
# last training epoch of that step. Disk: each default job's feature cache (OUT/<job>/cache) grows to
# about 20 GB; a finished job's may be deleted. --quick: every job on the quick
# profile's tiny data (a smoke run of the whole chain in well under an hour; its archive goes to
# OUT/fair_benchmark unless --archive is given). Defaults: --jobs 2 (one core each on a 2-core
# machine), --out results_fair (results_fair_quick), --data data/sim (data/sim_quick),
# --archive archive/fair_benchmark. Every job runs --profile full: the default's data at the configs' own
# budget (8 epochs = 576 steps per training, 4 per onboarding), not the default main job's 90-minute one.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=2 out="" data="" archive="" dry=0 status=0 quick="" full=" --profile full"
usage() { sed -n 7p "$0" | sed 's/^#   /usage: /' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) [ $# -ge 2 ] || usage; jobs=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --data) [ $# -ge 2 ] || usage; data=$2; shift 2 ;;
    --archive) [ $# -ge 2 ] || usage; archive=$2; shift 2 ;;
    --dry_run) dry=1; shift ;;
    --status) status=1; shift ;;
    --quick) quick=" --quick" full=""; shift ;;
    *) echo "fair_benchmark.sh: unknown argument $1" >&2; usage ;;
  esac
done
if [ -n "$quick" ]; then
  out=${out:-results_fair_quick} data=${data:-data/sim_quick} archive=${archive:-$out/fair_benchmark}
else
  out=${out:-results_fair} data=${data:-data/sim} archive=${archive:-archive/fair_benchmark}
fi
case "$jobs" in ''|*[!0-9]*|0) echo "fair_benchmark.sh: --jobs must be a positive integer, got '$jobs'" >&2; exit 2 ;; esac

# name and arguments of each main job, in the order they start
names=(seed0 seed1 seed2 reference)
args=("--seeds 0 --benchmark --score_epochs gencomm"
      "--seeds 1 --benchmark --score_epochs gencomm"
      "--seeds 2 --benchmark --score_epochs gencomm"
      "--seeds 0 --protocol reference --benchmark_types m1,m3")
threads=${OMP_NUM_THREADS:-$(( $(nproc) / jobs ))}  # a count the user set wins; else the cores shared out
[ "$threads" -ge 1 ] 2>/dev/null || threads=1
command_of() {  # the job's command line (--out and --data as given, relative to the checkout)
  echo "python tools/reproduce.py --data $data --out $out/$1 --no_robustness$quick$full $2"
}
combine=(tools/fair_benchmark.py "$out/seed0/seeds/seed0" "$out/seed1/seeds/seed1" "$out/seed2/seeds/seed2"
         "$out/reference/seeds/seed0" -o "$archive")
if [ "$dry" = 1 ]; then
  for i in "${!names[@]}"; do command_of "${names[$i]}" "${args[$i]}"; done
  echo "python ${combine[*]}"
  exit 0
fi

progress() {  # a job log's step count, its current step (program and run folder) and that step's last epoch
  awk '/ experiments\.steps: \$ / {
         n++; t = $1 " " substr($2, 1, 8); line = $0; sub(/.* experiments\.steps: \$ /, "", line)
         k = split(line, w, " "); what = w[1]; ep = ""
         for (i = 2; i < k; i++) if (w[i] == "--model_dir" || w[i] == "-o") {
           m = split(w[i + 1], p, "/"); what = what " " p[m]; break } }
       / opencood_ext\.training: epoch [0-9]+\/[0-9]+ / {
         match($0, /epoch [0-9]+\/[0-9]+/); ep = substr($0, RSTART, RLENGTH) " at " substr($2, 1, 8) }
       END { if (n) printf "; step %d since %s: %s%s", n, t, what, (ep == "" ? "" : ", " ep) }' "$1"
}
if [ "$status" = 1 ]; then  # reads OUT/logs only; starts nothing
  for name in "${names[@]}"; do
    log="$out/logs/$name.log" pid=$(cat "$out/logs/$name.pid" 2>/dev/null || true)
    if [ -e "$out/logs/$name.failed" ]; then state="failed (its log: $log)"
    elif [ -e "$out/logs/$name.done" ]; then state=finished
    elif [ -n "$pid" ] && ps -o args= -p "$pid" 2>/dev/null | grep -q fair_benchmark; then state=running
    elif [ -e "$log" ]; then state="stopped (rerun the command to resume)"
    else state=pending; fi
    echo "[fair] $name: $state$( [ -e "$log" ] && progress "$log")"
  done
  exit 0
fi

bash scripts/setup_env.sh
mkdir -p "$out/logs"
run_job() {  # name, arguments; OUT/logs/<name>.pid while it runs, then <name>.done or <name>.failed
  local log="$out/logs/$1.log"
  rm -f "$out/logs/$1.failed" "$out/logs/$1.done"
  echo "$BASHPID" > "$out/logs/$1.pid"
  echo "[fair] $1 started ($threads thread(s)): $(command_of "$1" "$2") > $log"
  # shellcheck disable=SC2086  # the arguments are words
  if OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads .venv/bin/python tools/reproduce.py \
       --data "$data" --out "$out/$1" --no_robustness$quick$full $2 > "$log" 2>&1; then
    touch "$out/logs/$1.done"
    echo "[fair] $1 finished"
  else
    touch "$out/logs/$1.failed"
    echo "[fair] $1 failed; its log: $log" >&2
  fi
  rm -f "$out/logs/$1.pid"
}
failures() { ls "$out"/logs/*.failed 2>/dev/null | wc -l; }
rm -f "$out"/logs/*.failed
set -m  # every job in a process group of its own, so that a stop reaches its python too
stop() {  # Ctrl-C or kill: end the running jobs (each keeps its checkpoints), then leave
  trap - INT TERM
  echo "[fair] stopping the running jobs; each keeps its progress (rerun this command to resume)" >&2
  for p in $(jobs -p); do kill -TERM -- "-$p" 2>/dev/null || true; done
  wait
  exit 130
}
trap stop INT TERM
for i in "${!names[@]}"; do
  while [ "$(jobs -pr | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  [ "$(failures)" = 0 ] || break   # start nothing new after a failure
  run_job "${names[$i]}" "${args[$i]}" &
done
wait
if [ "$(failures)" != 0 ]; then
  echo "[fair] a job failed: fix it, then rerun this command to resume" >&2
  exit 1
fi
echo "[fair] python ${combine[*]}"
.venv/bin/python "${combine[@]}"
