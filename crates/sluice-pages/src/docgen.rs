//! Seeded paper-shaped documents of exactly [`PAPER_DOC_BYTES`] bytes of
//! JSON (the document size of the sliced-scroll paper's workload): id, doi,
//! title, venue, year, authors, references and an abstract that fills the rest.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Bytes of every generated paper document (the paper's documents are this long).
pub const PAPER_DOC_BYTES: usize = 1556;

const WORDS: &[&str] = &[
    "adaptive",
    "query",
    "storage",
    "index",
    "graph",
    "stream",
    "latency",
    "throughput",
    "learned",
    "vector",
    "transaction",
    "replica",
    "shard",
    "cache",
    "flash",
    "memory",
    "parallel",
    "scalable",
    "robust",
    "efficient",
    "distributed",
    "columnar",
    "compression",
    "join",
    "optimizer",
    "workload",
    "benchmark",
    "analysis",
    "model",
    "system",
    "engine",
    "pagination",
    "scroll",
    "direct",
    "kernel",
    "bypass",
    "device",
    "near-data",
    "processing",
];
const VENUES: &[&str] = &[
    "VLDB", "SIGMOD", "ICDE", "EuroSys", "OSDI", "FAST", "ATC", "SoCC", "CIDR", "DaMoN",
];
const GIVEN: &[&str] = &[
    "Ann", "Bo", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kira", "Luis",
];
const FAMILY: &[&str] = &[
    "Lee", "Novak", "Okafor", "Park", "Quinn", "Rossi", "Sato", "Tan", "Ueda", "Vargas", "Weber",
];

fn rng_for(seed: u64, id: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The JSON source of paper `id` under `seed`: the same bytes every time.
pub fn paper_doc(seed: u64, id: u64) -> Vec<u8> {
    let mut rng = rng_for(seed, id);
    let words = |rng: &mut SmallRng, n: usize| -> String {
        (0..n)
            .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let title_words = rng.gen_range(4..12);
    let title = words(&mut rng, title_words);
    let authors: Vec<String> = (0..rng.gen_range(1..7))
        .map(|_| {
            format!(
                "\"{} {}\"",
                GIVEN[rng.gen_range(0..GIVEN.len())],
                FAMILY[rng.gen_range(0..FAMILY.len())]
            )
        })
        .collect();
    let references: Vec<String> = (0..rng.gen_range(0..11))
        .map(|_| rng.gen_range(0..id.max(1)).to_string())
        .collect();
    let prefix = format!(
        "{{\"id\":{id},\"doi\":\"10.5555/sluice.{id}\",\"title\":\"{title}\",\"venue\":\"{}\",\"year\":{},\"authors\":[{}],\"references\":[{}],\"abstract\":\"",
        VENUES[rng.gen_range(0..VENUES.len())],
        rng.gen_range(1970..2026),
        authors.join(","),
        references.join(",")
    );
    let room = PAPER_DOC_BYTES - prefix.len() - 2;
    let mut text = String::with_capacity(room + 16);
    while text.len() < room {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
    text.truncate(room);
    let mut doc = prefix.into_bytes();
    doc.extend_from_slice(text.as_bytes());
    doc.extend_from_slice(b"\"}");
    debug_assert_eq!(doc.len(), PAPER_DOC_BYTES);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_exact_size_valid_json_and_repeatable() {
        for id in [0, 1, 77, 1_000_000, u32::MAX as u64 * 5] {
            let doc = paper_doc(7, id);
            assert_eq!(doc.len(), PAPER_DOC_BYTES);
            let v: serde_json::Value = serde_json::from_slice(&doc).unwrap();
            assert_eq!(v["id"], id);
            assert_eq!(doc, paper_doc(7, id));
        }
        assert_ne!(paper_doc(7, 5), paper_doc(8, 5));
    }
}
