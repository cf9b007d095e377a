//! Data-parallel training on c10d (skeleton, being written).
