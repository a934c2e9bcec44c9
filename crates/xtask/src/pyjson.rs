//! JSON that keeps its keys in document order and is written the way
//! Python's `json.dump(obj, f, indent=2)` writes it (ASCII only, floats as
//! Python's `repr`), so that documents committed from the earlier Python
//! tooling come out byte for byte the same.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

#[derive(Clone, Debug, PartialEq)]
pub enum J {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

pub const NULL: J = J::Null;

impl J {
    pub fn str(s: impl Into<String>) -> J {
        J::Str(s.into())
    }

    pub fn parse(text: &str) -> serde_json::Result<J> {
        serde_json::from_str(text)
    }

    /// The document in the file at `path`.
    pub fn read(path: &Path) -> anyhow::Result<J> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        J::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// `d.get(key)`: `Null` where the key is missing or this is no object.
    pub fn get(&self, key: &str) -> &J {
        match self {
            J::Obj(kv) => kv.iter().find(|(k, _)| k == key).map_or(&NULL, |(_, v)| v),
            _ => &NULL,
        }
    }

    pub fn has(&self, key: &str) -> bool {
        matches!(self, J::Obj(kv) if kv.iter().any(|(k, _)| k == key))
    }

    /// `d[key] = value`: an existing key keeps its place, a new one goes last.
    pub fn set(&mut self, key: &str, value: J) {
        if let J::Obj(kv) = self {
            match kv.iter_mut().find(|(k, _)| k == key) {
                Some((_, v)) => *v = value,
                None => kv.push((key.to_string(), value)),
            }
        }
    }

    /// Python's truth value.
    pub fn truthy(&self) -> bool {
        match self {
            J::Null => false,
            J::Bool(b) => *b,
            J::Int(i) => *i != 0,
            J::UInt(u) => *u != 0,
            J::Float(f) => *f != 0.0,
            J::Str(s) => !s.is_empty(),
            J::Arr(a) => !a.is_empty(),
            J::Obj(o) => !o.is_empty(),
        }
    }

    /// `a or b`.
    pub fn or<'a>(&'a self, other: &'a J) -> &'a J {
        if self.truthy() { self } else { other }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            J::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            J::Int(i) => Some(*i as f64),
            J::UInt(u) => Some(*u as f64),
            J::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// Python's `str()` of the value, as an f-string shows it.
    pub fn py_str(&self) -> String {
        match self {
            J::Str(s) => s.clone(),
            _ => self.py_repr(),
        }
    }

    fn py_repr(&self) -> String {
        match self {
            J::Null => "None".into(),
            J::Bool(true) => "True".into(),
            J::Bool(false) => "False".into(),
            J::Int(i) => i.to_string(),
            J::UInt(u) => u.to_string(),
            J::Float(f) => float_repr(*f),
            J::Str(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
            J::Arr(a) => {
                let items: Vec<String> = a.iter().map(J::py_repr).collect();
                format!("[{}]", items.join(", "))
            }
            J::Obj(o) => {
                let items: Vec<String> = o
                    .iter()
                    .map(|(k, v)| format!("'{k}': {}", v.py_repr()))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
        }
    }

    /// `json.dumps(self, indent=2)`.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    /// `json.dumps(self)` on one line: `compact` is
    /// `separators=(",", ":")`, else Python's default `", "` and `": "`.
    pub fn dump_line(&self, compact: bool) -> String {
        let (item, key) = if compact { (",", ":") } else { (", ", ": ") };
        let mut out = String::new();
        self.write_line(&mut out, item, key);
        out
    }

    fn write_line(&self, out: &mut String, item: &str, key: &str) {
        match self {
            J::Arr(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item);
                    }
                    v.write_line(out, item, key);
                }
                out.push(']');
            }
            J::Obj(o) => {
                out.push('{');
                for (i, (k, v)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item);
                    }
                    write_str(out, k);
                    out.push_str(key);
                    v.write_line(out, item, key);
                }
                out.push('}');
            }
            _ => self.write(out, 0),
        }
    }

    fn write(&self, out: &mut String, level: usize) {
        match self {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Int(i) => out.push_str(&i.to_string()),
            J::UInt(u) => out.push_str(&u.to_string()),
            J::Float(f) => out.push_str(&json_float(*f)),
            J::Str(s) => write_str(out, s),
            J::Arr(a) if a.is_empty() => out.push_str("[]"),
            J::Obj(o) if o.is_empty() => out.push_str("{}"),
            J::Arr(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, level + 1);
                    v.write(out, level + 1);
                }
                out.push('\n');
                indent(out, level);
                out.push(']');
            }
            J::Obj(o) => {
                out.push('{');
                for (i, (k, v)) in o.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, level + 1);
                    write_str(out, k);
                    out.push_str(": ");
                    v.write(out, level + 1);
                }
                out.push('\n');
                indent(out, level);
                out.push('}');
            }
        }
    }
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

/// `ensure_ascii`: everything outside space..`~` escaped, astral characters
/// as surrogate pairs.
fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
    out.push('"');
}

fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        float_repr(f)
    }
}

/// Python's `round(x, n)` (half to even on the exact binary value, as
/// Rust's formatting rounds).
pub fn py_round(x: f64, n: usize) -> f64 {
    format!("{x:.n$}").parse().unwrap_or(x)
}

/// Python's `repr(float)`: the shortest digits that read back the same,
/// positional for exponents -4..15, else `d.ddde+XX`.
pub fn float_repr(f: f64) -> String {
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') || s.contains("inf") || s.contains("NaN") {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        d.deserialize_any(JVisitor)
    }
}

struct JVisitor;

impl<'de> Visitor<'de> for JVisitor {
    type Value = J;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<J, E> {
        Ok(J::Null)
    }
    fn visit_none<E>(self) -> Result<J, E> {
        Ok(J::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<J, E> {
        Ok(J::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<J, E> {
        Ok(J::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<J, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => J::Int(i),
            Err(_) => J::UInt(v),
        })
    }
    fn visit_f64<E>(self, v: f64) -> Result<J, E> {
        Ok(J::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<J, E> {
        Ok(J::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<J, E> {
        Ok(J::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<J, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = seq.next_element()? {
            v.push(x);
        }
        Ok(J::Arr(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<J, A::Error> {
        let mut o = J::Obj(Vec::new());
        while let Some((k, v)) = map.next_entry::<String, J>()? {
            o.set(&k, v);
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_python() {
        for (f, want) in [
            (133.0, "133.0"),
            (1.7, "1.7"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (-0.0, "-0.0"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(float_repr(f), want);
        }
    }

    #[test]
    fn round_trips_in_order_with_python_layout() {
        let text = "{\n  \"b\": [\n    1,\n    2.5,\n    \"\\u00e9\\ud83d\\ude00\\n\"\n  ],\n  \"a\": {},\n  \"c\": [],\n  \"d\": null\n}";
        assert_eq!(J::parse(text).map(|j| j.dump()).ok().as_deref(), Some(text));
    }

    #[test]
    fn one_line() {
        let j = J::Obj(vec![
            ("a".into(), J::Arr(vec![J::Int(1), J::Null])),
            ("b".into(), J::Float(2.0)),
        ]);
        assert_eq!(j.dump_line(true), r#"{"a":[1,null],"b":2.0}"#);
        assert_eq!(j.dump_line(false), r#"{"a": [1, null], "b": 2.0}"#);
    }
}
