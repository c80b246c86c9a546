#!/usr/bin/env python3
"""The in-memory reference of `sluice bench ndp`: exact Betweenness
Centrality with networkit (PyPI) on the graph Sluice built, timed without
the load.

    bc_networkit.py EDGES THREADS

EDGES is binary, little-endian: u32 vertex count, u32 edge count, then per
edge u32 source and u32 target (dense vertex numbers, directed). Prints one
JSON object: seconds (the run only), the top vertex, the sum of scores.
"""
import json
import struct
import sys
import time

import networkit as nk


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bc_networkit.py EDGES THREADS")
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    n, m = struct.unpack_from("<II", data, 0)
    if len(data) != 8 + 8 * m:
        sys.exit(f"{sys.argv[1]}: {len(data)} bytes, expected {8 + 8 * m}")
    edges = struct.unpack_from(f"<{2 * m}I", data, 8)
    g = nk.Graph(n, weighted=False, directed=True)
    for i in range(m):
        g.addEdge(edges[2 * i], edges[2 * i + 1])
    nk.setNumberOfThreads(int(sys.argv[2]))
    bc = nk.centrality.Betweenness(g, normalized=False)
    start = time.perf_counter()
    bc.run()
    seconds = time.perf_counter() - start
    scores = bc.scores()
    top = max(range(n), key=lambda v: (scores[v], -v))
    print(json.dumps({
        "seconds": seconds,
        "threads": nk.getMaxNumberOfThreads(),
        "vertices": n,
        "edges": m,
        "top": top,
        "top_score": scores[top],
        "score_sum": sum(scores),
    }))


if __name__ == "__main__":
    main()
