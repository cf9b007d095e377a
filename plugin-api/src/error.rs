//! The error a plugin call returns, and the ways to make one.

use std::{error::Error, fmt};

/// The error a plugin call returns; the host disables the plugin and logs it (from
/// [`crate::Plugin::new`]: the run is refused before training, exit 2).
///
/// Whatever a `Box<dyn std::error::Error>` is made from converts into it, so the
/// obvious spellings work:
///
/// ```
/// use ptrain_plugin_api::{bail, PluginResult};
///
/// fn check(path: Option<&str>, every: u64) -> PluginResult<u64> {
///     let Some(path) = path else { return Err("option `path` is required".into()) };
///     if every == 0 {
///         return Err(format!("every = {every}: must be at least 1").into());
///     }
///     if path.is_empty() {
///         bail!("option `path` is empty");
///     }
///     let size = std::fs::metadata(path)?.len(); // any std error, with `?`
///     Ok(size)
/// }
/// assert_eq!(check(None, 1).unwrap_err().message(), "option `path` is required");
/// assert_eq!(check(Some("x"), 0).unwrap_err().to_string(), "every = 0: must be at least 1");
/// assert_eq!(check(Some(""), 1).unwrap_err().message(), "option `path` is empty");
/// assert!(check(Some("/nonexistent"), 1).unwrap_err().message().contains("No such file"));
/// ```
#[derive(Debug)]
pub struct PluginError {
    message: String,
}

impl PluginError {
    pub fn msg(message: impl fmt::Display) -> PluginError {
        PluginError { message: message.to_string() }
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn into_message(self) -> String {
        self.message
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

// Everything that converts into a boxed std error converts into a PluginError: `&str`
// and `String` (`Err("...".into())`), any std error with `?` (its causes appended), and
// `anyhow::Error`. One blanket impl covers them all; separate `From<&str>` and
// `From<E: Error>` impls would overlap (std may implement `Error` for `&str` one day).
// PluginError is no std error itself, so this impl does not overlap `From<T> for T`.
impl<'a, E: Into<Box<dyn Error + 'a>>> From<E> for PluginError {
    fn from(error: E) -> PluginError {
        let error: Box<dyn Error + 'a> = error.into();
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        PluginError { message }
    }
}

pub type PluginResult<T = ()> = Result<T, PluginError>;

/// Returns early from a plugin method with a [`PluginError`] made like `format!`:
/// `bail!("option `path` is required")`, `bail!("every = {every}: must be at least 1")`.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)+) => {
        return ::core::result::Result::Err($crate::PluginError::msg(::std::format!($($arg)+)))
    };
}

#[cfg(test)]
mod tests {
    use super::{PluginError, PluginResult};

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("cannot open the log")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn refuse(how: u8) -> PluginResult {
        let limit = 3;
        match how {
            0 => Err("option `path` is required".into()),
            1 => Err(format!("limit {limit} is too small").into()),
            2 => crate::bail!("bailed at {limit}"),
            _ => Err(Outer(std::io::Error::other("disk full")))?,
        }
    }

    #[test]
    fn strings_format_bail_and_std_errors_with_their_causes_convert() {
        let message = |how| refuse(how).unwrap_err().message().to_string();
        assert_eq!(message(0), "option `path` is required");
        assert_eq!(message(1), "limit 3 is too small");
        assert_eq!(message(2), "bailed at 3");
        assert_eq!(message(3), "cannot open the log: disk full");
        assert_eq!(PluginError::msg(42).to_string(), "42");
    }
}
