//! The table's bloom filter: 10 bits per key, 6 probes by double hashing
//! of CRC32C.

const BLOOM_BITS_PER_KEY: usize = 10;
const BLOOM_PROBES: u32 = 6;

/// A bloom filter with double hashing.
#[derive(Debug, Clone)]
pub struct Bloom {
    pub(super) bits: Vec<u8>,
}

pub(super) fn bloom_hash(key: &[u8]) -> (u32, u32) {
    let h = crc32c::crc32c(key);
    let h2 = crc32c::crc32c_append(0x9E37_79B9, key) | 1;
    (h, h2)
}

impl Bloom {
    pub(super) fn build(keys: &[HashPair]) -> Self {
        let nbits = (keys.len() * BLOOM_BITS_PER_KEY).max(64);
        let mut bits = vec![0u8; nbits.div_ceil(8)];
        let nbits = bits.len() * 8;
        for &(h, d) in keys {
            let mut x = h;
            for _ in 0..BLOOM_PROBES {
                let bit = x as usize % nbits;
                bits[bit / 8] |= 1 << (bit % 8);
                x = x.wrapping_add(d);
            }
        }
        Bloom { bits }
    }

    /// False when the key is surely absent; true when it may be present.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        let nbits = self.bits.len() * 8;
        let (mut x, d) = bloom_hash(key);
        (0..BLOOM_PROBES).all(|_| {
            let bit = x as usize % nbits;
            x = x.wrapping_add(d);
            self.bits[bit / 8] & (1 << (bit % 8)) != 0
        })
    }
}

pub(super) type HashPair = (u32, u32);
