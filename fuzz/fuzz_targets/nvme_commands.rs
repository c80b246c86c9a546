//! NVMe controller command sequences as the node runs them: an admin
//! queue and an I/O queue are connected (Fabrics Connect, the controller
//! enabled), then any sequence of 64-byte submission entries with any
//! data goes to either. Never a panic; every command is answered with its
//! own command identifier (or held: an Asynchronous Event Request, the
//! first half of a fused Compare and Write); data for the host is at most
//! what one transfer may carry; and the queues let go of their controller
//! at the end, so the 64 controllers a subsystem holds are never used up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_io::{Device, MemoryDevice};
use sluice_nvmf::command::{Sqe, FABRICS_OPCODE};
use sluice_nvmf::controller::{
    fctype, DataNeed, Namespace, Outcome, Queue, Subsystem, CONNECT_DATA_BYTES,
};
use std::sync::{Arc, OnceLock};

const SUBNQN: &str = "nqn.2024-01.io.sluice:fuzz";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";

fn subsystem() -> &'static Arc<Subsystem> {
    static SUBSYSTEM: OnceLock<Arc<Subsystem>> = OnceLock::new();
    SUBSYSTEM.get_or_init(|| {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(512, 64));
        let ns = Namespace::new(dev).expect("a memory namespace");
        Arc::new(Subsystem::new(SUBNQN.into(), vec![ns], Vec::new()))
    })
}

fn connect(queue: &mut Queue, qid: u16, cntlid: u16) -> u16 {
    let mut sqe = Sqe::new(FABRICS_OPCODE, 1);
    sqe.0[4] = fctype::CONNECT;
    sqe.0[42..44].copy_from_slice(&qid.to_le_bytes());
    sqe.0[44..46].copy_from_slice(&31u16.to_le_bytes());
    let mut data = vec![0u8; CONNECT_DATA_BYTES];
    data[16..18].copy_from_slice(&cntlid.to_le_bytes());
    data[256..256 + SUBNQN.len()].copy_from_slice(SUBNQN.as_bytes());
    data[512..512 + HOSTNQN.len()].copy_from_slice(HOSTNQN.as_bytes());
    match queue.execute(&sqe, &data) {
        Outcome::Done { completion, .. } => {
            assert_eq!(completion.status.0, 0, "Connect of queue {qid} refused");
            completion.result as u16
        }
        other => panic!("Connect answered {other:?}"),
    }
}

fn enable(admin: &mut Queue) {
    let mut sqe = Sqe::new(FABRICS_OPCODE, 2);
    sqe.0[4] = fctype::PROPERTY_SET;
    sqe.0[44..48].copy_from_slice(&0x14u32.to_le_bytes());
    sqe.0[48..52].copy_from_slice(&(1u32 | 6 << 16 | 4 << 20).to_le_bytes());
    let Outcome::Done { completion, .. } = admin.execute(&sqe, &[]) else {
        panic!("Property Set held");
    };
    assert_eq!(completion.status.0, 0, "CC.EN refused");
}

fn check(outcome: &Outcome, cid: u16) {
    match outcome {
        Outcome::Done { data, completion } => {
            assert_eq!(completion.cid, cid, "answered with another command's id");
            assert!(data.len() <= 8 << 20, "{} bytes for the host", data.len());
        }
        Outcome::Held => {}
        Outcome::Also(_, then) => check(then, cid),
    }
}

fuzz_target!(|data: &[u8]| {
    let sub = subsystem();
    let mut admin = Queue::new(sub.clone());
    let cntlid = connect(&mut admin, 0, 0xffff);
    enable(&mut admin);
    let mut io = Queue::new(sub.clone());
    connect(&mut io, 1, cntlid);
    let mut input = data;
    while input.len() > 64 + 3 {
        let (to_io, len) = (input[0] & 1 == 1, u16::from_le_bytes([input[1], input[2]]) as usize);
        let mut sqe = Sqe([0u8; 64]);
        sqe.0.copy_from_slice(&input[3..67]);
        input = &input[67..];
        let queue = if to_io { &mut io } else { &mut admin };
        // The data a command gets: what it asks for after an R2T, else
        // what came in the capsule (bounded by the input).
        let want = match queue.data_need(&sqe) {
            Ok(DataNeed::FromHost(n)) => n,
            Ok(DataNeed::None) => len % 8192,
            Err(_) => continue,
        };
        let take = want.min(input.len());
        let (payload, rest) = input.split_at(take);
        input = rest;
        let outcome = queue.execute(&sqe, payload);
        check(&outcome, sqe.cid());
    }
    io.disconnect();
    admin.disconnect();
});
