//! The CSV file itself: a `step` column, then one column per metric name in sorted
//! order, one row per emitted step, empty cells where a metric was not emitted. A
//! name not seen before widens the header: the file is rewritten through a temporary
//! file and a rename, so a reader sees the old file or the new one, never half of one.

use std::{
    collections::HashMap,
    fs::{File, OpenOptions},
    io::{self, BufRead, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
};

pub struct Table {
    path: PathBuf,
    /// Metric names, sorted; the `step` column comes before them.
    columns: Vec<String>,
    index: HashMap<String, usize>,
    out: Option<BufWriter<File>>,
    row: Vec<Option<f64>>,
    pub rows: u64,
    pub rewrites: u64,
}

/// A header field, quoted when it must be (RFC 4180).
fn quote(field: &str) -> String {
    if field.contains([',', '"']) || field.starts_with(' ') || field.ends_with(' ') {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

/// The fields of one CSV line (quotes as [`quote`] writes them).
fn split(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted, mut chars) = (Vec::new(), String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if field.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// As Python's `str(float)` writes specials, which `pandas.read_csv` reads back.
fn cell(value: f64) -> String {
    if value.is_nan() {
        "nan".into()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        // Shortest round-trip form; exponents for very large or small values (1e-7).
        format!("{value:?}")
    }
}

/// A metric name as one header field: line breaks would end the row.
pub fn column_name(name: &str) -> String {
    name.replace(['\n', '\r'], " ")
}

impl Table {
    /// Opens `path` for a run that starts after `start_step`: a fresh run (0) starts a new
    /// file; a resumed one continues the file, without the rows after `start_step` (the
    /// resumed run emits them again).
    pub fn open(path: &Path, start_step: u64) -> io::Result<Table> {
        let mut table =
            Table { path: path.to_path_buf(), columns: Vec::new(), index: HashMap::new(), out: None, row: Vec::new(), rows: 0, rewrites: 0 };
        let existing = match File::open(path) {
            Ok(f) if start_step > 0 => Some(BufReader::new(f)),
            Ok(_) => {
                std::fs::remove_file(path)?;
                None
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let Some(mut reader) = existing else { return Ok(table) };
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let fields = split(header.trim_end_matches(['\n', '\r']));
        if header.trim().is_empty() {
            return Ok(table);
        }
        if fields.first().map(String::as_str) != Some("step") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} does not start with a `step` column: not a ptrain metrics file", path.display()),
            ));
        }
        table.set_columns(fields[1..].to_vec());
        let mut later = false;
        for line in reader.lines() {
            let line = line?;
            match line.split(',').next().and_then(|s| s.parse::<u64>().ok()) {
                Some(step) if step > start_step => later = true,
                Some(_) => table.rows += 1,
                None => {}
            }
        }
        if later {
            let columns = table.columns.clone();
            table.rewrite(columns, start_step)?;
        }
        Ok(table)
    }

    fn set_columns(&mut self, columns: Vec<String>) {
        self.index = columns.iter().enumerate().map(|(i, c)| (c.clone(), i)).collect();
        self.columns = columns;
        self.row = vec![None; self.columns.len()];
    }

    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Appends the row of `step`; names not seen before widen the file first.
    pub fn append(&mut self, step: u64, values: &[(String, f64)]) -> io::Result<()> {
        let new: Vec<&String> = values.iter().map(|(n, _)| n).filter(|n| !self.index.contains_key(*n)).collect();
        if !new.is_empty() || self.columns.is_empty() && !self.path.exists() {
            let mut columns = self.columns.clone();
            columns.extend(new.into_iter().cloned());
            columns.sort();
            columns.dedup();
            self.rewrite(columns, u64::MAX)?;
        }
        self.row.iter_mut().for_each(|c| *c = None);
        for (name, value) in values {
            self.row[self.index[name]] = Some(*value);
        }
        let mut line = step.to_string();
        for value in &self.row {
            line.push(',');
            if let Some(v) = value {
                line.push_str(&cell(*v));
            }
        }
        line.push('\n');
        let out = match &mut self.out {
            Some(out) => out,
            None => self.out.insert(BufWriter::new(OpenOptions::new().append(true).open(&self.path)?)),
        };
        out.write_all(line.as_bytes())?;
        out.flush()?;
        self.rows += 1;
        Ok(())
    }

    /// Writes the file again with `columns` (a superset of the current ones, sorted),
    /// keeping the rows up to `last_step`, and swaps it in with a rename.
    fn rewrite(&mut self, columns: Vec<String>, last_step: u64) -> io::Result<()> {
        self.out = None;
        let tmp = self.path.with_extension("csv.tmp");
        let mut w = BufWriter::new(File::create(&tmp)?);
        let header: Vec<String> = std::iter::once("step".to_string()).chain(columns.iter().map(|c| quote(c))).collect();
        writeln!(w, "{}", header.join(","))?;
        let new_index: HashMap<&str, usize> = columns.iter().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
        let moved: Vec<usize> = self.columns.iter().map(|c| new_index[c.as_str()]).collect();
        let mut rows = 0;
        if let Ok(old) = File::open(&self.path) {
            for line in BufReader::new(old).lines().skip(1) {
                let line = line?;
                let mut fields = line.split(',');
                let step = fields.next().unwrap_or("");
                if step.parse::<u64>().map_or(true, |s| s > last_step) {
                    continue;
                }
                let mut cells = vec![""; columns.len()];
                for (value, &to) in fields.zip(&moved) {
                    cells[to] = value;
                }
                writeln!(w, "{step},{}", cells.join(","))?;
                rows += 1;
            }
        }
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        self.rows = rows;
        self.rewrites += 1;
        self.set_columns(columns);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn a_new_name_widens_the_header_and_keeps_earlier_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let mut t = Table::open(&path, 0).unwrap();
        t.append(10, &v(&[("train/loss", 2.5), ("train/lr", 0.001)])).unwrap();
        t.append(20, &v(&[("train/loss", f64::NAN), ("train/lr", 1e-7)])).unwrap();
        t.append(100, &v(&[("train/loss", 1.0), ("eval/loss", f64::INFINITY), ("a,\"b\"", -0.5)])).unwrap();
        t.append(110, &v(&[("train/loss", 0.5)])).unwrap();
        assert_eq!(read(&path), "step,\"a,\"\"b\"\"\",eval/loss,train/loss,train/lr\n10,,,2.5,0.001\n20,,,nan,1e-7\n100,-0.5,inf,1.0,\n110,,,0.5,\n");
        assert_eq!((t.rows, t.rewrites), (4, 2));
        assert!(!path.with_extension("csv.tmp").exists());
        assert_eq!(split("step,\"a,\"\"b\"\"\",eval/loss"), vec!["step", "a,\"b\"", "eval/loss"]);
    }

    #[test]
    fn a_resumed_run_continues_the_file_without_the_steps_it_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let mut t = Table::open(&path, 0).unwrap();
        for step in [10, 20, 30] {
            t.append(step, &v(&[("train/loss", step as f64)])).unwrap();
        }
        drop(t);
        let mut t = Table::open(&path, 20).unwrap();
        assert_eq!((t.rows, t.columns().to_vec()), (2, vec!["train/loss".to_string()]));
        t.append(30, &v(&[("train/loss", 3.0)])).unwrap();
        assert_eq!(read(&path), "step,train/loss\n10,10.0\n20,20.0\n30,3.0\n");
        drop(t);
        // A fresh run starts a new file.
        let mut t = Table::open(&path, 0).unwrap();
        t.append(10, &v(&[("x", 1.0)])).unwrap();
        assert_eq!(read(&path), "step,x\n10,1.0\n");
    }

    #[test]
    fn a_file_that_is_not_ours_is_refused_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "epoch,loss\n1,2\n").unwrap();
        assert!(Table::open(&path, 5).err().unwrap().to_string().contains("step"));
    }
}
