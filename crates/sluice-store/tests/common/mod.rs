//! Helpers shared by the store's test binaries.
#![allow(dead_code)] // each test binary uses its own part

pub use sluice_io::device::ProcessView;
