//! The finite-field Diffie-Hellman groups of DH-HMAC-CHAP (RFC 7919's
//! ffdhe2048, ffdhe3072 and ffdhe4096, generator 2): each side's key
//! pair, the shared value Z, and the challenge augmented with it — so that
//! someone who saw the exchange cannot test guesses of the secret against
//! it (NVMe Base 2.0 §8.13.5.2).

use openssl::bn::{BigNum, BigNumContext};

/// A group by its DH-HMAC-CHAP id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Its id (0x01 ffdhe2048, 0x02 ffdhe3072, 0x03 ffdhe4096).
    pub id: u8,
    prime_hex: &'static str,
}

/// The groups this node runs, in the order it prefers them: ffdhe3072
/// (about 128-bit security, as SHA-256), then the others.
pub const PREFERRED: [Group; 3] = [
    Group {
        id: 0x02,
        prime_hex: FFDHE3072_PRIME_HEX,
    },
    Group {
        id: 0x03,
        prime_hex: FFDHE4096_PRIME_HEX,
    },
    Group {
        id: 0x01,
        prime_hex: FFDHE2048_PRIME_HEX,
    },
];

/// Bits of a private exponent (RFC 7919 asks for at least twice the
/// group's security strength: 2 × 152 for ffdhe4096).
const PRIVATE_BITS: i32 = 512;

impl Group {
    /// The group with id `id`, if this node runs it.
    pub fn from_id(id: u8) -> Option<Group> {
        PREFERRED.into_iter().find(|g| g.id == id)
    }

    /// Its name (ffdhe2048, …).
    pub fn name(&self) -> &'static str {
        match self.id {
            0x01 => "ffdhe2048",
            0x02 => "ffdhe3072",
            _ => "ffdhe4096",
        }
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: RFC 7919's primes are valid hex"
    )]
    fn prime(&self) -> BigNum {
        BigNum::from_hex_str(self.prime_hex).expect("RFC 7919's primes are valid hex")
    }

    /// Bytes of the prime: of every public value and of Z.
    pub fn value_bytes(&self) -> usize {
        self.prime_hex.len() / 2
    }

    /// A new key pair: the private exponent, and the public value 2^x mod
    /// p as `value_bytes` big-endian bytes.
    pub fn key_pair(&self) -> Result<(BigNum, Vec<u8>), String> {
        let run = || -> Result<(BigNum, Vec<u8>), openssl::error::ErrorStack> {
            let mut x = BigNum::new()?;
            x.rand(PRIVATE_BITS, openssl::bn::MsbOption::MAYBE_ZERO, false)?;
            let mut public = BigNum::new()?;
            let mut ctx = BigNumContext::new()?;
            let two = BigNum::from_u32(2)?;
            public.mod_exp(&two, &x, &self.prime(), &mut ctx)?;
            let bytes = public.to_vec_padded(self.value_bytes() as i32)?;
            Ok((x, bytes))
        };
        run().map_err(|e| format!("a Diffie-Hellman key pair: {e}"))
    }

    /// Z = peer^x mod p, as `value_bytes` big-endian bytes; refused when
    /// the peer's value is not `value_bytes` long or not in [2, p − 2] (a
    /// value that forces Z into a small set).
    pub fn shared(&self, x: &BigNum, peer: &[u8]) -> Result<Vec<u8>, String> {
        if peer.len() != self.value_bytes() {
            return Err(format!(
                "a public value of {} bytes in a group of {}",
                peer.len(),
                self.value_bytes()
            ));
        }
        let run = || -> Result<Result<Vec<u8>, String>, openssl::error::ErrorStack> {
            let p = self.prime();
            let y = BigNum::from_slice(peer)?;
            let mut p_minus_1 = BigNum::new()?;
            let one = BigNum::from_u32(1)?;
            p_minus_1.checked_sub(&p, &one)?;
            if y <= one || y >= p_minus_1 {
                return Ok(Err("a public value outside [2, p - 2]".into()));
            }
            let mut z = BigNum::new()?;
            let mut ctx = BigNumContext::new()?;
            z.mod_exp(&y, x, &p, &mut ctx)?;
            Ok(Ok(z.to_vec_padded(self.value_bytes() as i32)?))
        };
        run().map_err(|e| format!("Diffie-Hellman: {e}"))?
    }
}

/// The augmented challenge: HMAC(H(Z), C), with the exchange's hash.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a digest of a valid kind"
)]
pub fn augment(hash: super::Hash, z: &[u8], challenge: &[u8]) -> Vec<u8> {
    let hashed = openssl::hash::hash(hash.digest(), z).expect("a digest of a valid kind");
    super::hmac(hash, &hashed, &[challenge])
}

/// RFC 7919's ffdhe2048 prime (generator 2), hex.
const FFDHE2048_PRIME_HEX: &str = "\
    FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695\
    A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A\
    D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935\
    984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A\
    BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4\
    AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61\
    9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005\
    C58EF1837D1683B2C6F34A26C1B2EFFA886B423861285C97FFFFFFFFFFFFFFFF";

/// RFC 7919's ffdhe3072 prime (generator 2), hex.
const FFDHE3072_PRIME_HEX: &str = "\
    FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695\
    A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A\
    D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935\
    984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A\
    BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4\
    AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61\
    9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005\
    C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B\
    BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C\
    AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF\
    5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E\
    0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B66C62E37FFFFFFFFFFFFFFFF";

/// RFC 7919's ffdhe4096 prime (generator 2), hex.
const FFDHE4096_PRIME_HEX: &str = "\
    FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695\
    A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A\
    D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935\
    984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A\
    BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4\
    AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61\
    9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005\
    C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B\
    BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C\
    AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF\
    5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E\
    0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB\
    7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A\
    7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038\
    092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF\
    8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E655F6AFFFFFFFFFFFFFFFF";

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn the_primes_are_rfc_7919s() {
        for (group, bits) in PREFERRED.iter().zip([3072, 4096, 2048]) {
            let p = group.prime();
            assert_eq!(p.num_bits(), bits);
            assert_eq!(group.value_bytes() * 8, bits as usize);
            // RFC 7919: the top and the bottom 64 bits are all ones.
            let bytes = p.to_vec();
            assert!(bytes[..8]
                .iter()
                .chain(&bytes[bytes.len() - 8..])
                .all(|&b| b == 0xff));
        }
    }

    #[test]
    fn both_sides_reach_the_same_value_and_bad_values_are_refused() {
        let group = Group::from_id(0x01).unwrap();
        let (a, a_public) = group.key_pair().unwrap();
        let (b, b_public) = group.key_pair().unwrap();
        assert_eq!(a_public.len(), 256);
        let z = group.shared(&a, &b_public).unwrap();
        assert_eq!(z, group.shared(&b, &a_public).unwrap());
        assert_ne!(a_public, b_public);
        let mut one = vec![0u8; 256];
        one[255] = 1;
        assert!(group.shared(&a, &one).is_err(), "1 forces Z = 1");
        let mut p_minus_1 = group.prime().to_vec();
        p_minus_1[255] -= 1;
        assert!(group.shared(&a, &p_minus_1).is_err(), "p - 1 forces Z = ±1");
        assert!(group.shared(&a, &b_public[1..]).is_err(), "a short value");
    }

    /// Known answers computed with Python's `hmac` and `hashlib`: Z the
    /// bytes 0, 1, …, 255, 0, … (384 of them), C the bytes 0..32.
    #[test]
    fn the_augmented_challenge_matches_an_independent_computation() {
        let z: Vec<u8> = (0..384).map(|i| (i % 256) as u8).collect();
        let c: Vec<u8> = (0..32).collect();
        assert_eq!(
            hex(&augment(super::super::Hash::Sha256, &z, &c)),
            "14ea30d2e447e16e3c5fdb26e6fab7fc92a937840fab4f9567105069dd094a40"
        );
        assert_eq!(
            hex(&augment(super::super::Hash::Sha512, &z, &c)),
            "cee302bbcdfde4a6fed6f60c5ba33eca1b6324cf1df6e6bebccad442f1e0219e0fbc0f9e7ddffa91d18061cd100c10c381cd9d3372e2e3167bad2f81ff6c8437"
        );
    }
}
