//! Graph operators over a graph stored as key/value pairs — one pair per
//! edge, the key `source (u64 BE) ++ target (u64 BE)` (the `refs` keyspace
//! of the paper data set). One sequential scan of the edge keyspace builds
//! a compact adjacency structure (CSR) in the engine, instead of one GET
//! per vertex; neighbours, BFS and Betweenness Centrality then run on it.
//!
//! Betweenness Centrality is Brandes' algorithm on the directed graph
//! (unweighted): `BC(v) = Σ_{s≠v≠t} σ_st(v) / σ_st`. Exact runs it from
//! every vertex. Sampled runs it from `k` sources drawn uniformly without
//! replacement (seeded) and scales each vertex's dependency sum by `n / k`:
//! an unbiased estimator of the exact value (Brandes and Pich, 2007).

use crate::scan::ScanError;
use sluice_store::Store;
use std::collections::{HashMap, VecDeque};
use std::ops::Bound;

/// Bytes per edge and per vertex the structure holds, for the budget.
const EDGE_BYTES: u64 = 4;
const VERTEX_BYTES: u64 = 8 + 8 + 8;

/// Adjacency in compressed sparse rows: the targets of vertex `v` are
/// `targets[offsets[v]..offsets[v + 1]]`; vertices are numbered densely,
/// `ids[v]` is the stored id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Csr {
    /// The stored id of each vertex.
    pub ids: Vec<u64>,
    /// Where each vertex's targets start (one more entry than vertices).
    pub offsets: Vec<u64>,
    /// Targets of every vertex, in vertex order.
    pub targets: Vec<u32>,
}

/// What graph operators refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The scan of the edges failed.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// The graph outgrows its memory budget.
    #[error(
        "the graph needs more than the {budget_bytes}-byte memory budget (at {vertices} vertices and {edges} edges so far): raise the budget or run on a subgraph"
    )]
    TooLarge {
        /// The budget.
        budget_bytes: u64,
        /// Vertices seen so far.
        vertices: u64,
        /// Edges seen so far.
        edges: u64,
    },
    /// An edge key that is not two 8-byte ids.
    #[error("edge key of {0} bytes: edges are two 8-byte ids")]
    BadEdgeKey(usize),
    /// A vertex id the graph does not hold.
    #[error("vertex {0} is not in the graph")]
    UnknownVertex(u64),
    /// A BC sample size out of range.
    #[error("{0} sources asked for: use 1 to the vertex count")]
    BadSampleSize(usize),
    /// A thread count out of range.
    #[error("{0} threads: use 1 to 64")]
    BadThreads(usize),
}

impl From<sluice_store::StoreError> for GraphError {
    fn from(e: sluice_store::StoreError) -> Self {
        GraphError::Scan(ScanError::Store(e))
    }
}

/// A multiplicative hash for vertex ids: ids are not chosen by an
/// adversary here, and SipHash (the default) costs more than the rest of
/// the build per edge.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing; the high bits are the well-mixed ones, and
        // hashbrown takes its control bits from the top.
        self.0 = (id ^ (id >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap = HashMap<u64, u32, std::hash::BuildHasherDefault<IdHasher>>;

/// Slots a direct id table may hold per vertex: ids up to that many times
/// the vertex count are looked up by indexing, past it by hashing.
const DIRECT_SLOTS_PER_VERTEX: u64 = 8;
const DIRECT_MIN_SLOTS: u64 = 1 << 16;
const UNSET: u32 = u32::MAX;

/// Stored id to dense number. Ids that are small integers (the paper
/// set's are 0..n) are looked up by indexing a table, one cache line
/// instead of a hash probe; the table turns into a hash map the first time
/// an id would make it sparser than `DIRECT_SLOTS_PER_VERTEX`.
#[derive(Debug)]
enum IdIndex {
    Direct(Vec<u32>),
    Hashed(IdMap),
}

impl Default for IdIndex {
    fn default() -> Self {
        IdIndex::Direct(Vec::new())
    }
}

/// Collects edges between stored ids, numbering vertices densely in the
/// order they are first seen.
#[derive(Debug, Default)]
pub struct CsrBuilder {
    index: IdIndex,
    ids: Vec<u64>,
    edges: Vec<(u32, u32)>,
    last_source: Option<(u64, u32)>,
}

impl CsrBuilder {
    fn vertex(&mut self, id: u64) -> u32 {
        let next = self.ids.len() as u32;
        let limit = DIRECT_MIN_SLOTS.max((self.ids.len() as u64 + 1) * DIRECT_SLOTS_PER_VERTEX);
        if let IdIndex::Direct(table) = &mut self.index {
            if id < limit {
                if id as usize >= table.len() {
                    table.resize(
                        (id as usize + 1).next_power_of_two().min(limit as usize),
                        UNSET,
                    );
                }
                let slot = &mut table[id as usize];
                if *slot == UNSET {
                    *slot = next;
                    self.ids.push(id);
                }
                return *slot;
            }
            let map: IdMap = self
                .ids
                .iter()
                .enumerate()
                .map(|(v, &id)| (id, v as u32))
                .collect();
            self.index = IdIndex::Hashed(map);
        }
        let IdIndex::Hashed(map) = &mut self.index else {
            unreachable!("turned into a map above")
        };
        *map.entry(id).or_insert_with(|| {
            self.ids.push(id);
            next
        })
    }

    /// Adds the edge `source → target`.
    pub fn add(&mut self, source: u64, target: u64) {
        // Edges read from a keyspace come grouped by source: one lookup
        // per source, not per edge.
        let s = match self.last_source {
            Some((id, v)) if id == source => v,
            _ => {
                let v = self.vertex(source);
                self.last_source = Some((source, v));
                v
            }
        };
        let t = self.vertex(target);
        self.edges.push((s, t));
    }

    /// The adjacency of every edge added.
    pub fn finish(self) -> Csr {
        Csr::from_edges(self.ids, self.edges)
    }
}

impl Csr {
    /// Builds the adjacency of the edges in `keyspace` by one scan,
    /// failing as soon as it would pass `budget_bytes`. `keep(source,
    /// target)` selects a subgraph (a predicate's result, say).
    #[expect(
        clippy::expect_used,
        reason = "a pair of the edge keyspace is two 8-byte ids, checked when it was read"
    )]
    pub fn build(
        store: &Store,
        keyspace: u32,
        budget_bytes: u64,
        keep: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<Csr, GraphError> {
        let snapshot = store.snapshot();
        let mut iter = store.iter(
            keyspace,
            (Bound::Unbounded, Bound::Unbounded),
            &snapshot,
            false,
        );
        let mut builder = CsrBuilder::default();
        while let Some((key, _)) = iter.next_ref()? {
            let Ok(pair) = <[u8; 16]>::try_from(key) else {
                return Err(GraphError::BadEdgeKey(key.len()));
            };
            let s = u64::from_be_bytes(pair[..8].try_into().expect("8"));
            let t = u64::from_be_bytes(pair[8..].try_into().expect("8"));
            if !keep(s, t) {
                continue;
            }
            builder.add(s, t);
            // The build holds the edge list and the id index (at most 32
            // bytes per vertex either way) besides the CSR.
            let (vertices, edges) = (builder.ids.len() as u64, builder.edges.len() as u64);
            if edges * (EDGE_BYTES + 8) + vertices * (VERTEX_BYTES + 32) > budget_bytes {
                return Err(GraphError::TooLarge {
                    budget_bytes,
                    vertices,
                    edges,
                });
            }
        }
        Ok(builder.finish())
    }

    /// From dense vertex numbers and edges (duplicates kept once). A
    /// counting sort by source, then each row sorted on its own: linear in
    /// the edges but for the rows' own (short) sorts.
    pub fn from_edges(ids: Vec<u64>, edges: Vec<(u32, u32)>) -> Csr {
        let n = ids.len();
        let mut offsets = vec![0u64; n + 1];
        for &(s, _) in &edges {
            offsets[s as usize + 1] += 1;
        }
        for v in 0..n {
            offsets[v + 1] += offsets[v];
        }
        let mut fill: Vec<u64> = offsets[..n].to_vec();
        let mut targets = vec![0u32; edges.len()];
        for (s, t) in edges {
            targets[fill[s as usize] as usize] = t;
            fill[s as usize] += 1;
        }
        // Sort and deduplicate each row, compacting in place.
        let mut write = 0usize;
        let mut start = 0usize;
        for v in 0..n {
            let end = offsets[v + 1] as usize;
            let row = &mut targets[start..end];
            row.sort_unstable();
            let mut last: Option<u32> = None;
            let row_start = write;
            for i in start..end {
                let t = targets[i];
                if last != Some(t) {
                    targets[write] = t;
                    write += 1;
                    last = Some(t);
                }
            }
            offsets[v] = row_start as u64;
            start = end;
        }
        offsets[n] = write as u64;
        targets.truncate(write);
        Csr {
            ids,
            offsets,
            targets,
        }
    }

    /// Vertices.
    pub fn vertices(&self) -> usize {
        self.ids.len()
    }

    /// Edges.
    pub fn edges(&self) -> usize {
        self.targets.len()
    }

    /// Targets of vertex `v`.
    pub fn neighbours(&self, v: u32) -> &[u32] {
        &self.targets[self.offsets[v as usize] as usize..self.offsets[v as usize + 1] as usize]
    }

    /// The dense number of a stored id.
    pub fn vertex(&self, id: u64) -> Result<u32, GraphError> {
        self.ids
            .iter()
            .position(|&x| x == id)
            .map(|v| v as u32)
            .ok_or(GraphError::UnknownVertex(id))
    }

    /// Breadth-first search from `source` up to `max_depth` hops: the
    /// vertices reached, with their distance, in visiting order.
    pub fn bfs(&self, source: u32, max_depth: u32) -> Vec<(u32, u32)> {
        let mut dist = vec![u32::MAX; self.vertices()];
        let mut order = Vec::new();
        let mut queue = VecDeque::from([source]);
        dist[source as usize] = 0;
        while let Some(v) = queue.pop_front() {
            let d = dist[v as usize];
            order.push((v, d));
            if d == max_depth {
                continue;
            }
            for &w in self.neighbours(v) {
                if dist[w as usize] == u32::MAX {
                    dist[w as usize] = d + 1;
                    queue.push_back(w);
                }
            }
        }
        order
    }

    /// The vertex among `candidates` (stored ids) with the highest score,
    /// the lowest id on ties: (id, score).
    pub fn top_among(
        &self,
        scores: &[f64],
        candidates: &std::collections::HashSet<u64>,
    ) -> Option<(u64, f64)> {
        (0..self.vertices())
            .filter(|&v| candidates.contains(&self.ids[v]))
            .max_by(|&a, &b| {
                scores[a]
                    .total_cmp(&scores[b])
                    .then(self.ids[b].cmp(&self.ids[a]))
            })
            .map(|v| (self.ids[v], scores[v]))
    }

    /// Exact Betweenness Centrality of every vertex (Brandes), the sources
    /// spread over `threads` workers.
    pub fn betweenness(&self, threads: usize) -> Result<Vec<f64>, GraphError> {
        let sources: Vec<u32> = (0..self.vertices() as u32).collect();
        self.accumulate(&sources, 1.0, threads)
    }

    /// Betweenness Centrality estimated from `k` sources drawn with `seed`
    /// (the same sources whatever the thread count).
    pub fn betweenness_sampled(
        &self,
        k: usize,
        seed: u64,
        threads: usize,
    ) -> Result<Vec<f64>, GraphError> {
        let n = self.vertices();
        if k == 0 || k > n {
            return Err(GraphError::BadSampleSize(k));
        }
        // A partial Fisher-Yates shuffle picks k distinct sources.
        let mut order: Vec<u32> = (0..n as u32).collect();
        let mut x = seed;
        for i in 0..k {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let j = i + ((x >> 33) as usize % (n - i));
            order.swap(i, j);
        }
        self.accumulate(&order[..k], n as f64 / k as f64, threads)
    }

    /// Sums `scale` times each source's dependencies. Workers take every
    /// `threads`-th source (neighbouring sources cost alike) into their
    /// own buffers; the sums are added at the end.
    #[expect(
        clippy::expect_used,
        reason = "a worker that panicked ends the computation: it has no sound result"
    )]
    fn accumulate(
        &self,
        sources: &[u32],
        scale: f64,
        threads: usize,
    ) -> Result<Vec<f64>, GraphError> {
        if threads == 0 || threads > crate::scan::MAX_THREADS {
            return Err(GraphError::BadThreads(threads));
        }
        let n = self.vertices();
        let work = |first: usize| {
            let mut bc = vec![0.0; n];
            let mut brandes = Brandes::new(n);
            for &s in sources.iter().skip(first).step_by(threads) {
                brandes.accumulate(self, s, scale, &mut bc);
            }
            bc
        };
        if threads == 1 || sources.len() < 2 {
            return Ok(work(0));
        }
        let parts: Vec<Vec<f64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads.min(sources.len()))
                .map(|first| scope.spawn(move || work(first)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a BC worker panicked"))
                .collect()
        });
        let mut bc = vec![0.0; n];
        for part in parts {
            bc.iter_mut().zip(part).for_each(|(a, b)| *a += b);
        }
        Ok(bc)
    }
}

/// The ids (8-byte big-endian keys) of the documents in `keyspace` that
/// satisfy `predicate`: the first stage of a pipeline whose second stage
/// builds the subgraph among them. The set stays in the engine.
pub fn matching_ids(
    store: &Store,
    keyspace: u32,
    predicate: &crate::predicate::FieldPredicate,
) -> Result<std::collections::HashSet<u64>, GraphError> {
    let snapshot = store.snapshot();
    let mut iter = store.iter(
        keyspace,
        (Bound::Unbounded, Bound::Unbounded),
        &snapshot,
        false,
    );
    let mut ids = std::collections::HashSet::new();
    while let Some((key, value)) = iter.next_ref()? {
        let matched = predicate
            .matches(value)
            .map_err(|error| ScanError::Malformed {
                key: crate::scan::key_text(key),
                error,
            })?;
        if matched {
            let Ok(id) = <[u8; 8]>::try_from(key) else {
                return Err(GraphError::BadEdgeKey(key.len()));
            };
            ids.insert(u64::from_be_bytes(id));
        }
    }
    Ok(ids)
}

/// Buffers of one Brandes pass, reused from source to source.
struct Brandes {
    dist: Vec<u32>,
    sigma: Vec<f64>,
    delta: Vec<f64>,
    /// Vertices in the order the BFS reaches them: read forward it is the
    /// BFS queue, backward the order of dependency accumulation.
    order: Vec<u32>,
}

impl Brandes {
    fn new(n: usize) -> Self {
        Brandes {
            dist: vec![u32::MAX; n],
            sigma: vec![0.0; n],
            delta: vec![0.0; n],
            order: Vec::with_capacity(n),
        }
    }

    /// Adds `scale` times source `s`'s dependencies to `bc`.
    fn accumulate(&mut self, g: &Csr, s: u32, scale: f64, bc: &mut [f64]) {
        // Only what the last pass touched is reset.
        for &v in &self.order {
            self.dist[v as usize] = u32::MAX;
            self.sigma[v as usize] = 0.0;
            self.delta[v as usize] = 0.0;
        }
        self.order.clear();
        self.dist[s as usize] = 0;
        self.sigma[s as usize] = 1.0;
        self.order.push(s);
        let mut head = 0;
        while head < self.order.len() {
            let v = self.order[head] as usize;
            head += 1;
            let next = self.dist[v] + 1;
            let sigma_v = self.sigma[v];
            for &w in g.neighbours(v as u32) {
                let w = w as usize;
                if self.dist[w] == u32::MAX {
                    self.dist[w] = next;
                    self.order.push(w as u32);
                }
                if self.dist[w] == next {
                    self.sigma[w] += sigma_v;
                }
            }
        }
        // Predecessors are found again from the distances instead of being
        // stored: w precedes v on a shortest path iff dist[w] + 1 == dist[v].
        for i in (0..self.order.len()).rev() {
            let w = self.order[i] as usize;
            let next = self.dist[w] + 1;
            let mut d = 0.0;
            for &v in g.neighbours(w as u32) {
                let v = v as usize;
                if self.dist[v] == next {
                    d += (1.0 + self.delta[v]) / self.sigma[v];
                }
            }
            self.delta[w] = self.sigma[w] * d;
            if w != s as usize {
                bc[w] += scale * self.delta[w];
            }
        }
    }
}
