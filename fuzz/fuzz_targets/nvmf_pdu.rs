//! The NVMe/TCP framer: any bytes frame to a PDU, a need for more bytes or
//! a fatal error with a status, never a panic; a framed PDU re-encodes to a
//! PDU that frames to the same header and data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_nvmf::pdu::{Digests, Encoder, Framed, Framer, Limits};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let digests = Digests {
        header: mode & 1 != 0,
        data: mode & 2 != 0,
    };
    let framer = Framer {
        digests,
        limits: Limits::default(),
    };
    if let Ok(Framed::Pdu(pdu, used)) = framer.next(bytes) {
        assert!(used <= bytes.len());
        let mut again = Vec::new();
        Encoder {
            digests,
            data_alignment: 0,
        }
        .encode(&pdu.header, pdu.common.flags, pdu.data, &mut again);
        match framer.next(&again) {
            Ok(Framed::Pdu(back, n)) => {
                assert_eq!(n, again.len());
                assert_eq!(back.header, pdu.header);
                assert_eq!(back.data, pdu.data);
            }
            other => panic!("a re-encoded PDU did not frame: {other:?}"),
        }
    }
});
