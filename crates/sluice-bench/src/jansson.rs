//! Jansson, the parser of the sliced-scroll paper's baseline, called from
//! Rust so `sluice bench read` can put it behind our I/O path: the ablation
//! cells {buffered pread, io_uring direct} × Jansson. Loaded at run time
//! (`libjansson.so.4`, Debian libjansson4) so that building Sluice does not
//! need it; the benchmark says how to install it when it is missing.
//!
//! The one place outside sluice-io with `unsafe`: a foreign parser cannot be
//! measured in our read path without calling it.

use anyhow::{Context, Result};
use std::ffi::{c_char, c_void};

type LoadB = unsafe extern "C" fn(*const c_char, usize, usize, *mut c_void) -> *mut c_void;
type Size = unsafe extern "C" fn(*const c_void) -> usize;
type ArrayGet = unsafe extern "C" fn(*const c_void, usize) -> *mut c_void;
type ObjectGet = unsafe extern "C" fn(*const c_void, *const c_char) -> *mut c_void;
type StringValue = unsafe extern "C" fn(*const c_void) -> *const c_char;
type Delete = unsafe extern "C" fn(*mut c_void);

/// `json_error_t` is 252 bytes in Jansson 2.x; this is room to spare.
const ERROR_BYTES: usize = 1024;

pub struct Jansson {
    loadb: LoadB,
    array_size: Size,
    array_get: ArrayGet,
    object_get: ObjectGet,
    string_value: StringValue,
    string_length: Size,
    delete: Delete,
    // Last: the function pointers above are valid while the library is loaded.
    _library: libloading::Library,
}

impl Jansson {
    pub fn load() -> Result<Jansson> {
        let names = ["libjansson.so.4", "libjansson.so"];
        // SAFETY: loading Jansson runs its initialisers, which only set up
        // the library's own state; it is a plain C library with no
        // process-wide side effects.
        let library = names
            .iter()
            .find_map(|n| unsafe { libloading::Library::new(n) }.ok())
            .context("Jansson is not installed: run `apt-get install -y libjansson-dev` (scripts/setup does), or pass --no-jansson")?;
        // SAFETY: each symbol is looked up with the C signature jansson.h
        // declares for it (Jansson 2.x), and the pointers are kept only as
        // long as `library`, which this struct owns.
        unsafe {
            Ok(Jansson {
                loadb: *library.get::<LoadB>(b"json_loadb\0")?,
                array_size: *library.get::<Size>(b"json_array_size\0")?,
                array_get: *library.get::<ArrayGet>(b"json_array_get\0")?,
                object_get: *library.get::<ObjectGet>(b"json_object_get\0")?,
                string_value: *library.get::<StringValue>(b"json_string_value\0")?,
                string_length: *library.get::<Size>(b"json_string_length\0")?,
                delete: *library.get::<Delete>(b"json_delete\0")?,
                _library: library,
            })
        }
    }

    /// Parses a page and walks its hits as bench/baselines/fread_jansson.c
    /// does (each hit's `_id` string and `_source`). Returns the hit count
    /// and the bytes of the ids, or what was wrong.
    pub fn walk_page(&self, page: &[u8]) -> std::result::Result<(u64, u64), String> {
        let mut error = [0u8; ERROR_BYTES];
        // SAFETY: json_loadb reads exactly `page.len()` bytes from `page`
        // (no terminator needed) and writes at most sizeof(json_error_t)
        // bytes into `error`, which is larger. The root it returns is owned
        // here (reference count one) and deleted below, after the last use
        // of the values borrowed from it; a non-null root points at a json_t,
        // whose first field is its type; the key strings are NUL-terminated
        // literals.
        unsafe {
            let root = (self.loadb)(
                page.as_ptr().cast(),
                page.len(),
                0,
                error.as_mut_ptr().cast(),
            );
            if root.is_null() {
                // json_error_t: int line, column, position; char source[80], text[160].
                let text = &error[12 + 80..12 + 80 + 160];
                let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
                return Err(String::from_utf8_lossy(&text[..end]).into_owned());
            }
            // json_t starts with its json_type, JSON_ARRAY = 1 (jansson.h).
            if *(root as *const i32) != 1 {
                (self.delete)(root);
                return Err("not a JSON array of hits".into());
            }
            let hits = (self.array_size)(root);
            let mut id_bytes = 0u64;
            let mut bad = None;
            for i in 0..hits {
                let hit = (self.array_get)(root, i);
                let id = (self.object_get)(hit, c"_id".as_ptr());
                let source = (self.object_get)(hit, c"_source".as_ptr());
                if id.is_null() || source.is_null() || (self.string_value)(id).is_null() {
                    bad = Some(format!("hit {i} has no _id string or no _source"));
                    break;
                }
                id_bytes += (self.string_length)(id) as u64;
            }
            (self.delete)(root);
            match bad {
                Some(b) => Err(b),
                None => Ok((hits as u64, id_bytes)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_hits_and_reports_bad_pages() {
        let Ok(j) = Jansson::load() else {
            // scripts/setup installs libjansson-dev; without it the
            // benchmark refuses to run its Jansson cells and says so.
            panic!("libjansson is missing: run scripts/setup");
        };
        let page = br#"[{"_id":"ab","_source":{"x":1}},{"_id":"c","_source":null}]   "#;
        assert_eq!(j.walk_page(page), Ok((2, 3)));
        assert!(j.walk_page(br#"[{"_id":"ab","_source":{"x":1}"#).is_err());
        assert!(j.walk_page(br#"[{"_source":{}}]"#).is_err());
        assert!(j.walk_page(br#"{"_id":"a"}"#).is_err());
    }
}
