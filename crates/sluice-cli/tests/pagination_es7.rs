//! The pagination suite (tests/suite/pagination.rs) against a real
//! Elasticsearch 7.17.29, started by this test binary through
//! scripts/search-engine from its Maven integ-test zip with the system Java.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

const ENGINE: EngineUnderTest = EngineUnderTest {
    name: "elasticsearch",
    version: "7.17.29",
    port: 9255,
    tls_port: 9456,
};

include!("suite/pagination.rs");

/// The issue behind byte-sized pages: against Elasticsearch 7 with a 1 GiB
/// heap, an index where some documents are 100 KB to 1 MB, an export of
/// 2048 documents a page on 4 slices made the source die of
/// OutOfMemoryError. Pages sized by bytes export it exactly, and the
/// source is still up after.
#[test]
fn megabyte_documents_among_small_ones_export_exactly_and_the_source_stays_up() {
    use rand::{Rng, SeedableRng};
    let _g = serial();
    let index = "t-mixed-sizes";
    let small = 2000u64;
    papers_index(index, small, 4);
    let c = client();
    let mut rng = rand::rngs::StdRng::seed_from_u64(44);
    let mut big = Vec::new();
    for batch in 0..20u64 {
        let mut body = Vec::new();
        for i in 0..20u64 {
            let id = small + batch * 20 + i;
            let bytes = rng.gen_range(100 << 10..1 << 20);
            let doc = format!(
                "{{\"id\":{id},\"title\":\"big {id}\",\"abstract\":\"{}\"}}",
                "y".repeat(bytes)
            );
            body.extend_from_slice(format!("{{\"index\":{{\"_id\":\"{id}\"}}}}\n").as_bytes());
            body.extend_from_slice(doc.as_bytes());
            body.push(b'\n');
            big.push((id.to_string(), hash(doc.as_bytes())));
        }
        let r = c
            .send("POST", &format!("/{index}/_bulk"), Some(&body))
            .unwrap();
        assert!(r.is_success(), "{}", r.error_summary());
        assert!(!String::from_utf8_lossy(&r.body).contains("\"errors\":true"));
    }
    let r = c.send("POST", &format!("/{index}/_refresh"), None).unwrap();
    assert!(r.is_success());
    let dir = tmp("mixed-sizes");
    let dev = dir.join("export.dev");
    // The defaults: 2048 documents a page at most, one slice per shard.
    let s = export(&c, &options(index, &dev)).unwrap();
    assert_eq!(s.docs, small + big.len() as u64);
    let hits = read_all(&dev);
    let (papers, bigs): (Vec<_>, Vec<_>) = hits
        .into_iter()
        .partition(|(id, _)| id.parse::<u64>().unwrap() < small);
    assert_exact_papers(&papers, small);
    let mut bigs = bigs;
    bigs.sort();
    big.sort();
    assert_eq!(bigs, big, "the big documents, each byte-identical");
    let alive = c.send("GET", "/", None).unwrap();
    assert_eq!(alive.status, 200, "the source did not survive the export");
}
