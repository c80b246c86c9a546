//! Hashes written in the layout before object ids (`redis.fields`) read
//! the same after the keyspace opens, and `redis.fields` is gone.

use sluice_redis::db::{Db, KEYS_KEYSPACE, LEGACY_FIELDS_KEYSPACE};
use sluice_redis::{hash, Ctx};
use sluice_store::{Store, StoreConfig, ValueFormat, WriteBatch};
use std::sync::Arc;

fn legacy_record(fields: u64, expire_at_ms: u64) -> Vec<u8> {
    let mut r = vec![1u8];
    r.extend_from_slice(&expire_at_ms.to_le_bytes());
    r.extend_from_slice(&fields.to_le_bytes());
    r
}

fn legacy_field_key(key: &[u8], field: &[u8]) -> Vec<u8> {
    let mut k = (key.len() as u32).to_be_bytes().to_vec();
    k.extend_from_slice(key);
    k.extend_from_slice(field);
    k
}

#[test]
fn hashes_of_the_old_layout_are_rewritten_at_open() {
    let dev = Arc::new(sluice_io::MemoryDevice::new(4096, 64 << 10));
    let store = Arc::new(Store::create(dev, &StoreConfig::default()).unwrap());
    let keys = store
        .create_keyspace(KEYS_KEYSPACE, ValueFormat::Raw, "")
        .unwrap();
    let fields = store
        .create_keyspace(LEGACY_FIELDS_KEYSPACE, ValueFormat::Raw, "")
        .unwrap();
    let mut b = WriteBatch::new();
    let far = 4_000_000_000_000u64;
    // "h" and its prefix sibling "h2" (the length in the prefix keeps
    // their fields apart), a big one, and a string beside them.
    b.put(keys, b"h", &legacy_record(2, 0)).unwrap();
    b.put(fields, &legacy_field_key(b"h", b"a"), b"1").unwrap();
    b.put(fields, &legacy_field_key(b"h", b"b"), b"2").unwrap();
    b.put(keys, b"h2", &legacy_record(1, far)).unwrap();
    b.put(fields, &legacy_field_key(b"h2", b"c"), b"3").unwrap();
    b.put(keys, b"big", &legacy_record(3000, 0)).unwrap();
    for i in 0..3000u32 {
        let value = vec![b'v'; 2000];
        b.put(
            fields,
            &legacy_field_key(b"big", format!("f{i:05}").as_bytes()),
            &value,
        )
        .unwrap();
    }
    let mut s = vec![0u8];
    s.extend_from_slice(&0u64.to_le_bytes());
    s.extend_from_slice(b"plain");
    b.put(keys, b"s", &s).unwrap();
    store.write(&b).unwrap();

    let db = Db::open(store.clone()).unwrap();
    let ctx = Ctx::new(&db, 1000);
    let pairs = |key: &[u8]| hash::all(&ctx, key).unwrap();
    assert_eq!(
        pairs(b"h"),
        vec![
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), b"2".to_vec())
        ]
    );
    assert_eq!(pairs(b"h2"), vec![(b"c".to_vec(), b"3".to_vec())]);
    assert_eq!(ctx.get(b"h2").unwrap().unwrap().expire_at_ms, far);
    let big = pairs(b"big");
    assert_eq!(big.len(), 3000);
    assert_eq!(hash::get(&ctx, b"big").unwrap().unwrap().len, 3000);
    assert_eq!(ctx.get_string(b"s").unwrap().unwrap().0, b"plain");
    assert!(store.keyspace(LEGACY_FIELDS_KEYSPACE).is_err());
    drop(ctx);
    drop(db);
    // A second open has nothing to do and reads the same.
    let db = Db::open(store).unwrap();
    let ctx = Ctx::new(&db, 1000);
    assert_eq!(hash::all(&ctx, b"big").unwrap().len(), 3000);
}
