//! A seeded generator of a research-paper database as key/value pairs, the
//! data set of the nKV demonstration: papers, authors, venues, and
//! references whose in-degree is skewed (a few papers are cited by many).
//!
//! Keyspaces (all created by [`generate`]):
//!
//! | keyspace | key | value |
//! |---|---|---|
//! | `papers` | `u64` paper id, big-endian | JSON `{"id","title","venue","year","authors":[ids],"abstract"}` |
//! | `authors` | `u64` author id, big-endian | JSON `{"id","name","affiliation"}` |
//! | `venues` | `u32` venue id, big-endian | JSON `{"id","name"}` |
//! | `refs` | citing id then cited id, `u64` big-endian each | empty |
//!
//! Paper ids follow publication order: a paper cites only papers with a
//! lower id, so the reference graph is acyclic, and a reference picks the
//! cited paper as `floor(citing · u³)` for `u` uniform in [0, 1): early
//! papers collect most citations, as in real citation graphs.

use sluice_store::{Store, StoreError, ValueFormat, WriteBatch};

/// Venues papers appear in.
pub const VENUES: &[&str] = &[
    "VLDB",
    "SIGMOD",
    "ICDE",
    "EDBT",
    "CIDR",
    "DaMoN",
    "FAST",
    "OSDI",
    "SOSP",
    "EuroSys",
    "ATC",
    "HotStorage",
    "SYSTOR",
    "MSST",
    "ASPLOS",
    "ISCA",
    "MICRO",
    "FPL",
    "FCCM",
    "KDD",
    "WWW",
    "CIKM",
    "TODS",
    "TKDE",
    "TOS",
];
/// Years papers are spread over, oldest first.
pub const FIRST_YEAR: u32 = 1990;
/// The latest year a paper can have.
pub const LAST_YEAR: u32 = 2024;

const WORDS: &[&str] = &[
    "adaptive",
    "approximate",
    "array",
    "batch",
    "block",
    "cache",
    "column",
    "compaction",
    "computational",
    "concurrent",
    "data",
    "direct",
    "distributed",
    "efficient",
    "embedded",
    "fast",
    "flash",
    "graph",
    "hardware",
    "hybrid",
    "index",
    "in-situ",
    "join",
    "key-value",
    "latency",
    "learned",
    "log-structured",
    "memory",
    "merge",
    "native",
    "near-data",
    "network",
    "persistent",
    "placement",
    "processing",
    "query",
    "replication",
    "scalable",
    "scan",
    "storage",
    "stream",
    "transaction",
    "tree",
    "vector",
    "workload",
];
const FIRST_NAMES: &[&str] = &[
    "Ada", "Alan", "Barbara", "Chen", "Dana", "Elena", "Farid", "Grace", "Hiro", "Ilia", "Jana",
    "Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven",
];
const LAST_NAMES: &[&str] = &[
    "Abe", "Bauer", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Huang", "Ivanova",
    "Jensen", "Kowalski", "Li", "Moreau", "Nakamura", "Okafor", "Petrov", "Quispe", "Rossi",
    "Schmidt", "Tanaka",
];
const AFFILIATIONS: &[&str] = &[
    "Reutlingen University",
    "TU Darmstadt",
    "ETH Zurich",
    "CMU",
    "MIT",
    "TU Munich",
    "University of Tokyo",
    "EPFL",
    "UC Berkeley",
    "Tsinghua University",
];

/// What to generate.
#[derive(Debug, Clone)]
pub struct PaperConfig {
    /// Papers to write.
    pub papers: u64,
    /// Authors in the pool (papers draw 1–5 of them, skewed toward a few
    /// prolific ones).
    pub authors: u64,
    /// Mean references per paper (each paper draws 0 to twice this).
    pub mean_refs: u32,
    /// Seed of everything generated.
    pub seed: u64,
}

impl PaperConfig {
    /// The nKV demonstration's proportions (about 10.5 references per
    /// paper) at `papers` papers.
    pub fn demo(papers: u64, seed: u64) -> Self {
        PaperConfig {
            papers,
            authors: (papers / 4).max(1),
            mean_refs: 10,
            seed,
        }
    }
}

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaperCounts {
    /// Papers written.
    pub papers: u64,
    /// Authors written.
    pub authors: u64,
    /// Venues written.
    pub venues: u64,
    /// Citations written.
    pub refs: u64,
    /// Bytes of keys and values written.
    pub bytes: u64,
}

/// Keyspace ids of a paper database.
#[derive(Debug, Clone, Copy)]
pub struct PaperKeyspaces {
    /// The papers keyspace.
    pub papers: u32,
    /// The authors keyspace.
    pub authors: u32,
    /// The venues keyspace.
    pub venues: u32,
    /// The citations keyspace (keys only).
    pub refs: u32,
}

/// Pairs per write batch.
const BATCH_PAIRS: usize = 512;

/// A small deterministic generator (SplitMix64): the data set must be the
/// same for a seed on every machine and every build.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }
}

/// The key of paper, author or reference ids.
pub fn id_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// The key of a citation: both ids, big-endian, citing first.
pub fn ref_key(citing: u64, cited: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&citing.to_be_bytes());
    k[8..].copy_from_slice(&cited.to_be_bytes());
    k
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn words(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| rng.pick(WORDS))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The declared fields of the JSON keyspaces (see [`crate::format`]):
/// queries naming other fields, or comparing these with literals of other
/// types, are refused before they run.
pub const PAPER_SCHEMA: &str = "id:u64,title:str,venue:str,year:u32,authors:u64[],abstract:str";
/// The authors keyspace's record schema.
pub const AUTHOR_SCHEMA: &str = "id:u64,name:str,affiliation:str";
/// The venues keyspace's record schema.
pub const VENUE_SCHEMA: &str = "id:u32,name:str";

/// Creates the four keyspaces (JSON with declared fields, except `refs`:
/// raw) if missing.
pub fn keyspaces(store: &Store) -> Result<PaperKeyspaces, StoreError> {
    let ks = |name: &str, format: ValueFormat, schema: &str| match store.keyspace(name) {
        Ok(id) => Ok(id),
        Err(StoreError::UnknownKeyspace { .. }) => store.create_keyspace(name, format, schema),
        Err(e) => Err(e),
    };
    Ok(PaperKeyspaces {
        papers: ks("papers", ValueFormat::Json, PAPER_SCHEMA)?,
        authors: ks("authors", ValueFormat::Json, AUTHOR_SCHEMA)?,
        venues: ks("venues", ValueFormat::Json, VENUE_SCHEMA)?,
        refs: ks("refs", ValueFormat::Raw, "")?,
    })
}

/// The four keyspaces if `store` has all of them (None if any is
/// missing); makes nothing.
pub fn find_keyspaces(store: &Store) -> Result<Option<PaperKeyspaces>, StoreError> {
    let ks = |name: &str| match store.keyspace(name) {
        Ok(id) => Ok(Some(id)),
        Err(StoreError::UnknownKeyspace { .. }) => Ok(None),
        Err(e) => Err(e),
    };
    let (Some(papers), Some(authors), Some(venues), Some(refs)) =
        (ks("papers")?, ks("authors")?, ks("venues")?, ks("refs")?)
    else {
        return Ok(None);
    };
    Ok(Some(PaperKeyspaces {
        papers,
        authors,
        venues,
        refs,
    }))
}

/// Writes the database into `store`; `progress(papers written)` is called
/// after each batch.
pub fn generate(
    store: &Store,
    cfg: &PaperConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<PaperCounts, StoreError> {
    let ks = keyspaces(store)?;
    let mut counts = PaperCounts::default();
    let mut batch = WriteBatch::new();
    let mut flush = |batch: &mut WriteBatch, counts: &mut PaperCounts| -> Result<(), StoreError> {
        if !batch.is_empty() {
            store.write(batch)?;
            *batch = WriteBatch::new();
        }
        progress(counts.papers);
        Ok(())
    };
    let put = |batch: &mut WriteBatch, counts: &mut PaperCounts, ks: u32, k: &[u8], v: &[u8]| {
        counts.bytes += (k.len() + v.len()) as u64;
        batch.put(ks, k, v).map(|_| ())
    };
    for (id, name) in VENUES.iter().enumerate() {
        let v = format!("{{\"id\":{id},\"name\":{}}}", json_str(name));
        put(
            &mut batch,
            &mut counts,
            ks.venues,
            &(id as u32).to_be_bytes(),
            v.as_bytes(),
        )?;
        counts.venues += 1;
    }
    let mut rng = Rng(cfg.seed);
    for id in 0..cfg.authors {
        let name = format!("{} {}", rng.pick(FIRST_NAMES), rng.pick(LAST_NAMES));
        let v = format!(
            "{{\"id\":{id},\"name\":{},\"affiliation\":{}}}",
            json_str(&name),
            json_str(rng.pick(AFFILIATIONS))
        );
        put(
            &mut batch,
            &mut counts,
            ks.authors,
            &id_key(id),
            v.as_bytes(),
        )?;
        counts.authors += 1;
        if batch.len() >= BATCH_PAIRS {
            flush(&mut batch, &mut counts)?;
        }
    }
    let years = (LAST_YEAR - FIRST_YEAR + 1) as u64;
    for id in 0..cfg.papers {
        let year = FIRST_YEAR as u64 + id * years / cfg.papers.max(1);
        let n_authors = 1 + rng.below(5);
        let authors: Vec<String> = (0..n_authors)
            .map(|_| {
                // Squared: a few prolific authors.
                let u = rng.unit();
                ((u * u * cfg.authors as f64) as u64).to_string()
            })
            .collect();
        let title_words = 3 + rng.below(6) as usize;
        let abstract_words = 40 + rng.below(60) as usize;
        let v = format!(
            "{{\"id\":{id},\"title\":{},\"venue\":{},\"year\":{year},\"authors\":[{}],\"abstract\":{}}}",
            json_str(&words(&mut rng, title_words)),
            json_str(rng.pick(VENUES)),
            authors.join(","),
            json_str(&words(&mut rng, abstract_words)),
        );
        put(
            &mut batch,
            &mut counts,
            ks.papers,
            &id_key(id),
            v.as_bytes(),
        )?;
        counts.papers += 1;
        if id > 0 {
            let n_refs = rng.below(2 * cfg.mean_refs as u64 + 1);
            let mut cited: Vec<u64> = (0..n_refs)
                .map(|_| {
                    let u = rng.unit();
                    (((id as f64) * u * u * u) as u64).min(id - 1)
                })
                .collect();
            cited.sort_unstable();
            cited.dedup();
            for c in cited {
                put(&mut batch, &mut counts, ks.refs, &ref_key(id, c), &[])?;
                counts.refs += 1;
            }
        }
        if batch.len() >= BATCH_PAIRS {
            flush(&mut batch, &mut counts)?;
        }
    }
    flush(&mut batch, &mut counts)?;
    Ok(counts)
}
