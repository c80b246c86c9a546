//! Edits as manifest records, byte by byte as docs/FORMAT.md ("Manifest
//! log") writes them down.

use super::state::{Edit, KeyspaceDef, TableMeta, ValueFormat, WalPlace};
use super::{
    T_ADD_BLOB_FILE, T_ADD_TABLE, T_ALLOC, T_DROP_KEYSPACE, T_FREE, T_KEYSPACE, T_LAST_SEQUENCE,
    T_NEXT_FILE, T_NEXT_KEYSPACE, T_REMOVE_BLOB_FILE, T_REMOVE_TABLE, T_WAL,
};
use crate::blocks::Extent;
use crate::codec::{ReadExtent, Reader};

pub(super) fn encode_edit(edit: &Edit) -> (u8, Vec<u8>) {
    let mut p = Vec::new();
    let put_extent = |p: &mut Vec<u8>, e: &Extent| {
        let mut b = [0u8; Extent::ENCODED_BYTES];
        e.encode(&mut b);
        p.extend_from_slice(&b);
    };
    let put_bytes = |p: &mut Vec<u8>, b: &[u8]| {
        p.extend_from_slice(&(b.len() as u32).to_le_bytes());
        p.extend_from_slice(b);
    };
    let t = match edit {
        Edit::Alloc(e) => {
            put_extent(&mut p, e);
            T_ALLOC
        }
        Edit::Free(e) => {
            put_extent(&mut p, e);
            T_FREE
        }
        Edit::AddKeyspace(k) => {
            p.extend_from_slice(&k.id.to_le_bytes());
            p.push(k.format as u8);
            put_bytes(&mut p, k.name.as_bytes());
            put_bytes(&mut p, k.schema.as_bytes());
            T_KEYSPACE
        }
        Edit::AddTable(t) => {
            p.extend_from_slice(&t.keyspace.to_le_bytes());
            p.push(t.level);
            p.extend_from_slice(&t.file_no.to_le_bytes());
            put_extent(&mut p, &t.data);
            put_extent(&mut p, &t.index);
            p.extend_from_slice(&t.entries.to_le_bytes());
            put_bytes(&mut p, &t.smallest);
            put_bytes(&mut p, &t.largest);
            // Tables that reference no blob file end here, as they did
            // before blob files.
            if !t.blob_refs.is_empty() {
                p.extend_from_slice(&(t.blob_refs.len() as u32).to_le_bytes());
                for (file_no, blocks) in &t.blob_refs {
                    p.extend_from_slice(&file_no.to_le_bytes());
                    p.extend_from_slice(&blocks.to_le_bytes());
                }
            }
            T_ADD_TABLE
        }
        Edit::RemoveTable { keyspace, file_no } => {
            p.extend_from_slice(&keyspace.to_le_bytes());
            p.extend_from_slice(&file_no.to_le_bytes());
            T_REMOVE_TABLE
        }
        Edit::Wal(w) => {
            p.extend_from_slice(&w.epoch.to_le_bytes());
            p.extend_from_slice(&w.tail_seq.to_le_bytes());
            p.extend_from_slice(&(w.ring.len() as u32).to_le_bytes());
            for e in &w.ring {
                put_extent(&mut p, e);
            }
            T_WAL
        }
        Edit::LastSequence(s) => {
            p.extend_from_slice(&s.to_le_bytes());
            T_LAST_SEQUENCE
        }
        Edit::NextFile(n) => {
            p.extend_from_slice(&n.to_le_bytes());
            T_NEXT_FILE
        }
        Edit::DropKeyspace(id) => {
            p.extend_from_slice(&id.to_le_bytes());
            T_DROP_KEYSPACE
        }
        Edit::NextKeyspace(n) => {
            p.extend_from_slice(&n.to_le_bytes());
            T_NEXT_KEYSPACE
        }
        Edit::AddBlobFile { file_no, extent } => {
            p.extend_from_slice(&file_no.to_le_bytes());
            put_extent(&mut p, extent);
            T_ADD_BLOB_FILE
        }
        Edit::RemoveBlobFile(file_no) => {
            p.extend_from_slice(&file_no.to_le_bytes());
            T_REMOVE_BLOB_FILE
        }
    };
    (t, p)
}

pub(super) fn decode_edit(t: u8, payload: &[u8]) -> Option<Edit> {
    let mut r = Reader::new(payload);
    let edit = match t {
        T_ALLOC => Edit::Alloc(r.extent()?),
        T_FREE => Edit::Free(r.extent()?),
        T_KEYSPACE => Edit::AddKeyspace(KeyspaceDef {
            id: r.u32()?,
            format: ValueFormat::from_u8(r.u8()?)?,
            name: r.string()?,
            schema: r.string()?,
        }),
        T_ADD_TABLE => {
            let mut t = TableMeta {
                keyspace: r.u32()?,
                level: r.u8()?,
                file_no: r.u64()?,
                data: r.extent()?,
                index: r.extent()?,
                entries: r.u64()?,
                smallest: r.bytes()?,
                largest: r.bytes()?,
                blob_refs: Vec::new(),
            };
            if !r.is_done() {
                let n = r.u32()? as usize;
                t.blob_refs = (0..n)
                    .map(|_| Some((r.u64()?, r.u64()?)))
                    .collect::<Option<Vec<_>>>()?;
            }
            Edit::AddTable(t)
        }
        T_REMOVE_TABLE => Edit::RemoveTable {
            keyspace: r.u32()?,
            file_no: r.u64()?,
        },
        T_WAL => {
            let epoch = r.u64()?;
            let tail_seq = r.u64()?;
            let n = r.u32()? as usize;
            let ring = (0..n).map(|_| r.extent()).collect::<Option<Vec<_>>>()?;
            Edit::Wal(WalPlace {
                epoch,
                tail_seq,
                ring,
            })
        }
        T_LAST_SEQUENCE => Edit::LastSequence(r.u64()?),
        T_NEXT_FILE => Edit::NextFile(r.u64()?),
        T_DROP_KEYSPACE => Edit::DropKeyspace(r.u32()?),
        T_NEXT_KEYSPACE => Edit::NextKeyspace(r.u32()?),
        T_ADD_BLOB_FILE => Edit::AddBlobFile {
            file_no: r.u64()?,
            extent: r.extent()?,
        },
        T_REMOVE_BLOB_FILE => Edit::RemoveBlobFile(r.u64()?),
        _ => return None,
    };
    r.is_done().then_some(edit)
}
