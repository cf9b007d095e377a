//! Tokenized data, cached: `<cache>/<stem>-<key>.u16` (or `.u32` for vocabularies
//! over 65536 ids), little-endian ids like nanoGPT's `.bin`, with a `.json` beside
//! it saying what it holds. The key hashes the tokenizer file, the text and the
//! settings that change the ids, so an unchanged input is tokenized once and every
//! later run maps the file.

use std::{
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    time::Instant,
};

use memmap2::Mmap;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use super::tokenize::{self, TOKENIZERS_VERSION};
use crate::{
    config::{Config, DataKind},
    error::{Error, Result},
};

/// Bumped when the cached format or the tokenization scheme changes.
const SCHEME: &str = "ptrain-tokens-1";

/// A token file ready to be mapped.
#[derive(Debug, Clone)]
pub struct Tokenized {
    pub source: PathBuf,
    pub file: PathBuf,
    /// Bytes per id: 2 or 4.
    pub width: usize,
    pub tokens: u64,
    pub max_id: u32,
    pub reused: bool,
    /// Time spent encoding and writing (0 when reused).
    pub seconds: f64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    source: String,
    tokenizer: String,
    tokenizer_sha256: String,
    text_sha256: String,
    kind: String,
    text_field: String,
    eos_token: String,
    tokens: u64,
    dtype: String,
    max_id: u32,
    tokenizers_version: String,
}

/// The cache directory: `data.tokens_cache`, or `tokens-cache/` beside the run
/// directory (`runs/tokens-cache` for the default run directories).
pub fn cache_dir(config: &Config) -> PathBuf {
    if !config.data.tokens_cache.is_empty() {
        return PathBuf::from(&config.data.tokens_cache);
    }
    let parent = match config.run.run_dir.as_str() {
        "" => PathBuf::from("runs"),
        dir => Path::new(dir).parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    parent.join("tokens-cache")
}

/// Lower-case hexadecimal of a digest.
pub(crate) fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `file` whole: to a temporary name beside it, then renamed, so
/// a file under the final name is complete.
pub(crate) fn write_whole(file: &Path, bytes: &[u8]) -> Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = dir.join(format!(".{}.tmp-{}", file.file_name().and_then(|n| n.to_str()).unwrap_or("cache"), std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, file).map_err(io_err(file))
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_owned(), source }
}

fn map(path: &Path) -> Result<Mmap> {
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile { what: "data file", path: path.to_owned() },
        _ => Error::Io { path: path.to_owned(), source: e },
    })?;
    // SAFETY: read-only mapping of a data file; a concurrent writer is the user's problem.
    unsafe { Mmap::map(&file) }.map_err(io_err(path))
}

/// The configured tokenizer, loaded once for every file of a run.
pub struct Tokenizing {
    pub tokenizer: Tokenizer,
    tokenizer_path: PathBuf,
    tokenizer_sha256: String,
    pub width: usize,
    kind: DataKind,
    text_field: String,
    eos_token: String,
    eos: Option<u32>,
    dir: PathBuf,
}

impl Tokenizing {
    pub fn new(config: &Config) -> Result<Tokenizing> {
        let path = PathBuf::from(&config.data.tokenizer);
        let tokenizer = tokenize::load_tokenizer(&path)?;
        let bytes = std::fs::read(&path).map_err(io_err(&path))?;
        let eos_token = config.data.eos_token.clone();
        let eos = match eos_token.as_str() {
            "" => None,
            token => Some(tokenizer.token_to_id(token).ok_or_else(|| Error::Data {
                path: path.clone(),
                message: format!("data.eos_token = \"{token}\" is not in this tokenizer's vocabulary"),
            })?),
        };
        Ok(Tokenizing {
            width: if tokenize::vocab_size(&tokenizer) <= 1 << 16 { 2 } else { 4 },
            tokenizer,
            tokenizer_path: path,
            tokenizer_sha256: hex(&Sha256::digest(&bytes)),
            kind: config.data.kind,
            text_field: config.data.text_field.clone(),
            eos_token,
            eos,
            dir: cache_dir(config),
        })
    }

    fn kind_name(&self) -> &'static str {
        if self.kind == DataKind::Jsonl {
            "jsonl"
        } else {
            "text"
        }
    }

    /// The cached token file of `source`, tokenizing it first if needed.
    pub fn prepare(&self, source: &Path) -> Result<Tokenized> {
        let text = map(source)?;
        let text_sha256 = hex(&Sha256::digest(&text[..]));
        let mut key = Sha256::new();
        let field = if self.kind == DataKind::Jsonl { self.text_field.as_str() } else { "" };
        for part in [SCHEME, TOKENIZERS_VERSION, self.kind_name(), field, &self.eos_token, &self.tokenizer_sha256, &text_sha256] {
            key.update(part.as_bytes());
            key.update([0]);
        }
        let stem: String = source
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("data")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
            .collect();
        let file = self.dir.join(format!("{stem}-{}.u{}", &hex(&key.finalize())[..16], self.width * 8));
        let meta_path = file.with_extension(format!("u{}.json", self.width * 8));
        if let Some(meta) = read_meta(&file, &meta_path, self.width) {
            tracing::info!("tokens: reusing {} for {} ({} tokens; tokenizer and text unchanged)", file.display(), source.display(), meta.tokens);
            return Ok(Tokenized {
                source: source.to_owned(),
                file,
                width: self.width,
                tokens: meta.tokens,
                max_id: meta.max_id,
                reused: true,
                seconds: 0.0,
            });
        }
        let text = super::reader::whole_utf8(&text).map_err(|message| Error::Data { path: source.to_owned(), message })?;
        std::fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        tracing::info!("tokens: tokenizing {} with {} into {}", source.display(), self.tokenizer_path.display(), file.display());
        let started = Instant::now();
        let tmp = self.dir.join(format!(".{}.tmp-{}", file.file_name().and_then(|n| n.to_str()).unwrap_or("tokens"), std::process::id()));
        let (tokens, max_id) = self.write(text, source, &tmp).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        let seconds = started.elapsed().as_secs_f64();
        let meta = Meta {
            source: source.display().to_string(),
            tokenizer: self.tokenizer_path.display().to_string(),
            tokenizer_sha256: self.tokenizer_sha256.clone(),
            text_sha256,
            kind: self.kind_name().into(),
            text_field: field.into(),
            eos_token: self.eos_token.clone(),
            tokens,
            dtype: format!("uint{}", self.width * 8),
            max_id,
            tokenizers_version: TOKENIZERS_VERSION.into(),
        };
        let meta_tmp = PathBuf::from(format!("{}.json", tmp.display()));
        std::fs::write(&meta_tmp, serde_json::to_string_pretty(&meta).expect("meta serializes")).map_err(io_err(&meta_tmp))?;
        std::fs::rename(&meta_tmp, &meta_path).map_err(io_err(&meta_path))?;
        // The token file last: its presence (with a matching size) means complete.
        std::fs::rename(&tmp, &file).map_err(io_err(&file))?;
        tracing::info!("tokens: {} tokens from {} in {seconds:.2}s ({:.0} tokens/s)", tokens, source.display(), tokens as f64 / seconds.max(1e-9));
        Ok(Tokenized { source: source.to_owned(), file, width: self.width, tokens, max_id, reused: false, seconds })
    }

    /// Tokenizes `text` into `path`; returns the token count and the largest id.
    fn write(&self, text: &str, source: &Path, path: &Path) -> Result<(u64, u32)> {
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).map_err(io_err(path))?);
        let (mut tokens, mut max_id) = (0u64, 0u32);
        let width = self.width;
        let mut buf = Vec::new();
        let mut sink = |ids: &[u32]| -> Result<()> {
            buf.clear();
            for &id in ids {
                max_id = max_id.max(id);
                if width == 2 {
                    buf.extend_from_slice(&(id as u16).to_le_bytes());
                } else {
                    buf.extend_from_slice(&id.to_le_bytes());
                }
            }
            tokens += ids.len() as u64;
            out.write_all(&buf).map_err(io_err(path))
        };
        match self.kind {
            DataKind::Jsonl => tokenize::encode_jsonl(&self.tokenizer, text, &self.text_field, self.eos, source, &mut sink)?,
            _ => tokenize::encode_text(&self.tokenizer, text, source, &mut sink)?,
        }
        let file = out.into_inner().map_err(|e| Error::Io { path: path.to_owned(), source: e.into_error() })?;
        file.sync_all().map_err(io_err(path))?;
        Ok((tokens, max_id))
    }

    /// The token an id stands for, for messages.
    pub fn token(&self, id: u32) -> String {
        self.tokenizer.id_to_token(id).unwrap_or_else(|| "?".into())
    }

    pub fn tokenizer_path(&self) -> &Path {
        &self.tokenizer_path
    }
}

/// Language-model windows over `data.path` (and `data.val_path`) tokenized with
/// `data.tokenizer`, through the cache.
pub fn windows(config: &Config, seq_len: i64) -> Result<super::TokenWindows> {
    let tokenizing = Tokenizing::new(config)?;
    let train = tokenizing.prepare(Path::new(&config.data.path))?;
    let val = match config.data.val_path.as_str() {
        "" => None,
        p => Some(tokenizing.prepare(Path::new(p))?),
    };
    let vocab = config.model.vocab_size;
    for t in [Some(&train), val.as_ref()].into_iter().flatten() {
        if t.max_id as i64 >= vocab {
            let origin = if config.model.init_from.is_empty() { String::new() } else { format!(", from {}", config.model.init_from) };
            return Err(Error::Data {
                path: t.source.clone(),
                message: format!(
                    "token id {} (`{}`) of tokenizer {} is beyond the model's vocabulary (model.vocab_size = {vocab}{origin}): the tokenizer does not match the model",
                    t.max_id,
                    tokenizing.token(t.max_id),
                    tokenizing.tokenizer_path().display()
                ),
            });
        }
    }
    super::TokenWindows::token_files(config, seq_len, &train.file, val.as_ref().map(|v| v.file.as_path()), tokenizing.width)
}

/// A complete cached file's metadata.
fn read_meta(file: &Path, meta_path: &Path, width: usize) -> Option<Meta> {
    let meta: Meta = serde_json::from_slice(&std::fs::read(meta_path).ok()?).ok()?;
    let len = std::fs::metadata(file).ok()?.len();
    (len == meta.tokens * width as u64).then_some(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_sits_beside_the_run_directory() {
        let mut config = Config::default();
        assert_eq!(cache_dir(&config), PathBuf::from("runs/tokens-cache"));
        config.run.run_dir = "/tmp/exp/run1".into();
        assert_eq!(cache_dir(&config), PathBuf::from("/tmp/exp/tokens-cache"));
        config.run.run_dir = "run1".into();
        assert_eq!(cache_dir(&config), PathBuf::from("tokens-cache"));
        config.data.tokens_cache = "/data/cache".into();
        assert_eq!(cache_dir(&config), PathBuf::from("/data/cache"));
    }
}
