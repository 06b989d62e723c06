#!/usr/bin/env python3
"""Summarizes /proc/PID/task/*/stat samples (device call): cores busy per 100 ms, by thread
name (dlrec-parse = the reader's parse threads; dlrec = main, pool, writer, appender...), and
per-thread CPU seconds. usage: samples.py samples-TAG.txt"""
import sys
from collections import defaultdict
HZ = 100.0
samples = []  # (t, {tid: (comm, ticks)})
cur = None
for line in open(sys.argv[1]):
    if line.startswith('T '):
        cur = (float(line.split()[1]), {})
        samples.append(cur)
        continue
    a = line.split(') ')
    if len(a) < 2 or cur is None:
        continue
    tid = int(a[0].split(' (')[0]); comm = a[0].split(' (')[1]
    f = a[1].split()
    cur[1][tid] = (comm, int(f[11]) + int(f[12]))  # utime + stime (fields 14, 15)
t0 = samples[0][0]
last = {}
bucket = defaultdict(lambda: defaultdict(float))
for t, d in samples:
    b = int((t - t0) * 10)
    for tid, (comm, ticks) in d.items():
        prev = last.get(tid, (comm, 0))[1]
        bucket[b][comm] += (ticks - prev) / HZ
        last[tid] = (comm, ticks)
print("t(s)  cores busy (by thread name)")
for b in sorted(bucket):
    tot = sum(bucket[b].values())
    parts = ' '.join(f"{c}={v*10:.1f}" for c, v in sorted(bucket[b].items()))
    print(f"{b/10:4.1f}  {tot*10:5.1f}  {parts}")
per = sorted(((v[1] / HZ, tid, v[0]) for tid, v in last.items()), reverse=True)
print("threads:", len(per), " CPU s total:", round(sum(p[0] for p in per), 2))
print("top threads (CPU s, tid, name):", [(round(a, 2), b, c) for a, b, c in per[:24]])
