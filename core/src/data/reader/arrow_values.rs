//! Arrow columns as the values a row holds, a whole column at a time, as
//! `datasets` gives them to Python: strings, numbers, booleans, lists, structs as
//! maps with every field (a null field is `None`, not left out), and values of the
//! `arrow.json` extension type (datasets' `Json` feature: a string of JSON per
//! value, which it writes for objects whose keys differ from row to row, such as
//! messages with and without `tool_calls`) parsed, as datasets decodes them.

use arrow_array::{cast::AsArray, types::*, Array, ArrowPrimitiveType, OffsetSizeTrait};
use arrow_schema::{DataType, Field};
use minijinja::Value;

/// Whether a field holds JSON text (the canonical `arrow.json` extension type).
fn is_json(field: &Field) -> bool {
    field.metadata().get("ARROW:extension:name").is_some_and(|n| n == "arrow.json")
}

/// Whether a column of this type can be read (checked before reading, so that an
/// unreadable column is named once, with its type).
pub fn readable(t: &DataType) -> bool {
    use DataType::*;
    match t {
        Null | Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float16 | Float32 | Float64 | Utf8 | LargeUtf8
        | Utf8View => true,
        List(f) | LargeList(f) | FixedSizeList(f, _) => readable(f.data_type()),
        Struct(fields) => fields.iter().all(|f| readable(f.data_type())),
        Dictionary(_, v) => readable(v),
        _ => false,
    }
}

/// Every value of `array` (of `field`), in order.
pub fn values(array: &dyn Array, field: &Field) -> Result<Vec<Value>, String> {
    use DataType::*;
    let n = array.len();
    if is_json(field) && matches!(array.data_type(), Utf8 | LargeUtf8 | Utf8View) {
        return values(array, &Field::new("", array.data_type().clone(), true))?
            .into_iter()
            .map(|v| match v.as_str() {
                Some(text) => serde_json::from_str::<Value>(text).map_err(|e| format!("a JSON value (arrow.json) that does not parse: {e}")),
                None => Ok(v),
            })
            .collect();
    }
    let nulls = |i: usize| array.is_null(i);
    let mut out: Vec<Value> = match array.data_type() {
        Null => vec![Value::from(()); n],
        Boolean => array.as_boolean().iter().map(|v| v.map_or(Value::from(()), Value::from)).collect(),
        Int8 => numbers::<Int8Type>(array, |v| Value::from(v as i64)),
        Int16 => numbers::<Int16Type>(array, |v| Value::from(v as i64)),
        Int32 => numbers::<Int32Type>(array, |v| Value::from(v as i64)),
        Int64 => numbers::<Int64Type>(array, Value::from),
        UInt8 => numbers::<UInt8Type>(array, |v| Value::from(v as u64)),
        UInt16 => numbers::<UInt16Type>(array, |v| Value::from(v as u64)),
        UInt32 => numbers::<UInt32Type>(array, |v| Value::from(v as u64)),
        UInt64 => numbers::<UInt64Type>(array, Value::from),
        Float16 => numbers::<Float16Type>(array, |v| Value::from(f64::from(v.to_f32()))),
        Float32 => numbers::<Float32Type>(array, |v| Value::from(v as f64)),
        Float64 => numbers::<Float64Type>(array, Value::from),
        Utf8 => strings::<i32>(array),
        LargeUtf8 => strings::<i64>(array),
        Utf8View => array.as_string_view().iter().map(|s| s.map_or(Value::from(()), Value::from)).collect(),
        List(child) => lists(array.as_list::<i32>(), child)?,
        LargeList(child) => lists(array.as_list::<i64>(), child)?,
        FixedSizeList(child, size) => {
            let list = array.as_fixed_size_list();
            let inner = values(list.values().as_ref(), child)?;
            let size = *size as usize;
            (0..n).map(|i| Value::from(inner[i * size..(i + 1) * size].to_vec())).collect()
        }
        Struct(fields) => {
            let s = array.as_struct();
            let columns: Vec<Vec<Value>> = s.columns().iter().zip(fields.iter()).map(|(c, f)| values(c.as_ref(), f)).collect::<Result<_, _>>()?;
            (0..n).map(|i| Value::from_pairs(fields.iter().zip(&columns).map(|(f, c)| (f.name().as_str(), c[i].clone())))).collect()
        }
        Dictionary(_, value_type) => {
            let dict = array.as_any_dictionary();
            let inner = values(dict.values().as_ref(), &Field::new("", value_type.as_ref().clone(), true))?;
            if inner.is_empty() {
                vec![Value::from(()); n]
            } else {
                dict.normalized_keys().into_iter().map(|k| inner[k].clone()).collect()
            }
        }
        other => return Err(format!("an Arrow column of type {other}, which ptrain does not read")),
    };
    // Struct and list rows that are null as a whole (their children hold filler).
    if array.null_count() > 0 {
        for (i, v) in out.iter_mut().enumerate() {
            if nulls(i) {
                *v = Value::from(());
            }
        }
    }
    Ok(out)
}

fn numbers<T: ArrowPrimitiveType>(array: &dyn Array, f: impl Fn(T::Native) -> Value) -> Vec<Value> {
    array.as_primitive::<T>().iter().map(|v| v.map_or(Value::from(()), &f)).collect()
}

fn strings<O: OffsetSizeTrait>(array: &dyn Array) -> Vec<Value> {
    array.as_string::<O>().iter().map(|s| s.map_or(Value::from(()), Value::from)).collect()
}

fn lists<O: OffsetSizeTrait>(list: &arrow_array::GenericListArray<O>, child: &Field) -> Result<Vec<Value>, String> {
    let inner = values(list.values().as_ref(), child)?;
    let offsets = list.value_offsets();
    Ok(offsets.windows(2).map(|w| Value::from(inner[w[0].as_usize()..w[1].as_usize()].to_vec())).collect())
}
