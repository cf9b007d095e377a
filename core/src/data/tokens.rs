//! Language-model data: random windows over a token stream (bytes of a text file,
//! a nanoGPT uint16 `.bin`, ptrain's cached tokenized text (uint16 or uint32), or
//! generated text). Files are read with positioned reads, not mapped: a file that
//! shrinks under a running job is an error naming it, not a SIGBUS.

use std::{
    fs::File,
    path::{Path, PathBuf},
};

use memmap2::Mmap;
use tch::Tensor;

use super::{spread, Batch, BatchKey, Dataset, Split};
use crate::{
    config::Config,
    error::{Error, Result},
    rng::Rng,
};

enum Store {
    Bytes(Vec<u8>),
    /// A token file of `width` bytes per little-endian id, read with positioned
    /// reads: a file that shrinks or becomes unreadable mid-run is an error naming
    /// it, where a memory mapping would end the process with SIGBUS.
    File {
        file: File,
        path: PathBuf,
        width: usize,
        tokens: usize,
        max: u32,
    },
}

impl Store {
    /// Opens a token file, scanning it once (mapped, a few GB/s) for its largest id.
    fn file(path: &Path, what: &'static str, width: usize) -> Result<Store> {
        let mapped = map(path, what)?;
        let max = match width {
            1 => mapped.iter().copied().max().unwrap_or(0) as u32,
            2 => mapped.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).max().unwrap_or(0) as u32,
            _ => mapped.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).max().unwrap_or(0),
        };
        let tokens = mapped.len() / width;
        drop(mapped);
        let file = File::open(path).map_err(|e| Error::Io { path: path.to_owned(), source: e })?;
        Ok(Store::File { file, path: path.to_owned(), width, tokens, max })
    }

    fn len(&self) -> usize {
        match self {
            Store::Bytes(b) => b.len(),
            Store::File { tokens, .. } => *tokens,
        }
    }

    /// The largest token id.
    fn max_token(&self) -> u32 {
        match self {
            Store::Bytes(b) => b.iter().copied().max().unwrap_or(0) as u32,
            Store::File { max, .. } => *max,
        }
    }

    /// Tokens `[start, start + out.len())`; `buf` is scratch space for the bytes.
    fn copy_window(&self, start: usize, out: &mut [i64], buf: &mut Vec<u8>) -> Result<()> {
        match self {
            Store::Bytes(b) => out.iter_mut().zip(&b[start..]).for_each(|(o, &x)| *o = x as i64),
            Store::File { file, path, width, .. } => {
                use std::os::unix::fs::FileExt;
                buf.resize(out.len() * width, 0);
                file.read_exact_at(buf, (start * width) as u64).map_err(|e| Error::Io { path: path.clone(), source: e })?;
                match width {
                    1 => out.iter_mut().zip(buf.iter()).for_each(|(o, &x)| *o = x as i64),
                    2 => out.iter_mut().zip(buf.chunks_exact(2)).for_each(|(o, c)| *o = u16::from_le_bytes([c[0], c[1]]) as i64),
                    _ => out.iter_mut().zip(buf.chunks_exact(4)).for_each(|(o, c)| *o = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64),
                }
            }
        }
        Ok(())
    }
}

/// A token range of a store.
struct Span {
    start: usize,
    end: usize,
}

pub struct TokenWindows {
    seed: u64,
    seq_len: usize,
    train: (Store, Span),
    val: (Store, Span),
}

fn map(path: &Path, what: &'static str) -> Result<Mmap> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile { what, path: path.to_owned() },
        _ => Error::Io { path: path.to_owned(), source: e },
    })?;
    // SAFETY: read-only mapping of a data file; a concurrent writer is the user's problem.
    unsafe { Mmap::map(&file) }.map_err(|e| Error::Io { path: path.to_owned(), source: e })
}

impl TokenWindows {
    pub fn synthetic(config: &Config, seq_len: i64) -> TokenWindows {
        let text = synthetic_text(config.run.seed, config.data.synthetic_len.max(4 * seq_len as usize + 8));
        let store = || Store::Bytes(text.clone());
        Self::split(config, seq_len, store(), Some(store()), true)
    }

    pub fn bytes_file(config: &Config, seq_len: i64) -> Result<TokenWindows> {
        let open = |p: &str, what| Store::file(Path::new(p), what, 1);
        Self::from_files(config, seq_len, [&config.data.path, &config.data.val_path], open)
    }

    /// Token files of `width` bytes per id (ptrain's tokenized cache): `train`, and
    /// `val` or the end of `train` for validation.
    pub fn token_files(config: &Config, seq_len: i64, train: &Path, val: Option<&Path>, width: usize) -> Result<TokenWindows> {
        let open = |p: &str, what| Store::file(Path::new(p), what, if width == 4 { 4 } else { 2 });
        let name = |p: &Path| p.display().to_string();
        Self::from_files(config, seq_len, [&name(train), &val.map(name).unwrap_or_default()], open)
    }

    pub fn u16_file(config: &Config, seq_len: i64) -> Result<TokenWindows> {
        let open = |p: &str, what| {
            let store = Store::file(Path::new(p), what, 2)?;
            if !std::fs::metadata(p).map_or(0, |m| m.len()).is_multiple_of(2) {
                return Err(Error::Data { path: p.into(), message: "odd byte length: not a uint16 token file".into() });
            }
            Ok(store)
        };
        Self::from_files(config, seq_len, [&config.data.path, &config.data.val_path], open)
    }

    /// `paths`: the training file and the validation file ("" = the end of the training one).
    fn from_files(config: &Config, seq_len: i64, paths: [&str; 2], open: impl Fn(&str, &'static str) -> Result<Store>) -> Result<TokenWindows> {
        let [train_path, val_path] = paths;
        let train = open(train_path, "data file")?;
        let (val, same) = match val_path {
            "" => (open(train_path, "data file")?, true),
            p => (open(p, "validation file")?, false),
        };
        for (store, path) in [(&train, train_path), (&val, if same { train_path } else { val_path })] {
            let max = store.max_token() as i64;
            if max >= config.model.vocab_size {
                return Err(Error::Data {
                    path: path.into(),
                    message: format!(
                        "token id {max} does not fit model.vocab_size = {} (set model.vocab_size, e.g. 50304 for GPT-2 tokens)",
                        config.model.vocab_size
                    ),
                });
            }
        }
        let windows = Self::split(config, seq_len, train, Some(val), same);
        for (split, (store, span)) in [("training", &windows.train), ("validation", &windows.val)] {
            if split == "validation" && same && span.end == span.start {
                continue; // data.val_fraction = 0
            }
            // One window of seq_len + 1 tokens is enough: training draws its one start, evaluation reads it.
            if span.end.saturating_sub(span.start) < windows.seq_len + 1 || store.len() < span.end {
                let path = if split == "validation" && !same { val_path } else { train_path };
                return Err(Error::Data {
                    path: path.into(),
                    message: format!("the {split} split has {} tokens, fewer than a window of {}", span.end - span.start, windows.seq_len + 1),
                });
            }
        }
        Ok(windows)
    }

    /// With `same`, the last `val_fraction` of the store is held out for validation.
    fn split(config: &Config, seq_len: i64, train: Store, val: Option<Store>, same: bool) -> TokenWindows {
        let n = train.len();
        let val_store = val.unwrap_or(Store::Bytes(Vec::new()));
        let (train_span, val_span) = if same {
            // data.val_fraction = 0: nothing held out (no evaluation).
            let held = match config.data.val_fraction {
                f if f > 0.0 => ((n as f64 * f) as usize).max(seq_len as usize + 2).min(n / 2),
                _ => 0,
            };
            let cut = n - held;
            (Span { start: 0, end: cut }, Span { start: cut, end: n })
        } else {
            let m = val_store.len();
            (Span { start: 0, end: n }, Span { start: 0, end: m })
        };
        TokenWindows { seed: config.run.seed, seq_len: seq_len as usize, train: (train, train_span), val: (val_store, val_span) }
    }
}

impl Dataset for TokenWindows {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        let (store, span) = match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        };
        let (b, t) = (key.count as usize, self.seq_len);
        let mut buf = vec![0i64; b * (t + 1)];
        let mut bytes = Vec::new();
        let starts = (span.end - span.start).saturating_sub(t + 1) as u64;
        let held_out = self.held_out_windows();
        if split == Split::Val && held_out == 0 {
            return Err(Error::Other("nothing is held out (data.val_fraction = 0): no held-out batch".into()));
        }
        for (i, window) in buf.chunks_exact_mut(t + 1).enumerate() {
            let start = match split {
                Split::Train => {
                    let sample = key.first_sample + i as u64;
                    Rng::keyed(self.seed, &[split as u64, key.step, key.micro, sample]).below(starts + 1) as usize
                }
                // The held-out windows tile the span, each read once per pass.
                Split::Val => spread(key.stream + i as u64, held_out) as usize * t,
            };
            store.copy_window(span.start + start, window, &mut bytes)?;
        }
        let all = Tensor::f_from_slice(&buf)?.f_view([b as i64, t as i64 + 1])?;
        Ok(Batch {
            inputs: all.f_narrow(1, 0, t as i64)?.f_contiguous()?,
            targets: all.f_narrow(1, 1, t as i64)?.f_contiguous()?,
            dataset_ids: None,
            segments: None,
            payload: super::Payload::None,
            samples: b as i64,
            tokens: (b * t) as i64,
        })
    }

    fn dataset_names(&self) -> Vec<String> {
        Vec::new()
    }

    fn train_len(&self) -> u64 {
        ((self.train.1.end - self.train.1.start) / self.seq_len.max(1)) as u64
    }

    fn val_len(&self) -> Option<u64> {
        Some(self.held_out_windows())
    }

    fn seq_len(&self) -> i64 {
        self.seq_len as i64
    }
}

impl TokenWindows {
    /// Windows of `seq_len + 1` tokens tiling the held-out span, each sharing its
    /// last token with the next one's first (0 when nothing is held out).
    fn held_out_windows(&self) -> u64 {
        let span = &self.val.1;
        ((span.end - span.start).saturating_sub(1) / self.seq_len.max(1)) as u64
    }
}

/// Deterministic English-like text from a small word grammar: structure a small
/// byte-level model learns within a hundred steps, with no download.
pub fn synthetic_text(seed: u64, len: usize) -> Vec<u8> {
    const SUBJECTS: &[&str] = &["the cat", "a dog", "the model", "my friend", "the river", "a small bird", "the teacher", "our team"];
    const VERBS: &[&str] = &["sees", "likes", "follows", "builds", "finds", "watches", "helps", "carries"];
    const OBJECTS: &[&str] = &["the ball", "a red box", "the old tree", "some bread", "the long road", "a quiet song", "the garden", "its shadow"];
    const ENDINGS: &[&str] = &[".", " today.", " again.", " at night.", " in the morning.", " with care."];
    let mut rng = Rng::keyed(seed, &[0x7E47]);
    let mut out = Vec::with_capacity(len + 64);
    let pick = |words: &[&str], rng: &mut Rng| words[rng.below(words.len() as u64) as usize].to_string();
    while out.len() < len {
        let mut sentence = pick(SUBJECTS, &mut rng);
        sentence.push(' ');
        sentence.push_str(&pick(VERBS, &mut rng));
        sentence.push(' ');
        sentence.push_str(&pick(OBJECTS, &mut rng));
        sentence.push_str(&pick(ENDINGS, &mut rng));
        sentence.push(if rng.below(5) == 0 { '\n' } else { ' ' });
        let mut chars = sentence.into_bytes();
        chars[0] = chars[0].to_ascii_uppercase();
        out.extend_from_slice(&chars);
    }
    out.truncate(len);
    out
}
