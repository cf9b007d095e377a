//! `ptrain tokenize --show N` for instruction rows: the first rows as the model sees
//! them, through the text layer's [`first`] (marked by its `show::marked`).

use crate::{
    config::Config,
    data::text::{
        self,
        show::{first, ShownRow},
    },
    error::Result,
};

/// The first `n` rows of the first source, encoded as a run encodes them. A bad
/// row is the error a run would give.
pub fn first_rows(config: &Config, n: usize) -> Result<Vec<ShownRow>> {
    let (encoder, _) = text::encoder(config)?;
    first(config, n, |spec, record| spec.shaper.shape(record).and_then(|example| encoder.show(&example)))
}
