import sys, tracemalloc, glob, os, time
pid = sys.argv[1]
keys = sys.argv[2:]
for s in sorted(glob.glob(f"/tmp/tm/snap-{pid}-*.tm")):
    snap = tracemalloc.Snapshot.load(s)
    stats = snap.statistics("lineno")
    row = []
    for k in keys:
        f, line = k.split(":")
        m = [x for x in stats if x.traceback[0].filename.endswith(f) and x.traceback[0].lineno == int(line)]
        row.append((sum(x.count for x in m), round(sum(x.size for x in m) / 1024, 1)))
    print(os.path.basename(s), time.strftime("%H:%M:%S", time.localtime(os.path.getmtime(s))), round(sum(x.size for x in stats)/1e6, 2), row)
