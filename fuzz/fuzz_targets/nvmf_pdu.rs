//! The NVMe/TCP framer: any bytes frame to a PDU, a need for more bytes or
//! a fatal error with a status, never a panic; a framed PDU re-encodes to a
//! PDU that frames to the same header and data; the header-only framing a
//! receiver uses to read data straight into its buffer agrees with it, on
//! every prefix.
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
    let whole = framer.next(bytes);
    if let Ok(Some(split)) = framer.data_header(bytes) {
        // What the header says about the data, whenever the whole PDU is
        // there too.
        if let Ok(Framed::Pdu(pdu, _)) = &whole {
            assert_eq!(split.header, pdu.header);
            assert_eq!(split.data_len, pdu.data.len());
            assert_eq!(split.data_offset, pdu.common.pdo as usize);
        }
        let end = split.data_offset + split.data_len + if split.data_digest { 4 } else { 0 };
        assert!(end >= split.data_offset);
    }
    if let Ok(Framed::Pdu(pdu, used)) = whole {
        assert!(used <= bytes.len());
        // A header-only framing of any prefix never disagrees.
        for cut in [pdu.common.pdo as usize, used / 2, used] {
            if let Ok(Some(split)) = framer.data_header(&bytes[..cut.min(used)]) {
                assert_eq!(split.header, pdu.header);
                assert_eq!(split.data_len, pdu.data.len());
            }
        }
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
