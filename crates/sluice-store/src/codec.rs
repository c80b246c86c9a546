//! Bounds-checked little-endian decoding shared by the on-disk formats.

use crate::blocks::Extent;

/// A cursor over a record payload; every read is bounds-checked.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b, at: 0 }
    }

    /// Whether every byte was consumed.
    pub fn is_done(&self) -> bool {
        self.at == self.b.len()
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    pub fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_le_bytes(s.try_into().expect("4")))
    }
    pub fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|s| u64::from_le_bytes(s.try_into().expect("8")))
    }
    pub fn extent(&mut self) -> Option<Extent> {
        self.take(Extent::ENCODED_BYTES).map(Extent::decode)
    }
    pub fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        self.take(n).map(<[u8]>::to_vec)
    }
    pub fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?).ok()
    }
}
