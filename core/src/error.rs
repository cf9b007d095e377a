//! The core's error type. Usage errors (bad configuration, missing files, plugins
//! that cannot be loaded) are told apart so the binary exits 2 before training.

use std::path::PathBuf;

/// A configuration problem, naming where it came from and which key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ConfigError {
    /// The file, `--set ...` or `[plugins.x]` that introduced the problem.
    pub origin: String,
    /// Dotted key path, empty when the problem is not about one key.
    pub key: String,
    pub message: String,
}

impl ConfigError {
    fn render(&self) -> String {
        if self.key.is_empty() {
            format!("invalid configuration in {}: {}", self.origin, self.message)
        } else if self.message.starts_with("unknown field") {
            format!("unknown configuration key `{}` in {}: {}", self.key, self.origin, self.message)
        } else {
            format!("invalid configuration key `{}` in {}: {}", self.key, self.origin, self.message)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error("{what} not found: {}", path.display())]
    MissingFile { what: &'static str, path: PathBuf },

    /// A file or directory that cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file or directory that cannot be written (created, renamed): a full disk
    /// says so, not that it cannot read.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("bad input data in {}: {message}", path.display())]
    Data { path: PathBuf, message: String },

    #[error("plugin {name}: {message}")]
    Plugin { name: String, message: String },

    #[error("cannot use device {device}: {message}")]
    Device { device: String, message: String },

    #[error("{}", torch_message(.0))]
    Torch(#[from] tch::TchError),

    #[error("distributed: {0}")]
    Dist(String),

    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint { path: PathBuf, message: String },

    /// The run directory cannot be used: another run holds it, or it holds an
    /// earlier run's checkpoints.
    #[error("run directory {}: {message}", path.display())]
    RunDir { path: PathBuf, message: String },

    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The error of a failed write to `path`: `.map_err(Error::writing(&path))`.
    pub fn writing(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Write { path: path.to_owned(), source }
    }

    /// Whether the run was refused before training because of what the user asked for.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::Config(_)
                | Error::MissingFile { .. }
                | Error::Data { .. }
                | Error::Plugin { .. }
                | Error::Device { .. }
                | Error::Checkpoint { .. }
                | Error::RunDir { .. }
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A libtorch error as a message: libtorch's own text (which names the operation, or the
/// backend and peer of a collective), without tch's "Internal torch error: " before it.
pub fn torch_message(e: &tch::TchError) -> String {
    match e {
        tch::TchError::Torch(message) => message.clone(),
        other => other.to_string(),
    }
}
