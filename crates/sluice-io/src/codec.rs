//! Little-endian field decoding for every on-device format of Sluice (the
//! store's superblock, manifest, WAL and tables; the export device's
//! manifest; the near-data result batches). One reader, bounds-checked:
//! a short or damaged buffer gives `None`, never a panic.

/// A cursor over bytes; every read is bounds-checked.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    #[inline]
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    /// A reader at byte `at` of `bytes` (reads past the end give `None`).
    #[inline]
    pub fn at(bytes: &'a [u8], at: usize) -> Self {
        Reader { bytes, at }
    }

    /// The offset of the next read.
    #[inline]
    pub fn position(&self) -> usize {
        self.at
    }

    /// Whether every byte was consumed.
    #[inline]
    pub fn is_done(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// The next `n` bytes.
    #[inline]
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    /// The next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// One byte.
    #[inline]
    pub fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    /// A little-endian u16.
    #[inline]
    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    /// A little-endian u32.
    #[inline]
    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    /// A little-endian u64.
    #[inline]
    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// Bytes preceded by their u32 length.
    pub fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        self.take(n).map(<[u8]>::to_vec)
    }

    /// UTF-8 text preceded by its u32 length.
    pub fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?).ok()
    }
}

/// The little-endian u16 at `at`; None past the end.
#[inline]
pub fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Reader::at(bytes, at).u16()
}

/// The little-endian u32 at `at`; None past the end.
#[inline]
pub fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Reader::at(bytes, at).u32()
}

/// The little-endian u64 at `at`; None past the end.
#[inline]
pub fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Reader::at(bytes, at).u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_fields_and_stops_at_the_end() {
        let b = [
            1, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, b'h', b'i',
        ];
        let mut r = Reader::new(&b);
        assert_eq!(r.u16(), Some(1));
        assert_eq!(r.u32(), Some(2));
        assert_eq!(r.u64(), Some(3));
        assert_eq!(r.string().as_deref(), Some("hi"));
        assert!(r.is_done());
        assert_eq!(r.u8(), None);
        assert_eq!(u32_at(&b, 2), Some(2));
        assert_eq!(u32_at(&b, 17), None);
        assert_eq!(u64_at(&b, usize::MAX), None);
        // A length past the end is None, not a panic.
        assert_eq!(Reader::new(&[9, 0, 0, 0, 1]).bytes(), None);
    }
}
