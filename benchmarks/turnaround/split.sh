#!/usr/bin/env bash
# split.sh: splits the 64 B ping-pong's round trips, ours and ib_send_lat's,
# at the kernel's events: each post's doorbell (a write() entry) and each
# completion rxe writes (a kprobe on rxe_cq_post). Two steps:
#   scripts/softroce run -- benchmarks/turnaround/split.sh record DIR [RUNS] [RDMABENCH]
#   benchmarks/turnaround/split.sh report DIR
# record (inside the guest: perf, kprobes) runs RUNS (default 3) pairs of
# 2 s captures, ours then ib_send_lat -R, into DIR (below the working
# directory, where the guest can write); report (anywhere; the splitting
# takes minutes under emulation) prints each capture's split. Clients on
# CPU 1, servers on CPU 0 (rdmabench's pinning; perftest pinned alike).
set -uo pipefail
mode=${1:?record or report}
dir=${2:?a directory}

split() {
  awk '$1 != "perf" { gsub(/[\[\]:]/, ""); k = ($4 ~ /rxecq/) ? "C" : "W"; print $2, $3, k }' |
  awk '
    function add(a, v) { printf "%s\t%.1f\n", a, v * 1e6 }
    { cpu[NR] = $1 + 0; t[NR] = $2 + 0; k[NR] = $3 } END {
      step[1] = "1 C"; step[2] = "0 W"; step[3] = "0 C"; step[4] = "1 W"
      i = 1; while (i <= NR && !(cpu[i] == 1 && k[i] == "W")) i++
      while (i <= NR) {
        j = i; ok = 1
        for (s0 = 1; s0 <= 4; s0++) { j++; while (j <= NR && (cpu[j] " " k[j]) != step[s0]) j++; if (j > NR) { ok = 0; break }; at[s0] = t[j] }
        if (!ok) break
        if (at[4] - t[i] < 0.002) { # a round of more than 2 ms was interrupted: not split
          add("1 client write -> server CQE", at[1] - t[i]); add("2 server CQE -> server write", at[2] - at[1])
          add("3 server write -> client CQE", at[3] - at[2]); add("4 client CQE -> client write", at[4] - at[3]); add("5 round trip", at[4] - t[i])
        }
        i = j
      }
    }' | sort -t "$(printf '\t')" -k1,1 -k2,2g |
  awk -F '\t' '
    function out() { if (m) printf "  %-30s median %6.1f  mean %6.1f us  (%d rounds)\n", substr(key, 3), v[int((m + 1) / 2)], sum / m, m }
    $1 != key { out(); key = $1; m = 0; sum = 0 }
    { v[++m] = $2; sum += $2 }
    END { out() }'
}

if [ "$mode" = report ]; then
  for f in "$dir"/*.txt; do
    echo "== $(basename "$f" .txt): $(cat "${f%.txt}.result" 2>/dev/null)"
    split < "$f"
  done
  exit 0
fi
runs=${3:-3}
bench=${4:-.build/bin/rdmabench}
addr=${RDMA_TEST_ADDR:?record runs inside scripts/softroce}
mkdir -p "$dir"
T=/sys/kernel/tracing
[ -d $T/events ] || mount -t tracefs nodev $T 2>/dev/null
grep -q rxecq $T/kprobe_events 2>/dev/null || echo 'p:rxecq rdma_rxe:rxe_cq_post' >> $T/kprobe_events || exit 1
# record NAME: 2 s of the whole guest's doorbells and completions.
record() {
  perf record -q -a -e raw_syscalls:sys_enter --filter 'id == 1' -e kprobes:rxecq -o /tmp/split.data -- sleep 2 > /dev/null 2>&1
  perf script -i /tmp/split.data -F comm,cpu,time,event 2> /dev/null > "$dir/$1.txt"
}
for r in $(seq "$runs"); do
  "$bench" -quick -reps 1 -cases 'latency/conn-pingpong$' -baselines '^$' -lat-iters 150000 > /tmp/split-ours.log 2>&1 &
  sleep 8
  record "ours$r"
  wait
  grep -E '^64 B' /tmp/split-ours.log | head -1 | tee "$dir/ours$r.result"
  taskset -c 0 ib_send_lat -R -s 64 -n 300000 > /dev/null 2>&1 &
  sleep 1
  taskset -c 1 ib_send_lat -R -s 64 -n 300000 "$addr" > /tmp/split-ib.log 2>&1 &
  sleep 4
  record "ib$r"
  wait
  grep -E '^ 64 ' /tmp/split-ib.log | tee "$dir/ib$r.result"
done
