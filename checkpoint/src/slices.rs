//! A safetensors file read a slice at a time: its header is parsed, and each read
//! takes only the bytes of the elements asked for (a positioned read), so a rank
//! of a parameter-sharded run takes its elements of whole weights and whole
//! optimizer state without holding either whole.

use std::{
    collections::BTreeMap,
    fs::File,
    ops::Range,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

use ptrain_plugin_api::DType;
use safetensors::tensor::TensorInfo;

use crate::{Error, Result, Tensor};

/// What the header says of one tensor: its dtype, shape and where its bytes lie in
/// the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub dtype: DType,
    pub shape: Vec<i64>,
    bytes: Range<u64>,
}

impl TensorEntry {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product::<i64>() as u64
    }
}

/// An open safetensors file whose tensors are read by element ranges.
pub struct TensorFile {
    path: PathBuf,
    file: File,
    entries: BTreeMap<String, TensorEntry>,
}

/// Headers larger than this are refused (safetensors' own limit).
const MAX_HEADER: u64 = 100_000_000;

impl TensorFile {
    /// Opens `path` and reads its header (not its tensors).
    pub fn open(path: &Path) -> Result<TensorFile> {
        let file = File::open(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        let mut size = [0u8; 8];
        file.read_exact_at(&mut size, 0).map_err(Error::io(path))?;
        let header_len = u64::from_le_bytes(size);
        if header_len > MAX_HEADER || 8 + header_len > len {
            return Err(Error::invalid(path, format!("not a safetensors file: a header of {header_len} bytes in a file of {len}")));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact_at(&mut header, 8).map_err(Error::io(path))?;
        let mut infos: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(&header).map_err(|e| Error::invalid(path, format!("not a safetensors header: {e}")))?;
        infos.remove("__metadata__");
        let data_start = 8 + header_len;
        let mut entries = BTreeMap::new();
        for (name, value) in infos {
            let info: TensorInfo = serde_json::from_value(value).map_err(|e| Error::invalid(path, format!("`{name}` in the header: {e}")))?;
            let dtype = crate::dtype::from_safetensors(info.dtype)
                .ok_or_else(|| Error::invalid(path, format!("unsupported dtype {} of {name}", info.dtype)))?;
            let shape: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
            let (begin, end) = (data_start + info.data_offsets.0 as u64, data_start + info.data_offsets.1 as u64);
            let expected = shape.iter().product::<i64>() as u64 * dtype.size() as u64;
            if end > len || end < begin || end - begin != expected {
                return Err(Error::invalid(path, format!("`{name}` lies at bytes {begin}..{end} of {len}, {expected} bytes expected")));
            }
            entries.insert(name, TensorEntry { dtype, shape, bytes: begin..end });
        }
        Ok(TensorFile { path: path.to_owned(), file, entries })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.entries.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Elements `range` of the flattened tensor `name`, as a 1-D tensor of its dtype.
    pub fn read(&self, name: &str, range: Range<u64>) -> Result<Tensor> {
        let entry = self.entry(name).ok_or_else(|| Error::invalid(&self.path, format!("no tensor `{name}`")))?;
        if range.end > entry.numel() || range.start > range.end {
            return Err(Error::invalid(&self.path, format!("elements {range:?} of `{name}`, which has {}", entry.numel())));
        }
        let size = entry.dtype.size() as u64;
        let mut data = vec![0u8; ((range.end - range.start) * size) as usize];
        self.file.read_exact_at(&mut data, entry.bytes.start + range.start * size).map_err(Error::io(&self.path))?;
        Ok(Tensor { dtype: entry.dtype, shape: vec![(range.end - range.start) as i64], data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_is_read_from_the_file_as_the_whole_tensor_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let small = 7i64.to_le_bytes().to_vec();
        let views = [
            ("w", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3, 4], &bytes).unwrap()),
            ("step", safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![], &small).unwrap()),
        ];
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        let file = TensorFile::open(&path).unwrap();
        assert_eq!(file.names().collect::<Vec<_>>(), ["step", "w"]);
        assert_eq!(file.entry("w").map(|e| (e.dtype, e.shape.clone())), Some((DType::F32, vec![3, 4])));
        assert_eq!(file.read("w", 5..9).unwrap().data, bytes[20..36]);
        assert_eq!(file.read("step", 0..1).unwrap().data, small);
        assert!(file.read("w", 10..13).is_err(), "past the end");
        assert!(file.read("x", 0..1).is_err());
    }
}
