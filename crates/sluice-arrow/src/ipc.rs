//! Result sets as an Arrow IPC stream, the format pyarrow, pandas, DuckDB
//! and Polars read (`pyarrow.ipc.open_stream`).

use crate::Error;
use arrow_array::RecordBatchReader;
use arrow_ipc::writer::StreamWriter;
use std::io::Write;

/// Writes every batch of `reader` to `out` as one IPC stream; returns the
/// rows written.
pub fn write_stream<R: RecordBatchReader, W: Write>(reader: R, out: W) -> Result<u64, Error> {
    let mut writer = StreamWriter::try_new(out, &reader.schema())?;
    let mut rows = 0u64;
    for batch in reader {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        writer.write(&batch)?;
    }
    writer.finish()?;
    Ok(rows)
}
