//! The digest of a LoRA base: the check that an adapter checkpoint resumes, or is
//! exported, only on the base it was trained on (`model::adapters::same_base`).

use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// Elements of a tensor copied to the host and hashed at a time (1 MiB in float32).
const HASH_SLICE: i64 = 1 << 18;

/// The digest of a LoRA base: SHA-256 over one line per frozen tensor, in name order,
/// giving its name, shape, type and the SHA-256 of its bytes (on the host). Each
/// tensor is hashed on its own, in any order and in as many pieces as wanted, so a
/// rank that never holds the whole base digests it all the same: parameter sharding
/// hashes each weight as it reads it from the files (`model::hf::load_pieces`) or
/// each drawn tensor before its block is cut (`optim::StreamingCut`).
#[derive(Default)]
pub struct BaseDigest(std::collections::BTreeMap<String, String>);

/// One tensor of a [`BaseDigest`]: its header, then its bytes.
pub struct TensorHash {
    name: String,
    header: String,
    bytes: Sha256,
}

impl TensorHash {
    pub fn new(name: &str, shape: &[i64], kind: Kind) -> TensorHash {
        TensorHash { name: name.to_owned(), header: format!("{name} {shape:?} {kind:?}"), bytes: Sha256::new() }
    }

    pub fn bytes(&mut self, bytes: &[u8]) {
        self.bytes.update(bytes);
    }

    /// Feeds `numel` elements, copied to the host a slice at a time: `slice(at, len)`
    /// gives elements `[at, at + len)` (on any device), of the type the header names.
    pub fn slices(&mut self, numel: i64, mut slice: impl FnMut(i64, i64) -> Result<Tensor>) -> Result<()> {
        let mut bytes = Vec::new();
        for at in (0..numel).step_by(HASH_SLICE as usize) {
            let len = HASH_SLICE.min(numel - at);
            let values = slice(at, len)?.f_to_device(Device::Cpu)?.f_contiguous()?;
            bytes.resize(len as usize * values.kind().elt_size_in_bytes(), 0);
            values.f_copy_data_u8(&mut bytes, len as usize)?;
            self.bytes(&bytes);
        }
        Ok(())
    }
}

impl BaseDigest {
    pub fn add(&mut self, t: TensorHash) {
        self.0.insert(t.name, format!("{} {}\n", t.header, hex(t.bytes)));
    }

    /// Adds `t` (on any device), copied to the host a slice at a time.
    pub fn add_tensor(&mut self, name: &str, t: &Tensor) -> Result<()> {
        let mut h = TensorHash::new(name, &t.size(), t.kind());
        let flat = t.f_reshape([-1])?;
        h.slices(flat.numel() as i64, |at, len| Ok(flat.f_narrow(0, at, len)?))?;
        self.add(h);
        Ok(())
    }

    pub fn finish(self) -> String {
        let mut h = Sha256::new();
        self.0.values().for_each(|line| h.update(line.as_bytes()));
        hex(h)
    }
}

fn hex(h: Sha256) -> String {
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(tensors: &[(&str, &Tensor)]) -> String {
        let mut d = BaseDigest::default();
        tensors.iter().for_each(|(name, t)| d.add_tensor(name, t).unwrap());
        d.finish()
    }

    /// The digest sharded ranks take tensor by tensor, in block order, is the one
    /// taken from a whole base in name order; any byte, name or shape changes it.
    #[test]
    fn a_base_digest_ignores_the_order_and_the_pieces_but_not_a_byte_a_name_or_a_shape() {
        // More elements than one slice copied to the host.
        let a = Tensor::arange((HASH_SLICE * 2 / 5 + 1) * 5, (Kind::Float, Device::Cpu)).reshape([-1, 5]);
        let b = Tensor::ones([3], (Kind::Float, Device::Cpu));
        let reference = digest(&[("a", &a), ("b", &b)]);
        assert_eq!(digest(&[("b", &b), ("a", &a)]), reference);
        let mut whole = BaseDigest::default();
        let mut h = TensorHash::new("a", &a.size(), Kind::Float);
        let mut bytes = vec![0u8; a.numel() * 4];
        a.copy_data_u8(&mut bytes, a.numel());
        bytes.chunks(777).for_each(|piece| h.bytes(piece));
        whole.add(h);
        whole.add_tensor("b", &b).unwrap();
        assert_eq!(whole.finish(), reference, "bytes fed in other pieces");

        let changed = a.copy();
        let _ = changed.get(HASH_SLICE / 5 + 1).get(2).fill_(-1.0);
        assert_ne!(digest(&[("a", &changed), ("b", &b)]), reference, "one element");
        assert_ne!(digest(&[("a2", &a), ("b", &b)]), reference, "a name");
        assert_ne!(digest(&[("a", &a.reshape([5, -1])), ("b", &b)]), reference, "a shape");
    }
}
