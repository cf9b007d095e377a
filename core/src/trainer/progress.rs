//! Progress at the `log_every` cadence: an indicatif bar on a terminal, plain log
//! lines otherwise. Nothing here runs on steps that are not due.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
}

pub struct Line {
    pub step: u64,
    pub loss: f64,
    pub lr: f64,
    pub tokens_per_s: f64,
    pub eta_s: f64,
}

impl Progress {
    pub fn new(start: u64, total: u64, enabled: bool) -> Progress {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
            bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"));
            bar.set_position(start);
            bar
        });
        Progress { bar, total }
    }

    pub fn update(&self, line: &Line) {
        let text = format!("loss {:.4}  lr {:.2e}  {:.0} tok/s  eta {}", line.loss, line.lr, line.tokens_per_s, format_secs(line.eta_s));
        match &self.bar {
            Some(bar) => {
                bar.set_position(line.step);
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
