//! The storage node's NBD server without a socket: any bytes as a
//! client's handshake end in an export, an abort or a refusal, never a
//! panic, and every option gets its reply before the next is read; then
//! any sequence of requests against a 32 KiB memory namespace, checked
//! against a model of the device: a read returns what the writes, trims
//! and write-zeroes before it left, and a request past the end is refused
//! without changing anything.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_io::{Device, MemoryDevice};
use sluice_nvmf::controller::{Namespace, Subsystem};
use sluice_nvmf::nbd::fuzzing;
use std::sync::{Arc, OnceLock};

const BLOCK_BYTES: u32 = 512;
const BLOCKS: u64 = 64;

fn subsystem() -> &'static Subsystem {
    static SUBSYSTEM: OnceLock<Subsystem> = OnceLock::new();
    SUBSYSTEM.get_or_init(|| {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(BLOCK_BYTES, BLOCKS));
        let ns = Namespace::new(dev).expect("a memory namespace");
        Subsystem::new("nqn.2024-01.io.sluice:fuzz".into(), vec![ns], Vec::new())
    })
}

fn header(kind: u16, offset: u64, len: u32) -> Vec<u8> {
    let mut h = fuzzing::REQUEST_MAGIC_BYTES.to_vec();
    h.extend_from_slice(&0u16.to_be_bytes());
    h.extend_from_slice(&kind.to_be_bytes());
    h.extend_from_slice(&7u64.to_be_bytes());
    h.extend_from_slice(&offset.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let sub = subsystem();
    if mode & 1 == 0 {
        let (chosen, written, _) = fuzzing::handshake(sub, rest, mode & 2 != 0);
        // The greeting always goes out first: magic, IHAVEOPT, flags.
        assert!(written.starts_with(b"NBDMAGIC"), "{written:?}");
        if let Some(nsid) = chosen {
            assert_eq!(nsid, 1, "only namespace 1 exists");
        }
        return;
    }
    // Requests: from zeros, so the model knows the device.
    let size = fuzzing::size(sub, 1).expect("namespace 1");
    assert_eq!(size, BLOCK_BYTES as u64 * BLOCKS);
    let zero = header(fuzzing::WRITE_ZEROES, 0, size as u32);
    let (ran, _) = fuzzing::request(sub, 1, &zero).expect("a well-formed request");
    assert_eq!(ran.error, 0);
    // The memory device keeps unflushed writes (to tear them at a power
    // cut): a flush per input bounds them.
    let (ran, _) = fuzzing::request(sub, 1, &header(fuzzing::FLUSH, 0, 0)).expect("a flush");
    assert_eq!(ran.error, 0);
    let mut model = vec![0u8; size as usize];
    // Each request: kind (2 bits), offset and length within a little past
    // the end (so some are refused), then a write's data from the input.
    let mut input = rest;
    while input.len() >= 5 {
        let kind = [fuzzing::READ, fuzzing::WRITE, fuzzing::TRIM, fuzzing::WRITE_ZEROES]
            [(input[0] & 3) as usize];
        let offset = u16::from_le_bytes([input[1], input[2]]) as u64 % (size + 1024);
        let len = u16::from_le_bytes([input[3], input[4]]) as u32 % 4096;
        input = &input[5..];
        let mut request = header(kind, offset, len);
        if kind == fuzzing::WRITE {
            if input.len() < len as usize {
                return;
            }
            request.extend_from_slice(&input[..len as usize]);
            input = &input[len as usize..];
        }
        let (ran, left) = fuzzing::request(sub, 1, &request).expect("a well-formed request");
        assert!(left.is_empty());
        let end = offset + len as u64;
        if end > size {
            assert_ne!(ran.error, 0, "a request past the end was taken: {ran:?}");
            continue;
        }
        assert_eq!(ran.error, 0, "{ran:?}");
        let range = offset as usize..end as usize;
        match kind {
            fuzzing::READ => assert_eq!(ran.read, model[range], "read {offset}+{len}"),
            fuzzing::WRITE => model[range].copy_from_slice(&request[28..]),
            _ => model[range].fill(0),
        }
    }
});
