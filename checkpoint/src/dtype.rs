//! [`DType`] as the safetensors crate spells it: the pairing goes by the
//! safetensors name, which `ptrain_plugin_api::DType` owns.

use ptrain_plugin_api::DType;
use safetensors::Dtype;

/// The safetensors dtype of `dtype`.
pub fn to_safetensors(dtype: DType) -> Dtype {
    SAFETENSORS[DType::ALL.iter().position(|d| *d == dtype).expect("DType::ALL lists every dtype")]
}

/// The checkpoint dtype of a safetensors dtype; `None` for one a checkpoint does
/// not hold (F8, I16, BOOL, ...).
pub fn from_safetensors(dtype: Dtype) -> Option<DType> {
    DType::from_safetensors_name(&dtype.to_string())
}

/// `DType::ALL`'s safetensors dtypes, in its order (checked by name in the tests).
const SAFETENSORS: [Dtype; 7] = [Dtype::F32, Dtype::F64, Dtype::BF16, Dtype::F16, Dtype::I64, Dtype::I32, Dtype::U8];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_pairs_with_the_safetensors_dtype_of_its_name() {
        for d in DType::ALL {
            assert_eq!(to_safetensors(d).to_string(), d.safetensors_name());
            assert_eq!(from_safetensors(to_safetensors(d)), Some(d));
        }
        assert_eq!(from_safetensors(Dtype::BOOL), None);
    }
}
