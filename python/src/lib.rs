//! `sluice._sluice`: the native half of the `sluice` Python package.
//!
//! Everything here is a thin layer over the Rust crates: the store
//! (`sluice-store`), the near-data operators (`sluice-ndp`), pagination
//! (`sluice-paginate`) and their Arrow result sets (`sluice-arrow`). Long
//! calls release the GIL and poll for Ctrl-C while they wait; result sets
//! cross to pyarrow through the Arrow C stream interface, which hands over
//! the buffers without copying them.
#![warn(clippy::expect_used)]
#![forbid(unsafe_code)]

mod errors;
mod export;
mod handover;
mod store;

use pyo3::prelude::*;

/// The native module; `sluice/__init__.py` re-exports its names.
#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<store::Store>()?;
    m.add_class::<store::Snapshot>()?;
    m.add_class::<store::ScanIter>()?;
    m.add_class::<store::Graph>()?;
    m.add_class::<export::ExportRun>()?;
    m.add_function(wrap_pyfunction!(export::read_export, m)?)?;
    m.add_function(wrap_pyfunction!(export::export_slices, m)?)?;
    m.add_function(wrap_pyfunction!(export::start_export, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
