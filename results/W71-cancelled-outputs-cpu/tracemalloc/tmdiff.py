import sys, tracemalloc, glob
pid = sys.argv[1]
snaps = sorted(glob.glob(f"/tmp/tm/snap-{pid}-*.tm"))
a = tracemalloc.Snapshot.load(snaps[int(sys.argv[2])]); b = tracemalloc.Snapshot.load(snaps[int(sys.argv[3])])
f = [tracemalloc.Filter(False, tracemalloc.__file__)]
a, b = a.filter_traces(f), b.filter_traces(f)
print("total", sum(s.size for s in a.statistics("filename")) / 1e6, "->", sum(s.size for s in b.statistics("filename")) / 1e6, "MB")
for st in b.compare_to(a, sys.argv[4] if len(sys.argv) > 4 else "lineno")[:15]:
    print(f"{st.size_diff/1024:+.1f} KiB {st.count_diff:+d}", st.traceback.format()[-1] if sys.argv[4:] != ["traceback"] else "\n".join(st.traceback.format()[-8:]))
