//! Rust errors as Python exceptions: `sluice.Error` and one subclass per
//! kind a caller handles differently, each carrying the Rust message
//! unchanged.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use sluice_store::StoreError;

create_exception!(
    sluice,
    Error,
    PyException,
    "Any error Sluice raises; the message is the engine's own."
);
create_exception!(
    sluice,
    CorruptError,
    Error,
    "Stored data failed its checks (a checksum, a damaged log, a malformed page)."
);
create_exception!(
    sluice,
    NotFoundError,
    Error,
    "A device, store, keyspace or export that is not there."
);
create_exception!(
    sluice,
    QueryError,
    Error,
    "A query, predicate, projection or option that is wrong; nothing ran."
);
create_exception!(
    sluice,
    DeviceFullError,
    Error,
    "No room left on the device (or in the write-ahead log)."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("CorruptError", py.get_type::<CorruptError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("QueryError", py.get_type::<QueryError>())?;
    m.add("DeviceFullError", py.get_type::<DeviceFullError>())?;
    Ok(())
}

/// The exception for a store error.
pub fn store(e: StoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        StoreError::Corrupt { .. } | StoreError::WalDamaged { .. } => CorruptError::new_err(msg),
        StoreError::NoStore { .. }
        | StoreError::NotAStore { .. }
        | StoreError::UnknownKeyspace { .. } => NotFoundError::new_err(msg),
        StoreError::DeviceFull { .. } | StoreError::WalFull { .. } => DeviceFullError::new_err(msg),
        StoreError::BadInput(_) | StoreError::RecordTooLarge { .. } => QueryError::new_err(msg),
        _ => Error::new_err(msg),
    }
}

/// The exception for a pagination error.
pub fn pages(e: sluice_paginate::Error) -> PyErr {
    use sluice_paginate::Error as E;
    let msg = e.to_string();
    match e {
        E::CorruptPage { .. } | E::MalformedPage { .. } | E::Format(_) => {
            CorruptError::new_err(msg)
        }
        E::Config(_) => QueryError::new_err(msg),
        E::DeviceTooSmall { .. } => DeviceFullError::new_err(msg),
        _ => Error::new_err(msg),
    }
}

/// The exception for an Arrow result-set error.
pub fn arrow(e: sluice_arrow::Error) -> PyErr {
    use sluice_arrow::Error as E;
    let msg = e.to_string();
    match e {
        E::Store(s) => store(s),
        E::Export(p) => pages(p),
        E::Scan(sluice_ndp::scan::ScanError::Store(s)) => store(s),
        E::Scan(sluice_ndp::scan::ScanError::Malformed { .. }) | E::Malformed(_) => {
            CorruptError::new_err(msg)
        }
        E::Query(_) | E::Format(_) | E::Usage(_) | E::Mismatch { .. } => QueryError::new_err(msg),
        E::Scan(_) | E::Arrow(_) | E::Cancelled | E::Interrupted => Error::new_err(msg),
    }
}

/// The exception for an I/O error opening a device.
pub fn device(path: &std::path::Path, e: impl std::fmt::Display) -> PyErr {
    let msg = format!("opening {}: {e}", path.display());
    if !path.exists() {
        NotFoundError::new_err(msg)
    } else {
        Error::new_err(msg)
    }
}
