//! The `tojson` filter as transformers defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//! Jinja's own (and minijinja's) escapes `<`, `>`, `&`, `'` and writes no spaces,
//! which would change how tool schemas and tool-call arguments render.

use std::io::Write;

use minijinja::{value::Kwargs, Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::ser::Formatter;

/// `value | tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)`.
pub fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent.filter(|v| !v.is_none()) {
        None => None,
        Some(v) => Some(match (v.as_i64(), v.as_str()) {
            (Some(n), _) => " ".repeat(n.max(0) as usize),
            (_, Some(s)) => s.to_string(),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be a number or a string")),
        }),
    };
    let (item, key) = match separators.filter(|v| !v.is_none()) {
        Some(pair) => {
            let parts: Vec<String> = pair.try_iter()?.map(|v| v.as_str().map(str::to_string)).collect::<Option<_>>().unwrap_or_default();
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
            }
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let value = if sort_keys.unwrap_or(false) { sorted(&value)? } else { value };
    let mut out = Vec::new();
    let formatter = PyFormatter { indent, item, key, level: 0, has_value: false };
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut ser).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from(if ensure_ascii.unwrap_or(false) { ascii(&text) } else { text }))
}

/// A copy with every map's keys sorted (`sort_keys=True`).
fn sorted(value: &Value) -> Result<Value, Error> {
    use minijinja::value::ValueKind;
    Ok(match value.kind() {
        ValueKind::Map => {
            let mut pairs: Vec<(Value, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                pairs.push((key, sorted(&item)?));
            }
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            Value::from_pairs(pairs)
        }
        ValueKind::Seq => value.try_iter()?.map(|v| sorted(&v)).collect::<Result<Vec<_>, _>>()?.into(),
        _ => value.clone(),
    })
}

/// `ensure_ascii=True`: every character above U+007F as `\uXXXX` (surrogate pairs
/// above U+FFFF). Only inside strings can such characters occur.
fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// Python's `repr(float)`: the shortest digits that read back, positional from
/// 1e-4 to below 1e16, else `d.ddde+XX`.
pub fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let rest = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        format!("{sign}{}{rest}e{}{:02}", &digits[..1], if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// Python's `json.dumps` layout: `item` between items, `key` after keys, and with
/// an indent each item on its own line.
struct PyFormatter {
    indent: Option<String>,
    item: String,
    key: String,
    level: usize,
    has_value: bool,
}

impl PyFormatter {
    fn newline<W: ?Sized + Write>(&self, w: &mut W) -> std::io::Result<()> {
        if let Some(indent) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.level {
                w.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + Write>(&mut self, w: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + Write>(&mut self, w: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        self.has_value = true;
        w.write_all(bracket)
    }

    fn item_start<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(self.item.as_bytes())?;
        }
        self.newline(w)
    }
}

impl Formatter for PyFormatter {
    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> std::io::Result<()> {
        w.write_all(py_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + Write>(&mut self, w: &mut W, value: f32) -> std::io::Result<()> {
        w.write_all(py_float(value as f64).as_bytes())
    }

    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.item_start(w, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.item_start(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(self.key.as_bytes())
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(json: &str, kwargs: &[(&str, Value)]) -> String {
        let value: Value = serde_json::from_str(json).unwrap();
        let kwargs = Kwargs::from_iter(kwargs.iter().map(|(k, v)| (*k, v.clone())));
        tojson(value, kwargs).unwrap().as_str().unwrap().to_string()
    }

    #[test]
    fn writes_what_pythons_json_dumps_writes() {
        // json.dumps({"b": [1, 2.5, None, True], "a": {"x": "<é\n>"}, "e": [], "f": 1e16}, ensure_ascii=False)
        let text = r#"{"b": [1, 2.5, null, true], "a": {"x": "<é\n>"}, "e": [], "f": 1e16}"#;
        assert_eq!(dumps(text, &[]), r#"{"b": [1, 2.5, null, true], "a": {"x": "<é\n>"}, "e": [], "f": 1e+16}"#);
        // indent=2 and sort_keys=True
        let pretty = dumps(r#"{"b": [1], "a": {}}"#, &[("indent", Value::from(2)), ("sort_keys", Value::from(true))]);
        assert_eq!(pretty, "{\n  \"a\": {},\n  \"b\": [\n    1\n  ]\n}");
        assert_eq!(dumps(r#"["é"]"#, &[("ensure_ascii", Value::from(true))]), r#"["\u00e9"]"#);
    }

    #[test]
    fn floats_read_as_pythons_repr() {
        for (x, repr) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (-2.5e-7, "-2.5e-07"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(py_float(x), repr, "{x}");
        }
    }
}
