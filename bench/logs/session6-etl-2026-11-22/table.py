#!/usr/bin/env python3
"""One line per `bench etl` run of a log: tag, MB/s, seconds, phases, the seconds outside them."""
import re, sys
pats = dict(mbs=r'MB/s=([\d.]+)', s=r'seconds=([\d.]+)', count=r'count ([\d.]+)s',
            fit=r'fit ([\d.]+)s', tr=r'write ([\d.]+)s', wait=r'reader ([\d.]+)s',
            wr=r'busy ([\d.]+)s', cpu=r'cpu_seconds=([\d.]+)', rss=r'peak_rss=(\d+)',
            bfit=r'threads busy: fit (\d+)', btr=r'transform (\d+)%')
for f in sys.argv[1:]:
    print('==', f)
    for l in open(f):
        if 'bench etl' not in l:
            continue
        tag = l.split('bench etl')[0].strip() or 'new'
        v = {k: re.search(p, l).group(1) for k, p in pats.items()}
        other = float(v['s']) - float(v['count']) - float(v['fit']) - float(v['tr'])
        print(f"{tag:14s} {v['mbs']:>7s} MB/s  {v['s']} s  count {v['count']}  fit {v['fit']}"
              f"  transform {v['tr']}  other {other:.2f}  wait {v['wait']}  writer {v['wr']}"
              f"  cpu {v['cpu']}  rss {v['rss']}  busy {v['bfit']}/{v['btr']}%")
