//! The target over TCP, driven by the initiator: connection set-up, the admin
//! commands a host issues, I/O in both data paths checked against a model of
//! the device, bad input and its status codes.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use rand::{Rng, SeedableRng};
use sluice_nvmf::command::status;
use sluice_nvmf::controller::property;
use sluice_nvmf::initiator::{is_status, QueueConnection};
use sluice_nvmf::pdu::{Digests, Header};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod common;
use common::*;

#[test]
fn a_host_sets_up_a_controller_as_the_kernel_does() {
    let t = start(Vec::new());
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
    assert!(cntlid >= 1);
    let cap = admin.property_get(property::CAP, true).unwrap();
    assert_eq!(cap & 0xffff, 127, "MQES");
    assert_ne!(cap & (1 << 37), 0, "NVM command set");
    assert_eq!(
        admin.property_get(property::VS, false).unwrap(),
        0x0001_0400
    );
    assert_eq!(admin.property_get(property::CSTS, false).unwrap() & 1, 0);
    admin.enable().unwrap();
    let id = admin.identify(1, 0).unwrap();
    assert_eq!(id.len(), 4096);
    assert_eq!(&id[24..43], b"Sluice storage node");
    assert_eq!(u16::from_le_bytes([id[78], id[79]]), cntlid);
    assert_eq!(
        u32::from_le_bytes(id[516..520].try_into().unwrap()),
        2,
        "NN"
    );
    assert_ne!(
        u32::from_le_bytes(id[536..540].try_into().unwrap()) & 3,
        0,
        "SGLS"
    );
    assert_eq!(&id[768..768 + NQN.len()], NQN.as_bytes());
    assert_eq!(u16::from_le_bytes([id[1800], id[1801]]), 0, "ICDOFF");
    let list = admin.identify(2, 0).unwrap();
    assert_eq!(&list[..12], &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    let ns = admin.identify(0, 1).unwrap();
    assert_eq!(
        u64::from_le_bytes(ns[..8].try_into().unwrap()),
        DEVICE_BYTES / BLOCK as u64
    );
    assert_eq!(ns[130], 12, "LBADS of 4 KiB blocks");
    let descs = admin.identify(3, 2).unwrap();
    assert_eq!((descs[0], descs[1]), (3, 16), "a UUID descriptor");
    assert_ne!(
        descs[4..20],
        admin.identify(3, 1).unwrap()[4..20],
        "UUIDs differ"
    );
    let err = admin.identify(0, 3).unwrap_err();
    assert!(is_status(&err, status::INVALID_NAMESPACE), "{err}");
    assert_eq!(
        admin.set_queue_count(64).unwrap(),
        8,
        "granted up to the limit"
    );
}

#[test]
fn io_in_both_data_paths_matches_a_model_of_the_device() {
    for digests in no_digests_then_both() {
        let t = start(Vec::new());
        let (_admin, mut io) = connect(&t, digests);
        let blocks = (DEVICE_BYTES / BLOCK as u64) as usize;
        let mut model = vec![0u8; DEVICE_BYTES as usize];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for step in 0..120 {
            // Up to 32 blocks: 1–2 go in the capsule, more after an R2T.
            let n = rng.gen_range(1..=32usize);
            let lba = rng.gen_range(0..=blocks - n);
            let range = lba * BLOCK as usize..(lba + n) * BLOCK as usize;
            match rng.gen_range(0..4) {
                0 | 1 => {
                    let data: Vec<u8> = (0..range.len()).map(|_| rng.gen()).collect();
                    io.write(1, lba as u64, &data, BLOCK).unwrap();
                    model[range].copy_from_slice(&data);
                }
                2 => {
                    io.write_zeroes(1, lba as u64, n as u32).unwrap();
                    model[range].fill(0);
                }
                _ => {
                    let got = io.read(1, lba as u64, n as u32, BLOCK).unwrap();
                    assert!(
                        got == model[range],
                        "step {step}: read of {n} blocks at {lba}"
                    );
                }
            }
        }
        io.flush(1).unwrap();
        let all = io.read(1, 0, 32, BLOCK).unwrap();
        assert!(all == model[..32 * BLOCK as usize]);
        // The other namespace was not touched.
        assert!(io.read(2, 0, 32, BLOCK).unwrap().iter().all(|&b| b == 0));
    }
}

#[test]
fn bad_commands_get_their_status_codes() {
    let t = start(Vec::new());
    let (_admin, mut io) = connect(&t, Digests::default());
    let last = DEVICE_BYTES / BLOCK as u64 - 1;
    let err = io.read(1, last, 2, BLOCK).unwrap_err();
    assert!(is_status(&err, status::LBA_OUT_OF_RANGE), "{err}");
    let err = io.write(1, u64::MAX - 1, &[0u8; 8192], BLOCK).unwrap_err();
    assert!(is_status(&err, status::LBA_OUT_OF_RANGE), "{err}");
    let err = io.read(9, 0, 1, BLOCK).unwrap_err();
    assert!(is_status(&err, status::INVALID_NAMESPACE), "{err}");
    // The queue still works after errors.
    io.write(1, 0, &[5u8; 4096], BLOCK).unwrap();
    assert_eq!(io.read(1, 0, 1, BLOCK).unwrap(), vec![5u8; 4096]);
}

#[test]
fn connects_that_do_not_fit_are_refused() {
    let t = start(vec![HOST.into()]);
    let mut q = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let err = q
        .connect("nqn.2026-11.io.sluice:other", HOST, 0, 0xffff, 0)
        .unwrap_err();
    assert!(is_status(&err, status::CONNECT_INVALID_PARAMETERS), "{err}");
    let err = q
        .connect(
            NQN,
            "nqn.2014-08.org.nvmexpress:uuid:stranger",
            0,
            0xffff,
            0,
        )
        .unwrap_err();
    assert!(is_status(&err, status::CONNECT_INVALID_HOST), "{err}");
    // An I/O queue of a controller that does not exist.
    let err = q.connect(NQN, HOST, 1, 777, 0).unwrap_err();
    assert!(is_status(&err, status::CONNECT_INVALID_PARAMETERS), "{err}");
    // A command before Connect.
    let err = q.read(1, 0, 1, BLOCK).unwrap_err();
    assert!(is_status(&err, status::SEQUENCE_ERROR), "{err}");
}

#[test]
fn a_malformed_pdu_ends_only_its_connection_with_a_term_req() {
    let t = start(Vec::new());
    let (_admin, mut io) = connect(&t, Digests::default());
    let mut bad = QueueConnection::open(&t.address, Digests::default()).unwrap();
    // A capsule whose HLEN is not a capsule's.
    let mut pdu = vec![0x04, 0, 24, 0];
    pdu.extend_from_slice(&72u32.to_le_bytes());
    pdu.resize(72, 0);
    bad.send_raw(&pdu).unwrap();
    match bad.receive_any().unwrap() {
        (Header::C2hTermReq(term), copy) => {
            assert_eq!((term.fes, term.fei), (1, 2));
            assert_eq!(&copy[..8], &pdu[..8]);
        }
        other => panic!("{other:?}"),
    }
    assert!(bad.receive_any().is_err(), "the connection is closed");
    // Other connections go on.
    io.write(1, 3, &[9u8; 4096], BLOCK).unwrap();
    assert_eq!(io.read(1, 3, 1, BLOCK).unwrap(), vec![9u8; 4096]);
}

/// The in-capsule size the node reports (IOCCSZ) is what it takes: a
/// 128 KiB write in its capsule at the default, the same write after R2T
/// with a host that keeps to 8 KiB, and on a node set to 8 KiB a capsule
/// past it ends that connection with Data Transfer Limit Exceeded.
#[test]
fn writes_go_in_the_capsule_up_to_the_reported_size_and_after_r2t_beyond() {
    use sluice_nvmf::controller::{DEFAULT_IN_CAPSULE_BYTES, IN_CAPSULE_BYTES};
    let whole: Vec<u8> = (0..32 * BLOCK).map(|i| (i % 253) as u8).collect();
    let t = start(Vec::new());
    let (mut admin, mut io) = connect(&t, Digests::default());
    assert_eq!(admin.in_capsule_limit().unwrap(), DEFAULT_IN_CAPSULE_BYTES);
    io.in_capsule_bytes = DEFAULT_IN_CAPSULE_BYTES;
    let sent = io.bytes_sent;
    io.write(1, 64, &whole, BLOCK).unwrap();
    assert_eq!(
        io.bytes_sent - sent,
        72 + whole.len() as u64,
        "one capsule with the data, no H2CData"
    );
    assert_eq!(io.read(1, 64, 32, BLOCK).unwrap(), whole);
    io.in_capsule_bytes = IN_CAPSULE_BYTES;
    let sent = io.bytes_sent;
    io.write(2, 64, &whole, BLOCK).unwrap();
    assert!(
        io.bytes_sent - sent > 72 + whole.len() as u64,
        "the capsule, then the data in H2CData after the R2T"
    );
    assert_eq!(io.read(2, 64, 32, BLOCK).unwrap(), whole);

    let small = start_with(Vec::new(), |s, _| {
        s.with_in_capsule_bytes(IN_CAPSULE_BYTES).unwrap()
    });
    let (mut admin, mut io) = connect(&small, Digests::default());
    assert_eq!(admin.in_capsule_limit().unwrap(), IN_CAPSULE_BYTES);
    io.in_capsule_bytes = DEFAULT_IN_CAPSULE_BYTES;
    match io.write(1, 64, &whole, BLOCK) {
        Err(e) => assert!(e.to_string().contains("FES 0x5"), "{e}"),
        Ok(()) => panic!("128 KiB in the capsule past an 8 KiB IOCCSZ was taken"),
    }
    let (_admin, mut io) = connect(&small, Digests::default());
    io.in_capsule_bytes = admin.in_capsule_limit().unwrap();
    io.write(1, 64, &whole, BLOCK).unwrap();
    assert_eq!(io.read(1, 64, 32, BLOCK).unwrap(), whole);
    // Out of range settings are refused with what to give.
    let err = sluice_nvmf::controller::Subsystem::new(NQN.into(), Vec::new(), Vec::new())
        .with_in_capsule_bytes(4096)
        .err()
        .unwrap();
    assert!(err.contains("8 to 128 KiB"), "{err}");
}

fn block_of(byte: u8) -> Vec<u8> {
    vec![byte; BLOCK as usize]
}

#[test]
fn dataset_management_compare_and_copy_work_inside_the_node() {
    use sluice_nvmf::initiator::rw;
    use sluice_nvmf::nvm::opcode;
    let t = start(Vec::new());
    let (_admin, mut io) = connect(&t, Digests::default());
    for (lba, byte) in [(10u64, 1u8), (11, 2), (12, 3), (20, 4)] {
        io.write(1, lba, &block_of(byte), BLOCK).unwrap();
    }
    // Compare: equal succeeds, different fails with Compare Failure.
    io.command(rw(opcode::COMPARE, 1, 10, 1), &block_of(1))
        .unwrap();
    let err = io
        .command(rw(opcode::COMPARE, 1, 10, 1), &block_of(9))
        .unwrap_err();
    assert!(is_status(&err, status::COMPARE_FAILURE), "{err}");
    // Copy (format 0): blocks 11..13 and 20 land back to back at 100.
    let mut ranges = vec![0u8; 64];
    ranges[8..16].copy_from_slice(&11u64.to_le_bytes());
    ranges[16..18].copy_from_slice(&1u16.to_le_bytes()); // two blocks
    ranges[40..48].copy_from_slice(&20u64.to_le_bytes());
    let copy = sluice_nvmf::command::Sqe::new(opcode::COPY, 0)
        .with_nsid(1)
        .with_cdw(10, 100)
        .with_cdw(12, 1); // two ranges
    io.command(copy, &ranges).unwrap();
    let got = io.read(1, 100, 3, BLOCK).unwrap();
    assert_eq!(got, [block_of(2), block_of(3), block_of(4)].concat());
    // Dataset Management, deallocate: the blocks read as zeros after.
    let mut range = vec![0u8; 16];
    range[4..8].copy_from_slice(&2u32.to_le_bytes());
    range[8..16].copy_from_slice(&10u64.to_le_bytes());
    let dsm = sluice_nvmf::command::Sqe::new(opcode::DATASET_MANAGEMENT, 0)
        .with_nsid(1)
        .with_cdw(11, 1 << 2);
    io.command(dsm, &range).unwrap();
    assert_eq!(
        io.read(1, 10, 3, BLOCK).unwrap(),
        [vec![0u8; 8192], block_of(3)].concat()
    );
    // A copy source past the namespace.
    ranges[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let copy = sluice_nvmf::command::Sqe::new(opcode::COPY, 0)
        .with_nsid(1)
        .with_cdw(12, 1);
    let err = io.command(copy, &ranges).unwrap_err();
    assert!(is_status(&err, status::LBA_OUT_OF_RANGE), "{err}");
}

#[test]
fn copy_across_multicast_and_add_write_move_no_data_over_the_network() {
    use sluice_nvmf::command::Sqe;
    use sluice_nvmf::nvm::opcode;
    let t = start(Vec::new());
    let (_admin, mut io) = connect(&t, Digests::default());
    // MultiCast: one write of 3 blocks to both namespaces.
    let data: Vec<u8> = (0..3 * BLOCK).map(|i| (i % 251) as u8).collect();
    let multicast = Sqe::new(opcode::MULTICAST, 0)
        .with_nsid(1)
        .with_cdw(10, 40)
        .with_cdw(12, 2)
        .with_cdw(13, 0b11);
    io.command(multicast, &data).unwrap();
    assert_eq!(io.read(1, 40, 3, BLOCK).unwrap(), data);
    assert_eq!(io.read(2, 40, 3, BLOCK).unwrap(), data);
    // Copy across: namespace 1's blocks 40..43 to namespace 2 at 7.
    let across = Sqe::new(opcode::COPY_ACROSS, 0)
        .with_nsid(2)
        .with_cdw(10, 40)
        .with_cdw(12, 2)
        .with_cdw(13, 1)
        .with_cdw(14, 7);
    let answer = io.command(across, &[]).unwrap();
    assert!(answer.data.is_empty(), "nothing came back over the network");
    assert_eq!(io.read(2, 7, 3, BLOCK).unwrap(), data);
    // add_write over u32 elements: A + B into D.
    let a: Vec<u8> = (0..BLOCK / 4).flat_map(|i| (i * 3).to_le_bytes()).collect();
    let b: Vec<u8> = (0..BLOCK / 4)
        .flat_map(|i| (u32::MAX - i).to_le_bytes())
        .collect();
    io.write(1, 60, &a, BLOCK).unwrap();
    io.write(1, 61, &b, BLOCK).unwrap();
    let add = Sqe::new(opcode::ADD_WRITE, 0)
        .with_nsid(1)
        .with_cdw(2, 0)
        .with_cdw(3, 1)
        .with_cdw(10, 60)
        .with_cdw(12, 61)
        .with_cdw(14, 62);
    io.command(add, &[]).unwrap();
    let d = io.read(1, 62, 1, BLOCK).unwrap();
    let want: Vec<u8> = (0..BLOCK / 4)
        .flat_map(|i| (i * 3).wrapping_add(u32::MAX - i).to_le_bytes())
        .collect();
    assert_eq!(d, want);
    // A MultiCast naming a namespace there is not.
    let bad = Sqe::new(opcode::MULTICAST, 0)
        .with_nsid(1)
        .with_cdw(13, 0b100);
    let err = io.command(bad, &block_of(0)).unwrap_err();
    assert!(is_status(&err, status::INVALID_FIELD), "{err}");
}

/// A worker with no polling slot sleeps in epoll while commands are at
/// the device, woken by the eventfd its connections' engines signal their
/// completions to: every command is answered at once, never a 200 ms tick
/// later (a lost wake-up), with two connections' commands interleaved.
#[test]
fn a_worker_that_cannot_poll_is_woken_by_its_devices() {
    // The process's polling slots, all held here: the worker cannot poll.
    let slots: Vec<_> = std::iter::from_fn(sluice_io::spin::SpinSlot::take).collect();
    let t = start(Vec::new());
    let (_admin_a, mut a) = connect(&t, Digests::default());
    let (_admin_b, mut b) = connect(&t, Digests::default());
    a.write(1, 0, &block_of(1), BLOCK).unwrap();
    b.write(2, 0, &block_of(2), BLOCK).unwrap();
    let started = std::time::Instant::now();
    let rounds = 200;
    for _ in 0..rounds {
        assert_eq!(a.read(1, 0, 1, BLOCK).unwrap(), block_of(1));
        assert_eq!(b.read(2, 0, 1, BLOCK).unwrap(), block_of(2));
    }
    let took = started.elapsed();
    // 400 reads answered at device speed take a few tens of milliseconds;
    // a lost wake-up costs a 200 ms tick each.
    assert!(
        took < std::time::Duration::from_secs(10),
        "{} reads took {took:?}: a worker missed its devices' completions",
        2 * rounds
    );
    drop(slots);
}

/// A read's success: in its C2HData (SUCCESS flag, no response capsule)
/// on a queue whose Connect disabled SQ flow control; in a response
/// capsule after the data (and SQHD reported) on one that kept it — as the
/// Linux host connects by default. Errors always come in a capsule.
#[test]
fn a_read_succeeds_in_its_data_pdu_only_without_sq_flow_control() {
    use sluice_nvmf::initiator::read_sqe;
    use sluice_nvmf::pdu::{flags, Encoder, Header};
    let t = start(Vec::new());
    for flow_control in [false, true] {
        let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
        let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
        admin.enable().unwrap();
        admin.set_queue_count(1).unwrap();
        let mut io = QueueConnection::open(&t.address, Digests::default()).unwrap();
        io.sq_flow_control = flow_control;
        io.connect(NQN, HOST, 1, cntlid, 5000).unwrap();
        io.write(1, 9, &block_of(0x5a), BLOCK).unwrap();
        let mut out = Vec::new();
        let read = read_sqe(1, 9, 1, BLOCK).with_cid(700);
        Encoder::default().encode(&Header::CapsuleCmd(read), 0, &[], &mut out);
        // Past the namespace's end: an error, in a capsule either way.
        let past = read_sqe(1, DEVICE_BYTES / BLOCK as u64, 1, BLOCK).with_cid(701);
        Encoder::default().encode(&Header::CapsuleCmd(past), 0, &[], &mut out);
        io.send_raw(&out).unwrap();
        let (header, pdu_flags, data) = io.receive_with_flags().unwrap();
        let Header::C2hData(d) = header else {
            panic!("the read's data first, got {header:?}");
        };
        assert_eq!((d.cccid, data), (700, block_of(0x5a)));
        assert_ne!(pdu_flags & flags::LAST_PDU, 0);
        assert_eq!(
            pdu_flags & flags::SUCCESS != 0,
            !flow_control,
            "SUCCESS with SQ flow control {}",
            if flow_control { "on" } else { "off" }
        );
        let mut capsules = Vec::new();
        while capsules.len() < 1 + flow_control as usize {
            match io.receive_with_flags().unwrap() {
                (Header::CapsuleResp(c), _, _) => capsules.push(c),
                other => panic!("only capsules follow, got {other:?}"),
            }
        }
        capsules.sort_by_key(|c| c.cid);
        if flow_control {
            assert_eq!(capsules[0].cid, 700);
            assert!(capsules[0].status.is_success());
        }
        let error = capsules.last().unwrap();
        assert_eq!(error.cid, 701);
        assert_eq!(error.status, status::LBA_OUT_OF_RANGE);
        // The pipelined initiator takes either form.
        assert_eq!(io.read(1, 9, 1, BLOCK).unwrap(), block_of(0x5a));
    }
}

/// MultiCasts kept in flight with plain writes, in the capsule and after
/// R2T, to one or both namespaces: each namespace ends as a model of every
/// write says, and one that cannot run where it arrived (past the end of
/// the namespaces) still gets its error.
#[test]
fn multicasts_in_flight_land_on_every_namespace_named() {
    use rand::seq::SliceRandom;
    use sluice_nvmf::command::Sqe;
    use sluice_nvmf::nvm::opcode;
    let t = start(Vec::new());
    let (_admin, mut io) = connect(&t, Digests::default());
    let blocks_per_ns = (DEVICE_BYTES / BLOCK as u64) as u32;
    let mut model = [
        vec![0u8; DEVICE_BYTES as usize],
        vec![0u8; DEVICE_BYTES as usize],
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    for round in 0..8u8 {
        // Commands in flight together may land in any order: each of a
        // round's has a 32-block slot of its own.
        let mut slots: Vec<u32> = (0..blocks_per_ns / 32).collect();
        slots.shuffle(&mut rng);
        let mut commands: Vec<(Sqe, Vec<u8>)> = Vec::new();
        for (i, slot) in (0..24u32).zip(slots) {
            // 1 block goes in the capsule, 32 (128 KiB) after an R2T.
            let blocks = if rng.gen_bool(0.5) { 1 } else { 32 };
            let lba = slot * 32 + rng.gen_range(0..=32 - blocks);
            let fill = round.wrapping_mul(31).wrapping_add(i as u8);
            let data = vec![fill; (blocks * BLOCK) as usize];
            let (sqe, targets): (Sqe, &[usize]) = match i % 4 {
                0 => (
                    sluice_nvmf::initiator::rw(opcode::WRITE, 2, lba as u64, blocks),
                    &[1],
                ),
                1 => (multicast(lba, blocks, 0b10), &[1]),
                _ => (multicast(lba, blocks, 0b11), &[0, 1]),
            };
            for &ns in targets {
                let at = lba as usize * BLOCK as usize;
                model[ns][at..at + data.len()].copy_from_slice(&data);
            }
            commands.push((sqe, data));
        }
        let answers = io
            .commands(
                commands
                    .iter()
                    .map(|(s, d)| (s.clone(), d.as_slice()))
                    .collect(),
            )
            .unwrap();
        for a in answers {
            a.unwrap();
        }
    }
    for (ns, want) in model.iter().enumerate() {
        let mut got = Vec::new();
        for lba in (0..blocks_per_ns).step_by(32) {
            got.extend(io.read(ns as u32 + 1, lba as u64, 32, BLOCK).unwrap());
        }
        assert!(&got == want, "namespace {} differs from the model", ns + 1);
    }
    let past_end = multicast(blocks_per_ns - 1, 2, 0b11);
    let err = io
        .command(past_end, &vec![0u8; 2 * BLOCK as usize])
        .unwrap_err();
    assert!(is_status(&err, status::LBA_OUT_OF_RANGE), "{err}");

    fn multicast(lba: u32, blocks: u32, mask: u32) -> Sqe {
        Sqe::new(opcode::MULTICAST, 0)
            .with_nsid(1)
            .with_cdw(10, lba)
            .with_cdw(12, blocks - 1)
            .with_cdw(13, mask)
    }
}

/// Several hosts race fused Compare-and-Writes on one block holding a
/// counter: a round's write lands only for the host whose compare saw the
/// current value, so the final counter equals the wins, and the block is
/// always one whole version (each byte of it the same counter).
/// `hosts` hosts each try `rounds` times to increment block 5 of namespace
/// 1 (every byte the version) with a fused Compare-and-Write; the wins.
fn racing_increments(t: &Arc<Target>, hosts: usize, rounds: usize) -> u32 {
    let hosts: Vec<_> = (0..hosts)
        .map(|_| {
            let t = t.clone();
            std::thread::spawn(move || {
                let (_admin, mut io) = connect(&t, Digests::default());
                let mut wins = 0u32;
                for _ in 0..rounds {
                    let seen = io.read(1, 5, 1, BLOCK).unwrap();
                    assert!(seen.iter().all(|&b| b == seen[0]), "a torn block");
                    let next = block_of(seen[0].wrapping_add(1));
                    if io.compare_and_write(1, 5, &seen, &next, BLOCK).unwrap() {
                        wins += 1;
                    }
                }
                wins
            })
        })
        .collect();
    hosts.into_iter().map(|h| h.join().unwrap()).sum()
}

#[test]
fn fused_compare_and_write_from_racing_hosts_loses_no_update() {
    let t = Arc::new(start(Vec::new()));
    let version = |n: u8| block_of(n);
    {
        let (_admin, mut io) = connect(&t, Digests::default());
        io.write(1, 5, &version(0), BLOCK).unwrap();
    }
    let wins = racing_increments(&t, 4, 40);
    let (_admin, mut io) = connect(&t, Digests::default());
    let last = io.read(1, 5, 1, BLOCK).unwrap();
    assert!(last.iter().all(|&b| b == last[0]));
    assert_eq!(last[0] as u32, wins % 256, "every win is one increment");
    assert!(wins >= 40, "at least one host wins each round: {wins}");
    // A Compare fused to nothing: ended by the next command.
    use sluice_nvmf::command::Fuse;
    use sluice_nvmf::initiator::rw;
    use sluice_nvmf::nvm::opcode;
    let compare = rw(opcode::COMPARE, 1, 5, 1).with_fuse(Fuse::First);
    let read = rw(opcode::FLUSH, 1, 0, 1);
    let block = last.clone();
    let answers = io.commands(vec![(compare, &block), (read, &[])]).unwrap();
    assert!(is_status(
        answers[0].as_ref().unwrap_err(),
        status::FUSED_MISSING
    ));
    assert!(answers[1].is_ok());
}

#[test]
fn a_silent_host_is_disconnected_after_its_keep_alive_and_its_controller_freed() {
    let t = start(Vec::new());
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 300).unwrap();
    admin.enable().unwrap();
    admin.set_queue_count(1).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(admin.property_get(property::CSTS, false).is_err(), "closed");
    let mut io = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let err = io.connect(NQN, HOST, 1, cntlid, 0).unwrap_err();
    assert!(is_status(&err, status::CONNECT_INVALID_PARAMETERS), "{err}");
}

#[test]
fn a_host_without_keep_alive_holds_its_controller_only_for_the_nodes_limit() {
    // KATO 0 held one of the 64 controllers for as long as the connection
    // stayed open, silent or not.
    let t = start_with(Vec::new(), |s, _| {
        s.with_unkept_silence(std::time::Duration::from_millis(800))
    });
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 0).unwrap();
    admin.enable().unwrap();
    admin.set_queue_count(1).unwrap();
    // Commands keep it: 1.5 s of them, none 800 ms apart.
    for _ in 0..10 {
        std::thread::sleep(std::time::Duration::from_millis(150));
        admin.property_get(property::CSTS, false).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(2000));
    assert!(admin.property_get(property::CSTS, false).is_err(), "closed");
    let mut io = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let err = io.connect(NQN, HOST, 1, cntlid, 0).unwrap_err();
    assert!(is_status(&err, status::CONNECT_INVALID_PARAMETERS), "{err}");
}

#[test]
fn an_idle_io_queue_lives_while_its_controller_is_kept_alive_and_ends_with_it() {
    // The keep-alive timer is the controller's: an I/O queue with no I/O
    // for longer than twice the KATO was closed on its own.
    let t = start(Vec::new());
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 300).unwrap();
    admin.enable().unwrap();
    admin.set_queue_count(1).unwrap();
    let mut io = QueueConnection::open(&t.address, Digests::default()).unwrap();
    io.connect(NQN, HOST, 1, cntlid, 0).unwrap();
    for _ in 0..15 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        admin.property_get(property::CSTS, false).unwrap();
    }
    io.write(1, 0, &[5u8; 4096], BLOCK).unwrap();
    assert_eq!(io.read(1, 0, 1, BLOCK).unwrap(), vec![5u8; 4096]);
    // The admin queue goes silent: it ends after 600 ms, its I/O queue
    // with it.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        io.read(1, 0, 1, BLOCK).is_err(),
        "the I/O queue outlived its controller"
    );
}

#[test]
fn connects_and_disconnects_in_a_loop_leave_nothing_behind() {
    let t = start(Vec::new());
    // More rounds than controllers may live at once: each one's end frees it.
    for _ in 0..100 {
        let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
        admin.connect(NQN, HOST, 0, 0xffff, 0).unwrap();
        admin.enable().unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (_admin, mut io) = connect(&t, Digests::default());
    io.write(1, 0, &[1u8; 4096], BLOCK).unwrap();
}

#[test]
fn a_host_that_drops_mid_write_has_nothing_of_that_write_applied() {
    use sluice_nvmf::command::{Sgl, SglKind};
    use sluice_nvmf::initiator::rw;
    use sluice_nvmf::nvm::opcode;
    use sluice_nvmf::pdu::{DataHeader, Encoder};
    let t = start(Vec::new());
    let (_admin, mut io) = connect(&t, Digests::default());
    let old = vec![7u8; 65536];
    io.write(1, 200, &old, BLOCK).unwrap();
    let (_a, mut dropping) = connect(&t, Digests::default());
    let sqe = rw(opcode::WRITE, 1, 200, 16).with_sgl(Sgl {
        address: 0,
        length: 65536,
        kind: SglKind::Transport,
    });
    let mut out = Vec::new();
    Encoder::default().encode(&Header::CapsuleCmd(sqe), 0, &[], &mut out);
    dropping.send_raw(&out).unwrap();
    let (r2t, _) = dropping.receive_any().unwrap();
    let Header::R2t { cccid, ttag, .. } = r2t else {
        panic!("{r2t:?}")
    };
    out.clear();
    Encoder::default().encode(
        &Header::H2cData(DataHeader {
            cccid,
            ttag,
            datao: 0,
            datal: 32768,
        }),
        0,
        &[9u8; 32768],
        &mut out,
    );
    dropping.send_raw(&out).unwrap();
    drop(dropping);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(io.read(1, 200, 16, BLOCK).unwrap(), old);
    // A capsule with its data in it, dropped when part of its data has
    // been read straight into the write's pinned buffer.
    let (_a, mut dropping) = connect(&t, Digests::default());
    let sqe = rw(opcode::WRITE, 1, 200, 16).with_sgl(Sgl {
        address: 0,
        length: 65536,
        kind: SglKind::InCapsule,
    });
    out.clear();
    Encoder::default().encode(&Header::CapsuleCmd(sqe), 0, &[9u8; 65536], &mut out);
    dropping.send_raw(&out[..72 + 20_000]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    dropping.send_raw(&out[72 + 20_000..72 + 40_000]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    drop(dropping);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(io.read(1, 200, 16, BLOCK).unwrap(), old);
    assert!(
        t.subsystem.write_data_bytes().direct >= 20_000,
        "the dropped write's data went direct: {:?}",
        t.subsystem.write_data_bytes()
    );
    io.write(1, 200, &[5u8; 65536], BLOCK).unwrap();
    assert_eq!(io.read(1, 200, 16, BLOCK).unwrap(), vec![5u8; 65536]);
}

#[test]
fn the_discovery_controller_names_the_subsystem_and_where_it_is() {
    use sluice_nvmf::controller::{DISCOVERY_LOG, DISCOVERY_NQN};
    let t = start_with(Vec::new(), |s, at| s.with_address(at));
    let port = t.address.rsplit(':').next().unwrap().to_string();
    let mut d = QueueConnection::open(&t.address, Digests::default()).unwrap();
    d.connect(DISCOVERY_NQN, HOST, 0, 0xffff, 0).unwrap();
    d.enable().unwrap();
    let id = d.identify(1, 0).unwrap();
    assert_eq!(id[111], 2, "CNTRLTYPE: discovery");
    assert_eq!(
        u32::from_le_bytes(id[516..520].try_into().unwrap()),
        0,
        "no namespaces"
    );
    assert_eq!(
        &id[768..768 + DISCOVERY_NQN.len()],
        DISCOVERY_NQN.as_bytes()
    );
    let log = d.log_page(DISCOVERY_LOG, 2048).unwrap();
    assert_eq!(
        u64::from_le_bytes(log[8..16].try_into().unwrap()),
        1,
        "NUMREC"
    );
    let e = &log[1024..];
    assert_eq!((e[0], e[1], e[2]), (3, 1, 2), "TCP, IPv4, an NVM subsystem");
    assert_eq!(std::str::from_utf8(&e[32..32 + port.len()]).unwrap(), port);
    assert_eq!(&e[256..256 + NQN.len()], NQN.as_bytes());
    assert_eq!(&e[512..521], b"127.0.0.1");
    assert_eq!(
        (e[3], e[768]),
        (4, 0),
        "TREQ: SQ flow control disable supported, no secure channel; SECTYPE: no TLS"
    );
    // A discovery controller has no I/O queues and no namespaces to identify.
    let err = d.identify(0, 1).unwrap_err();
    assert!(is_status(&err, status::INVALID_FIELD), "{err}");
    let mut io = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let err = io.connect(DISCOVERY_NQN, HOST, 1, 1, 0).unwrap_err();
    assert!(is_status(&err, status::CONNECT_INVALID_PARAMETERS), "{err}");
    // An I/O controller has no discovery log.
    let (mut admin, _io) = connect(&t, Digests::default());
    let err = admin.log_page(DISCOVERY_LOG, 2048).unwrap_err();
    assert!(is_status(&err, status::INVALID_FIELD), "{err}");
}

/// A batch's commands kept 32 deep on one queue: plain Reads and Writes go
/// to the device as they arrive and complete in any order; a Flush, a Write
/// Zeroes and a bad Read among them run the slow way.
#[test]
fn pipelined_io_at_depth_32_matches_a_model_of_the_device() {
    use sluice_nvmf::command::Sqe;
    use sluice_nvmf::initiator::{read_sqe, rw};
    use sluice_nvmf::nvm::opcode;
    const SLOT_BLOCKS: usize = 32;
    for digests in no_digests_then_both() {
        let t = start(Vec::new());
        let (_admin, mut io) = connect(&t, digests);
        let bs = BLOCK as usize;
        let slots = DEVICE_BYTES as usize / bs / SLOT_BLOCKS;
        let mut model = vec![0u8; DEVICE_BYTES as usize];
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for round in 0..8 {
            // Distinct slots: no two commands of a batch touch one block.
            let mut order: Vec<usize> = (0..slots).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            enum Expect {
                Written,
                Data(std::ops::Range<usize>),
                Status(sluice_nvmf::command::Status),
            }
            let mut batch: Vec<(Sqe, Vec<u8>, Expect)> = Vec::new();
            for (k, &slot) in order.iter().take(72).enumerate() {
                let n = rng.gen_range(1..=SLOT_BLOCKS);
                let lba = slot * SLOT_BLOCKS;
                let range = lba * bs..(lba + n) * bs;
                match k % 3 {
                    // 1–2 blocks in the capsule, more after an R2T.
                    0 | 1 => {
                        let data: Vec<u8> = (0..range.len()).map(|_| rng.gen()).collect();
                        model[range].copy_from_slice(&data);
                        let sqe = rw(opcode::WRITE, 1, lba as u64, n as u32);
                        batch.push((sqe, data, Expect::Written));
                    }
                    _ => {
                        let sqe = read_sqe(1, lba as u64, n as u32, BLOCK);
                        batch.push((sqe, Vec::new(), Expect::Data(range)));
                    }
                }
            }
            // Reads are checked against the model after the batch: the
            // slots they read are not written in it.
            let zeroed = order[72] * SLOT_BLOCKS;
            model[zeroed * bs..(zeroed + SLOT_BLOCKS) * bs].fill(0);
            let zero = rw(opcode::WRITE_ZEROES, 1, zeroed as u64, SLOT_BLOCKS as u32);
            batch.insert(20, (zero, Vec::new(), Expect::Written));
            batch.insert(
                40,
                (rw(opcode::FLUSH, 1, 0, 1), Vec::new(), Expect::Written),
            );
            let past_end = read_sqe(1, DEVICE_BYTES / BLOCK as u64 - 1, 2, BLOCK);
            batch.insert(
                50,
                (
                    past_end,
                    Vec::new(),
                    Expect::Status(status::LBA_OUT_OF_RANGE),
                ),
            );
            let before = model.clone();
            let mut next = batch.iter();
            let mut answered = 0;
            io.pipeline(
                32,
                || next.next().map(|(sqe, data, _)| (sqe.clone(), &data[..])),
                |i, answer, _| {
                    answered += 1;
                    match (&batch[i].2, answer) {
                        (Expect::Written, a) => assert!(a.is_ok(), "round {round} #{i}: {a:?}"),
                        (Expect::Data(range), a) => {
                            let got = a.unwrap().data;
                            assert!(got == before[range.clone()], "round {round} #{i}: read");
                        }
                        (Expect::Status(s), a) => {
                            assert!(is_status(&a.unwrap_err(), *s), "round {round} #{i}")
                        }
                    }
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(answered, batch.len());
        }
        // The whole device, read back the slow way one command at a time.
        for (i, chunk) in model.chunks(SLOT_BLOCKS * bs).enumerate() {
            let got = io
                .read(1, (i * SLOT_BLOCKS) as u64, SLOT_BLOCKS as u32, BLOCK)
                .unwrap();
            assert!(got == chunk, "slot {i} after the rounds");
        }
    }
}

/// Runs `f` on a thread and fails the test if it takes longer than 30 s
/// (a write share never given back would hang a Compare-and-Write).
fn within_30_s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("finished within 30 s")
}

#[test]
fn compare_and_write_stays_atomic_against_pipelined_writes() {
    // One worker serves every connection (the harness's default).
    compare_and_write_races_pipelined_writes(Arc::new(start(Vec::new())));
}

#[test]
fn compare_and_write_stays_atomic_across_workers() {
    let config = sluice_nvmf::target::TargetConfig {
        workers: 3,
        ..Default::default()
    };
    compare_and_write_races_pipelined_writes(Arc::new(start_configured(
        Vec::new(),
        |s, _| s,
        config,
    )));
}

fn compare_and_write_races_pipelined_writes(t: Arc<Target>) {
    use sluice_nvmf::initiator::rw;
    use sluice_nvmf::nvm::opcode;
    {
        let (_admin, mut io) = connect(&t, Digests::default());
        io.write(1, 5, &block_of(0), BLOCK).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (t, stop) = (t.clone(), stop.clone());
        std::thread::spawn(move || {
            let (_admin, mut io) = connect(&t, Digests::default());
            let blocks: Vec<Vec<u8>> = (0..=255u8).map(block_of).collect();
            let mut i = 0usize;
            let mut written = 0u64;
            let next = || {
                if stop.load(Ordering::Relaxed) {
                    return None;
                }
                i += 1;
                let sqe = rw(opcode::WRITE, 1, 100 + (i % 100) as u64, 1);
                Some((sqe, &blocks[i % 256][..]))
            };
            io.pipeline(32, next, |_, a, _| {
                a.unwrap();
                written += 1;
                Ok(())
            })
            .unwrap();
            written
        })
    };
    let wins = within_30_s({
        let t = t.clone();
        move || racing_increments(&t, 2, 30)
    });
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0, "the pipelined writes ran alongside");
    let (_admin, mut io) = connect(&t, Digests::default());
    let last = io.read(1, 5, 1, BLOCK).unwrap();
    assert_eq!(last[0] as u32, wins % 256, "every win is one increment");
    for lba in 100..200 {
        let b = io.read(1, lba, 1, BLOCK).unwrap();
        assert!(b.iter().all(|&x| x == b[0]), "block {lba} torn");
    }
}

#[test]
fn a_host_that_leaves_with_commands_in_flight_leaves_no_write_held() {
    use sluice_nvmf::command::{Sgl, SglKind};
    use sluice_nvmf::initiator::rw;
    use sluice_nvmf::nvm::opcode;
    use sluice_nvmf::pdu::Encoder;
    let t = Arc::new(start(Vec::new()));
    for round in 0..5u8 {
        let (_a, mut leaving) = connect(&t, Digests::default());
        let mut out = Vec::new();
        for k in 0..64u16 {
            let sqe = rw(opcode::WRITE, 1, 300 + k as u64, 1)
                .with_cid(k)
                .with_sgl(Sgl {
                    address: 0,
                    length: BLOCK,
                    kind: SglKind::InCapsule,
                });
            Encoder::default().encode(&Header::CapsuleCmd(sqe), 0, &block_of(round + 1), &mut out);
        }
        leaving.send_raw(&out).unwrap();
        drop(leaving);
    }
    // Every share of the write gate came back: a Compare-and-Write, which
    // needs the namespace alone, goes through.
    let t2 = t.clone();
    within_30_s(move || {
        let (_admin, mut io) = connect(&t2, Digests::default());
        let seen = io.read(1, 5, 1, BLOCK).unwrap();
        assert!(io
            .compare_and_write(1, 5, &seen, &block_of(42), BLOCK)
            .unwrap());
        for lba in 300..364 {
            let b = io.read(1, lba, 1, BLOCK).unwrap();
            assert!(b.iter().all(|&x| x == b[0]), "block {lba} torn");
            assert!(b[0] <= 5, "block {lba}: only the rounds' writes land");
        }
    });
}

/// A host that sends a write's data PDU — H2CData after an R2T, or the
/// command capsule itself with its data in it — header first and then its
/// data slowly: the data is read straight into the write's pinned buffer
/// (the rest of the PDU is not in the receive buffer yet), its digest
/// checked there; a bad digest fails the write and writes nothing.
#[test]
fn write_data_that_arrives_after_its_header_lands_whole_and_is_digest_checked() {
    use sluice_nvmf::command::{Completion, Sgl, SglKind};
    use sluice_nvmf::initiator::rw;
    use sluice_nvmf::nvm::opcode;
    use sluice_nvmf::pdu::{DataHeader, Encoder};
    let digests = Digests {
        header: true,
        data: true,
    };
    let t = start(Vec::new());
    let (_admin, mut io) = connect(&t, digests);
    let encoder = Encoder {
        digests,
        data_alignment: 0,
    };
    let rounds = [(0u16, false), (1, true), (2, false)];
    let mut sent_bytes = 0u64;
    for in_capsule in [false, true] {
        for (round, corrupt) in rounds {
            let round = round + if in_capsule { 3 } else { 0 };
            let lba = 400 + round as u64 * 32;
            let data: Vec<u8> = (0..128 << 10)
                .map(|i: u32| (i * 7 + round as u32) as u8)
                .collect();
            let sgl = |kind| Sgl {
                address: 0,
                length: data.len() as u32,
                kind,
            };
            let mut out = Vec::new();
            if in_capsule {
                let sqe = rw(opcode::WRITE, 1, lba, 32)
                    .with_cid(100 + round)
                    .with_sgl(sgl(SglKind::InCapsule));
                encoder.encode(&Header::CapsuleCmd(sqe), 0, &data, &mut out);
            } else {
                let sqe = rw(opcode::WRITE, 1, lba, 32)
                    .with_cid(100 + round)
                    .with_sgl(sgl(SglKind::Transport));
                encoder.encode(&Header::CapsuleCmd(sqe), 0, &[], &mut out);
                io.send_raw(&out).unwrap();
                let (r2t, _) = io.receive_any().unwrap();
                let Header::R2t { cccid, ttag, .. } = r2t else {
                    panic!("{r2t:?}")
                };
                out.clear();
                let header = Header::H2cData(DataHeader {
                    cccid,
                    ttag,
                    datao: 0,
                    datal: data.len() as u32,
                });
                encoder.encode(&header, sluice_nvmf::pdu::flags::LAST_PDU, &data, &mut out);
            }
            if corrupt {
                let last = out.len() - 1;
                out[last] ^= 1;
            }
            // The header and a little data, then the rest in pieces.
            io.send_raw(&out[..1000]).unwrap();
            for piece in out[1000..].chunks(40_000) {
                std::thread::sleep(std::time::Duration::from_millis(30));
                io.send_raw(piece).unwrap();
            }
            sent_bytes += data.len() as u64;
            let (resp, _) = io.receive_any().unwrap();
            let Header::CapsuleResp(Completion { cid, status: s, .. }) = resp else {
                panic!("{resp:?}")
            };
            assert_eq!(cid, 100 + round);
            let back = io.read(1, lba, 32, BLOCK).unwrap();
            if corrupt {
                assert_eq!(s, status::TRANSIENT_TRANSPORT, "a bad data digest");
                assert!(back.iter().all(|&b| b == 0), "nothing of it written");
            } else {
                assert!(s.is_success(), "{s:?}");
                assert!(back == data, "round {round}: the data, whole");
            }
        }
    }
    // Only the bytes that came with each header were copied.
    let bytes = t.subsystem.write_data_bytes();
    assert_eq!(bytes.direct + bytes.staged, sent_bytes, "{bytes:?}");
    assert!(bytes.staged <= 6 * 1000, "{bytes:?}");
}

/// Writes of 128 KiB pipelined eight deep, in the capsule and after R2T,
/// with and without digests: after the first ones of a burst, each data
/// PDU's header is read alone and its data straight into the pinned
/// buffer — at most a header read's worth of data is copied per PDU.
#[test]
fn pipelined_big_writes_are_received_straight_into_pinned_buffers() {
    use sluice_nvmf::initiator::rw;
    use sluice_nvmf::nvm::opcode;
    const WRITES: u64 = 48;
    const BYTES: usize = 128 << 10;
    for digests in no_digests_then_both() {
        for in_capsule in [true, false] {
            let t = start(Vec::new());
            let (_admin, mut io) = connect(&t, digests);
            if !in_capsule {
                io.in_capsule_bytes = 8192;
            }
            let data: Vec<Vec<u8>> = (0..WRITES)
                .map(|w| (0..BYTES).map(|i| (i as u64 * 13 + w) as u8).collect())
                .collect();
            let mut next = 0u64;
            let mut failed = Vec::new();
            io.pipeline(
                8,
                || {
                    (next < WRITES).then(|| {
                        let w = next;
                        next += 1;
                        (rw(opcode::WRITE, 1, w * 32, 32), &data[w as usize][..])
                    })
                },
                |i, answer, _| {
                    if let Err(e) = answer {
                        failed.push((i, e.to_string()));
                    }
                    Ok(())
                },
            )
            .unwrap();
            assert!(failed.is_empty(), "{failed:?}");
            for w in 0..WRITES {
                assert!(
                    io.read(1, w * 32, 32, BLOCK).unwrap() == data[w as usize],
                    "write {w} reads back whole ({digests:?}, in capsule {in_capsule})"
                );
            }
            let bytes = t.subsystem.write_data_bytes();
            assert_eq!(bytes.direct + bytes.staged, WRITES * BYTES as u64);
            // A burst's first PDUs may come whole in one greedy read (the
            // receive buffer is 256 KiB), the rest a header's read each.
            let bound = 2 * BYTES as u64 + WRITES * 128;
            assert!(
                bytes.staged <= bound,
                "{bytes:?} (staged at most {bound}; {digests:?}, in capsule {in_capsule})"
            );
        }
    }
}

#[test]
fn the_discovery_log_says_when_tls_is_required() {
    use sluice_nvmf::controller::{DISCOVERY_LOG, DISCOVERY_NQN};
    for (required, treq) in [(true, 1u8 | 4), (false, 2 | 4)] {
        let t = start_with(Vec::new(), |s, at| s.with_address(at).with_tls(required));
        let mut d = QueueConnection::open(&t.address, Digests::default()).unwrap();
        d.connect(DISCOVERY_NQN, HOST, 0, 0xffff, 0).unwrap();
        d.enable().unwrap();
        let log = d.log_page(DISCOVERY_LOG, 2048).unwrap();
        assert_eq!(log[1024 + 3], treq, "TREQ: required {required}");
        assert_eq!(log[1024 + 768], 2, "SECTYPE: TLS 1.3");
    }
}

/// Writes of every size around the direct-read threshold, in the capsule,
/// sent as one byte stream cut at random places (headers split, data
/// split, several PDUs in one piece, pauses between pieces), with and
/// without digests: every write lands byte-exact, whichever way its data
/// was received.
#[test]
fn writes_cut_anywhere_on_the_wire_land_byte_exact() {
    use sluice_nvmf::command::{Completion, Sgl, SglKind};
    use sluice_nvmf::initiator::rw;
    use sluice_nvmf::nvm::opcode;
    use sluice_nvmf::pdu::Encoder;
    const WRITES: u16 = 40;
    for seed in 0..4u64 {
        let digests = if seed % 2 == 0 {
            Digests::default()
        } else {
            Digests {
                header: true,
                data: true,
            }
        };
        let t = start(Vec::new());
        let (_admin, mut io) = connect(&t, digests);
        let encoder = Encoder {
            digests,
            data_alignment: 0,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut stream = Vec::new();
        let mut writes = Vec::new();
        for w in 0..WRITES {
            let blocks: u32 = [1, 4, 5, 8, 16, 31, 32][rng.gen_range(0..7)];
            let lba = w as u64 * 32;
            let data: Vec<u8> = (0..blocks * BLOCK).map(|_| rng.gen()).collect();
            let sqe = rw(opcode::WRITE, 1, lba, blocks).with_cid(w).with_sgl(Sgl {
                address: 0,
                length: data.len() as u32,
                kind: SglKind::InCapsule,
            });
            encoder.encode(&Header::CapsuleCmd(sqe), 0, &data, &mut stream);
            writes.push((lba, blocks, data));
        }
        let mut at = 0;
        while at < stream.len() {
            let piece = match rng.gen_range(0..4) {
                0 => rng.gen_range(1..100),
                1 => rng.gen_range(100..20_000),
                _ => rng.gen_range(20_000..300_000),
            }
            .min(stream.len() - at);
            io.send_raw(&stream[at..at + piece]).unwrap();
            at += piece;
            if rng.gen_range(0..4) == 0 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        let mut answered = std::collections::HashSet::new();
        for _ in 0..WRITES {
            let (resp, _) = io.receive_any().unwrap();
            let Header::CapsuleResp(Completion { cid, status: s, .. }) = resp else {
                panic!("{resp:?}")
            };
            assert!(s.is_success(), "seed {seed}, write {cid}: {s:?}");
            assert!(
                answered.insert(cid),
                "seed {seed}: write {cid} answered twice"
            );
        }
        for (w, (lba, blocks, data)) in writes.iter().enumerate() {
            assert!(
                io.read(1, *lba, *blocks, BLOCK).unwrap() == *data,
                "seed {seed}, write {w} ({blocks} blocks)"
            );
        }
        let bytes = t.subsystem.write_data_bytes();
        let total: u64 = writes.iter().map(|(_, _, d)| d.len() as u64).sum();
        assert_eq!(bytes.direct + bytes.staged, total, "seed {seed}: {bytes:?}");
        assert!(
            bytes.direct > 0 && bytes.staged > 0,
            "seed {seed}: both ways taken: {bytes:?}"
        );
    }
}

#[test]
fn idle_connections_cannot_lock_hosts_out() {
    // Five times the connection limit of connections that never send an
    // ICReq: the oldest of them make room for a host's queues, and a queue
    // past its Connect is never the one closed.
    let t = start_configured(
        Vec::new(),
        |s, _| s,
        sluice_nvmf::target::TargetConfig {
            workers: 1,
            max_connections: 8,
            ..Default::default()
        },
    );
    let idle = |n: usize| -> Vec<std::net::TcpStream> {
        (0..n)
            .map(|_| std::net::TcpStream::connect(&t.address).unwrap())
            .collect()
    };
    let attack = idle(40);
    let (mut admin, mut io) = connect(&t, Digests::default());
    io.write(1, 3, &block_of(5), BLOCK).unwrap();
    let more = idle(40);
    assert_eq!(io.read(1, 3, 1, BLOCK).unwrap(), block_of(5));
    assert!(
        admin.identify(1, 0).is_ok(),
        "the admin queue is still served"
    );
    let (_admin2, mut io2) = connect(&t, Digests::default());
    assert_eq!(io2.read(1, 3, 1, BLOCK).unwrap(), block_of(5));
    drop((attack, more));
}

/// A target where `HOST` must authenticate with `host` (and, when the host
/// asks, the node with `controller`).
fn start_with_dhchap(host: &str, controller: Option<&str>) -> Target {
    use sluice_nvmf::auth::{HostSecrets, Secret};
    let secrets = HostSecrets {
        host: Secret::parse(host).unwrap(),
        controller: controller.map(|c| Secret::parse(c).unwrap()),
    };
    start_with(Vec::new(), move |s, _| {
        s.with_dhchap(std::collections::HashMap::from([(
            HOST.to_string(),
            secrets,
        )]))
    })
}

#[test]
fn a_host_with_a_secret_authenticates_every_queue_before_it_is_served() {
    use sluice_nvmf::auth::{Secret, AUTH_REQUIRED};
    let host_text = Secret::generate(32).unwrap();
    let ctrl_text = Secret::generate(48).unwrap();
    let t = start_with_dhchap(&host_text, Some(&ctrl_text));
    let (host, ctrl) = (
        Secret::parse(&host_text).unwrap(),
        Secret::parse(&ctrl_text).unwrap(),
    );
    // Connected, not authenticated: nothing but the exchange is served.
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
    let err = admin.property_get(property::CAP, true).unwrap_err();
    assert!(is_status(&err, AUTH_REQUIRED), "{err}");
    // Authenticated (the node proving itself too): served.
    let group = admin.authenticate(NQN, HOST, &host, Some(&ctrl)).unwrap();
    assert_eq!(group, 0x02, "the node takes ffdhe3072 when offered");
    admin.enable().unwrap();
    assert_eq!(admin.set_queue_count(2).unwrap(), 2);
    let mut io = QueueConnection::open(&t.address, Digests::default()).unwrap();
    io.connect(NQN, HOST, 1, cntlid, 0).unwrap();
    let err = io.read(1, 0, 1, BLOCK).unwrap_err();
    assert!(
        is_status(&err, AUTH_REQUIRED),
        "an I/O queue authenticates too: {err}"
    );
    io.authenticate(NQN, HOST, &host, None).unwrap();
    io.write(1, 9, &block_of(3), BLOCK).unwrap();
    assert_eq!(io.read(1, 9, 1, BLOCK).unwrap(), block_of(3));
    // One call, the way the initiator connects.
    let mut again = QueueConnection::open(&t.address, Digests::default()).unwrap();
    again
        .connect_authenticated(NQN, HOST, 0, 0xffff, 5000, &host, None)
        .unwrap();
}

#[test]
fn a_wrong_secret_or_a_node_that_cannot_prove_itself_is_refused() {
    use sluice_nvmf::auth::{Secret, AUTH_REQUIRED};
    let host_text = Secret::generate(32).unwrap();
    let t = start_with_dhchap(&host_text, None);
    let wrong = Secret::parse(&Secret::generate(32).unwrap()).unwrap();
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
    let err = admin.authenticate(NQN, HOST, &wrong, None).unwrap_err();
    assert!(err.to_string().contains("AUTH_Failure1"), "{err}");
    let err = admin.property_get(property::CAP, true).unwrap_err();
    assert!(is_status(&err, AUTH_REQUIRED), "{err}");
    // The host asks the node to prove itself; the node has no secret for that.
    let host = Secret::parse(&host_text).unwrap();
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
    let err = admin
        .authenticate(NQN, HOST, &host, Some(&wrong))
        .unwrap_err();
    assert!(err.to_string().contains("AUTH_Failure1"), "{err}");
    // A node that answers with another secret than the host expects.
    let other = Secret::generate(32).unwrap();
    let t = start_with_dhchap(&host_text, Some(&other));
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
    let err = admin
        .authenticate(NQN, HOST, &host, Some(&wrong))
        .unwrap_err();
    assert!(err.to_string().contains("did not prove"), "{err}");
}

#[test]
fn a_host_past_its_icreq_outlasts_silent_connections_when_room_is_made() {
    // Setup slots are a quarter of 8: 2. The host's queue has sent its
    // ICReq (and had its ICResp), not yet its Connect; then 20 silent
    // connections come: each newcomer closes a silent one, never the
    // talking host's, though it is the oldest.
    let t = start_configured(
        Vec::new(),
        |s, _| s,
        sluice_nvmf::target::TargetConfig {
            workers: 1,
            max_connections: 8,
            ..Default::default()
        },
    );
    let mut admin = QueueConnection::open(&t.address, Digests::default()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let silent: Vec<std::net::TcpStream> = (0..20)
        .map(|_| std::net::TcpStream::connect(&t.address).unwrap())
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
    assert!(cntlid >= 1);
    admin.enable().unwrap();
    drop(silent);
}
