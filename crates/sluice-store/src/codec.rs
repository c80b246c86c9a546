//! The store's use of [`sluice_io::codec`]: the one little-endian reader,
//! plus extents.

use crate::blocks::Extent;
pub(crate) use sluice_io::codec::{u32_at, u64_at, Reader};

/// Reads an [`Extent`] as encoded by [`Extent::encode`].
pub(crate) trait ReadExtent {
    fn extent(&mut self) -> Option<Extent>;
}

impl ReadExtent for Reader<'_> {
    fn extent(&mut self) -> Option<Extent> {
        self.take(Extent::ENCODED_BYTES).and_then(Extent::decode)
    }
}
