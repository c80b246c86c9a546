//! Result sets handed to pyarrow through the Arrow C stream interface:
//! pyarrow takes the Rust buffers as they are (released by Rust when
//! pyarrow drops them), so no value is copied on the way.

use crate::errors;
use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_pyarrow::{IntoPyArrow, Table};
use pyo3::prelude::*;
use sluice_arrow::stream::Waited;
use sluice_arrow::BatchStream;
use std::time::Duration;

/// How often a long wait looks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The stream as a `pyarrow.RecordBatchReader`, pulled batch by batch.
/// A long read (pyarrow's `read_all`, say) looks for Ctrl-C every 50 ms:
/// the stream stops and pyarrow raises `ArrowInvalid` naming the
/// interrupt. (The KeyboardInterrupt itself cannot be left pending: pyarrow
/// builds its own exception from the stream's error with Python calls,
/// which refuse to run with an exception set.)
pub fn reader(py: Python<'_>, mut stream: BatchStream) -> PyResult<Bound<'_, PyAny>> {
    stream.set_interrupt_check(Box::new(|| {
        Python::attach(|py| match py.check_signals() {
            Ok(()) => false,
            Err(_keyboard_interrupt) => true,
        })
    }));
    let boxed: Box<dyn RecordBatchReader + Send> = Box::new(stream);
    boxed.into_pyarrow(py)
}

/// Every batch of the stream as one `pyarrow.Table`. Waits without the
/// GIL; Ctrl-C stops the producer and raises KeyboardInterrupt.
pub fn table(py: Python<'_>, mut stream: BatchStream) -> PyResult<Bound<'_, PyAny>> {
    let schema = stream.schema();
    let mut batches: Vec<RecordBatch> = Vec::new();
    loop {
        let next = py.detach(|| stream.next_timeout(SIGNAL_POLL));
        match next {
            Ok(Some(b)) => batches.push(b),
            Ok(None) => break,
            Err(Waited::Timeout) => {
                if let Err(e) = py.check_signals() {
                    py.detach(|| stream.cancel());
                    return Err(e);
                }
            }
            Err(Waited::Failed(e)) => return Err(errors::arrow(e)),
        }
    }
    one_table(py, batches, schema)
}

/// Batches already built, as one `pyarrow.Table`.
pub fn one_table(
    py: Python<'_>,
    batches: Vec<RecordBatch>,
    schema: arrow_schema::SchemaRef,
) -> PyResult<Bound<'_, PyAny>> {
    let table =
        Table::try_new(batches, schema).map_err(|e| errors::Error::new_err(e.to_string()))?;
    table.into_pyarrow(py)
}
