//! `ptrain tokenize --show N` for preference pairs: each of the first pairs as
//! prompt + chosen and prompt + rejected, the completion tokens (the trained ones)
//! marked as instruction rows' are ([`crate::data::text::show::marked`]).

use super::{encode, encode::EncodedPair, rows};
use crate::{
    config::Config,
    data::text::{
        self,
        encode::Shown,
        show::{first, ShownRow},
    },
    error::Result,
};

/// A pair shown: prompt + chosen, prompt + rejected, and the pair's ids.
pub type ShownPair = ShownRow<([Shown; 2], EncodedPair)>;

/// The first `n` pairs of `data.path`, encoded as a run encodes them. A bad row is
/// the error a run would give.
pub fn first_pairs(config: &Config, n: usize) -> Result<Vec<ShownPair>> {
    let (encoder, _) = text::encoder(config)?;
    first(config, n, |spec, record| rows::shape(record, &spec.shaper.columns, &spec.shaper.ignore).and_then(|pair| encode::show(&encoder, &pair)))
}
