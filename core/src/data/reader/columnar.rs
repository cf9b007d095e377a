//! Parquet files and Arrow IPC files (`datasets.save_to_disk`'s stream files, or the
//! file form), read a record batch at a time with the Apache Arrow crates and
//! turned into rows column by column. Columns the caller skips are not read
//! (Parquet projects them away).

use std::{fs::File, io::BufReader, path::Path, sync::Arc};

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, SchemaRef};
use minijinja::Value;
use parquet::arrow::{arrow_reader::ParquetRecordBatchReaderBuilder, ProjectionMask};

use super::{arrow_values, At, Batches, Place, Record};
use crate::error::{Error, Result};

/// Rows read from Arrow record batches.
pub struct Columnar {
    file: Arc<Path>,
    batches: Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send>,
    /// Rows of the current batch not yet handed out.
    pending: std::collections::VecDeque<Record>,
    /// The index of the next row read from the file.
    row: u64,
}

fn bad(file: &Path, message: impl Into<String>) -> Error {
    Error::Data { path: file.to_owned(), message: message.into() }
}

/// The columns to read: all but `skip`; an unreadable column is an error naming it.
fn projection(file: &Path, schema: &SchemaRef, skip: &[String]) -> Result<Vec<usize>> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let mut keep = Vec::new();
    for (i, field) in schema.fields().iter().enumerate() {
        if skip.iter().any(|s| s == field.name()) {
            continue;
        }
        if !arrow_values::readable(field.data_type()) {
            return Err(bad(
                file,
                format!(
                    "column `{}` has the Arrow type {}, which ptrain does not read (columns: {}); \
                     if the rows do not need it, leave it out with data.ignore_columns = [\"{}\"]",
                    field.name(),
                    field.data_type(),
                    names.join(", "),
                    field.name()
                ),
            ));
        }
        keep.push(i);
    }
    Ok(keep)
}

impl Columnar {
    pub fn parquet(file: Arc<Path>, skip: &[String]) -> Result<Columnar> {
        let handle = File::open(&file).map_err(|e| Error::Io { path: file.to_path_buf(), source: e })?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(handle).map_err(|e| bad(&file, format!("not a Parquet file ptrain can read: {e}")))?;
        let keep = projection(&file, builder.schema(), skip)?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), keep);
        let reader = builder.with_projection(mask).with_batch_size(1024).build().map_err(|e| bad(&file, e.to_string()))?;
        Ok(Columnar { file, batches: Box::new(reader), pending: Default::default(), row: 0 })
    }

    pub fn arrow(file: Arc<Path>, skip: &[String]) -> Result<Columnar> {
        let open = || File::open(&file).map_err(|e| Error::Io { path: file.to_path_buf(), source: e });
        let not_arrow = |e: ArrowError| bad(&file, format!("not an Arrow IPC file ptrain can read: {e}"));
        let mut magic = [0u8; 6];
        let is_file_form = std::io::Read::read(&mut open()?, &mut magic).is_ok_and(|n| n == 6 && &magic == b"ARROW1");
        let batches: Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send> = if is_file_form {
            let reader = arrow_ipc::reader::FileReader::try_new(open()?, None).map_err(not_arrow)?;
            let keep = projection(&file, &reader.schema(), skip)?;
            Box::new(arrow_ipc::reader::FileReader::try_new(open()?, Some(keep)).map_err(not_arrow)?)
        } else {
            let reader = arrow_ipc::reader::StreamReader::try_new(BufReader::new(open()?), None).map_err(not_arrow)?;
            let keep = projection(&file, &reader.schema(), skip)?;
            drop(reader);
            Box::new(arrow_ipc::reader::StreamReader::try_new(BufReader::with_capacity(1 << 20, open()?), Some(keep)).map_err(not_arrow)?)
        };
        Ok(Columnar { file, batches, pending: Default::default(), row: 0 })
    }

    /// A record batch as rows, a column at a time.
    fn rows(&mut self, batch: &RecordBatch) -> Result<()> {
        let schema = batch.schema();
        let names: Vec<Arc<str>> = schema.fields().iter().map(|f| Arc::from(f.name().as_str())).collect();
        let mut columns: Vec<std::vec::IntoIter<Value>> = Vec::with_capacity(names.len());
        for ((name, column), field) in names.iter().zip(batch.columns()).zip(schema.fields()) {
            let values = arrow_values::values(column.as_ref(), field).map_err(|m| bad(&self.file, format!("column `{name}`: {m}")))?;
            columns.push(values.into_iter());
        }
        for _ in 0..batch.num_rows() {
            let row = names.iter().cloned().zip(columns.iter_mut().map(|c| c.next().expect("a value per row"))).collect();
            self.pending.push_back(Record { place: Place { file: self.file.clone(), at: At::Row(self.row) }, columns: row });
            self.row += 1;
        }
        Ok(())
    }
}

impl Batches for Columnar {
    fn next_batch(&mut self, max: usize) -> Result<Vec<Record>> {
        while self.pending.len() < max {
            match self.batches.next() {
                None => break,
                Some(Err(e)) => return Err(bad(&self.file, format!("after row {}: {e}", self.row))),
                Some(Ok(batch)) => self.rows(&batch)?,
            }
        }
        let n = max.min(self.pending.len());
        Ok(self.pending.drain(..n).collect())
    }
}
