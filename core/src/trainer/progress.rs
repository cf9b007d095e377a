//! Progress at the `log_every` cadence: an indicatif bar on a terminal, plain log
//! lines otherwise; with the bar on the terminal and standard output redirected
//! (`ptrain run > run.log`), plain lines go to standard output too, so the log has
//! them. Nothing here runs on steps that are not due.

use std::{io::IsTerminal, sync::Mutex};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    /// With a bar: standard output is not a terminal, and gets the plain lines.
    lines_to_stdout: bool,
    total: u64,
    /// Rank 0 shows progress (a bar, or log lines: `--quiet` raises the log level
    /// above them); the other ranks only take part in the mean loss.
    shown: bool,
}

/// The bar being drawn, for lines printed from other threads (signals).
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Prints `message` on a line of its own on stderr: above the progress bar when one
/// is drawn, rather than glued to its end.
pub fn eprint_line(message: &str) {
    match BAR.lock().ok().and_then(|bar| bar.clone()) {
        Some(bar) => bar.println(message),
        None => eprintln!("{message}"),
    }
}

pub struct Line {
    pub step: u64,
    pub loss: f64,
    pub lr: f64,
    /// Token positions computed per second, padding included (every rank).
    pub tokens_per_s: f64,
    pub eta_s: f64,
    /// Passes over the training samples so far (2.5: halfway through the third).
    pub epoch: f64,
}

impl Progress {
    /// `bar`: a bar on a terminal (not with `--quiet`); `shown`: this rank shows progress.
    pub fn new(start: u64, total: u64, bar: bool, shown: bool) -> Progress {
        let enabled = bar && shown;
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
            bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"));
            bar.set_position(start);
            bar
        });
        if let (Some(bar), Ok(mut shown)) = (&bar, BAR.lock()) {
            *shown = Some(bar.clone());
        }
        let lines_to_stdout = bar.is_some() && !std::io::stdout().is_terminal();
        Progress { bar, lines_to_stdout, total, shown }
    }

    pub fn update(&self, line: &Line) {
        if !self.shown {
            return;
        }
        let text = format!(
            "loss {:.4}  lr {:.2e}  epoch {:.2}  {:.0} tok/s  eta {}",
            line.loss,
            line.lr,
            line.epoch,
            line.tokens_per_s,
            format_secs(line.eta_s)
        );
        match &self.bar {
            Some(bar) => {
                bar.set_position(line.step);
                if self.lines_to_stdout {
                    println!("step {}/{}  {text}", line.step, self.total);
                }
                bar.set_message(text);
            }
            None => tracing::info!("step {}/{}  {text}", line.step, self.total),
        }
    }

    /// Prints a message without tearing the bar.
    pub fn println(&self, message: &str) {
        match &self.bar {
            Some(bar) => bar.println(message),
            None => tracing::info!("{message}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            if let Ok(mut shown) = BAR.lock() {
                *shown = None;
            }
            bar.finish_and_clear();
        }
    }
}

pub fn format_secs(s: f64) -> String {
    if !s.is_finite() {
        return "?".into();
    }
    let s = s.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}
