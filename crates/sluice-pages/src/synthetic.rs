//! Generated pages of the sliced-scroll paper's workload shape: pages of
//! `page_docs` paper documents of exactly [`PAPER_DOC_BYTES`] bytes each,
//! written through the same writer as `sluice export` without a search
//! engine. The read benchmark uses them to fill a device with L pages.
//!
//! Ids are ten digits, zero-padded, so every full page has the same length
//! and fills its slot the same way: the pages of an export of whole extents
//! lie back to back on the device, and a plain `fread` of the data region
//! reads exactly them.

use crate::docgen::{paper_doc, PAPER_DOC_BYTES};
use crate::error::{Error, Result};
use crate::write::{FetchedPage, PageSource};

/// Digits of every id.
pub const ID_DIGITS: usize = 10;
/// `{"_id":"` + id + `","_source":` + source + `}`.
pub const HIT_BYTES: usize = 8 + ID_DIGITS + 12 + PAPER_DOC_BYTES + 1;

/// Bytes of a page of `docs` generated documents: `[`, hits joined by
/// commas, `]\n`.
pub fn page_bytes(docs: u32) -> usize {
    let docs = docs as usize;
    1 + docs * HIT_BYTES + docs.saturating_sub(1) + 2
}

/// The pages of one slice: pages `first_page..first_page + pages` of the
/// whole data set; document ids run on from page to page.
pub struct PaperPages {
    seed: u64,
    page_docs: u32,
    next_page: u64,
    end_page: u64,
}

impl PaperPages {
    /// Slice `slice` of `slices` over `total_pages` pages, continuing after
    /// `cursor` (a checkpoint cursor this source wrote; empty = the start).
    pub fn for_slice(
        seed: u64,
        page_docs: u32,
        total_pages: u64,
        slice: u32,
        slices: u32,
        cursor: &str,
    ) -> Result<Self> {
        let per_slice = total_pages.div_ceil(slices as u64);
        let first = (slice as u64 * per_slice).min(total_pages);
        let end = (first + per_slice).min(total_pages);
        let next = if cursor.is_empty() {
            first
        } else {
            let v: serde_json::Value = serde_json::from_str(cursor)
                .map_err(|e| Error::Config(format!("generated-page cursor {cursor}: {e}")))?;
            v["next_page"].as_u64().ok_or_else(|| {
                Error::Config(format!("generated-page cursor {cursor} has no next_page"))
            })?
        };
        Ok(PaperPages {
            seed,
            page_docs,
            next_page: next.clamp(first, end),
            end_page: end,
        })
    }

    /// The bytes of page `page` of the data set.
    pub fn page(seed: u64, page_docs: u32, page: u64) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(page_bytes(page_docs));
        bytes.push(b'[');
        for i in 0..page_docs as u64 {
            let id = page * page_docs as u64 + i;
            if i > 0 {
                bytes.push(b',');
            }
            bytes.extend_from_slice(format!("{{\"_id\":\"{id:010}\",\"_source\":").as_bytes());
            bytes.extend_from_slice(&paper_doc(seed, id));
            bytes.push(b'}');
        }
        bytes.extend_from_slice(b"]\n");
        debug_assert_eq!(bytes.len(), page_bytes(page_docs));
        bytes
    }
}

impl PageSource for PaperPages {
    fn next_page(&mut self) -> Result<Option<FetchedPage>> {
        if self.next_page >= self.end_page {
            return Ok(None);
        }
        let bytes = Self::page(self.seed, self.page_docs, self.next_page);
        self.next_page += 1;
        Ok(Some(FetchedPage {
            crc32c: crc32c::crc32c(&bytes),
            bytes: bytes.into(),
            docs: self.page_docs,
            max_hit_bytes: HIT_BYTES,
            cursor_after: serde_json::json!({ "next_page": self.next_page }).to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_have_the_computed_length_and_parse() {
        let page = PaperPages::page(3, 5, 7);
        assert_eq!(page.len(), page_bytes(5));
        let v: serde_json::Value = serde_json::from_slice(&page).unwrap();
        assert_eq!(v[0]["_id"], "0000000035");
        assert_eq!(v[4]["_source"]["id"], 39);
    }

    #[test]
    fn slices_split_the_pages_and_resume_after_their_cursor() {
        let mut seen = Vec::new();
        for slice in 0..3 {
            let mut s = PaperPages::for_slice(1, 2, 10, slice, 3, "").unwrap();
            while let Some(p) = s.next_page().unwrap() {
                seen.push(p.bytes.to_vec());
                if slice == 1 && seen.len() == 5 {
                    // Start the slice again from the checkpoint cursor.
                    s = PaperPages::for_slice(1, 2, 10, slice, 3, &p.cursor_after).unwrap();
                }
            }
        }
        let expected: Vec<Vec<u8>> = (0..10).map(|p| PaperPages::page(1, 2, p)).collect();
        assert_eq!(seen, expected);
        assert!(PaperPages::for_slice(1, 2, 10, 0, 3, "{}").is_err());
    }
}
