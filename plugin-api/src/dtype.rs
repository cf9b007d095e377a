//! The one mapping of the element types a checkpoint holds ([`DType`], defined
//! with the payload in `checkpoint.rs`, where its ABI layout stays put) to their
//! sizes, safetensors' names and (with the `tch` feature) tch's kinds. Every crate that turns a
//! tensor into bytes or back goes through here (`checkpoint/src/dtype.rs` pairs
//! these with the safetensors crate's own enum by name).

use crate::DType;

impl DType {
    /// Every dtype, for looking one up by name or kind.
    pub const ALL: [DType; 7] = [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::U8];

    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 => 1,
        }
    }

    /// The dtype name used by the safetensors format.
    pub const fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::U8 => "U8",
        }
    }

    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.safetensors_name() == name)
    }

    /// Whether this is a floating-point type (weights of a pretrained model are).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }
}

#[cfg(feature = "tch")]
impl DType {
    /// tch's kind of this dtype.
    pub const fn kind(self) -> tch::Kind {
        use tch::Kind;
        match self {
            DType::F32 => Kind::Float,
            DType::F64 => Kind::Double,
            DType::BF16 => Kind::BFloat16,
            DType::F16 => Kind::Half,
            DType::I64 => Kind::Int64,
            DType::I32 => Kind::Int,
            DType::U8 => Kind::Uint8,
        }
    }

    /// The dtype of a tch kind; `None` for kinds a checkpoint does not hold.
    pub fn of_kind(kind: tch::Kind) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.kind() == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::DType;

    #[test]
    fn every_dtype_round_trips_through_its_safetensors_name() {
        for d in DType::ALL {
            assert_eq!(DType::from_safetensors_name(d.safetensors_name()), Some(d));
        }
        assert_eq!(DType::from_safetensors_name("I16"), None);
    }

    #[cfg(feature = "tch")]
    #[test]
    fn every_dtype_round_trips_through_its_tch_kind() {
        for d in DType::ALL {
            assert_eq!(DType::of_kind(d.kind()), Some(d));
            assert_eq!(tch::Tensor::zeros([3], (d.kind(), tch::Device::Cpu)).kind().elt_size_in_bytes(), d.size());
        }
        assert_eq!(DType::of_kind(tch::Kind::Bool), None);
    }
}
