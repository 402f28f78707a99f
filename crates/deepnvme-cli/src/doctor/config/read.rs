//! Reading the config file as DeepSpeed reads it. `DeepSpeedConfig` opens
//! it with `hjson.load(f, object_pairs_hook=dict_raise_error_on_duplicate_keys)`
//! (`deepspeed/runtime/config.py`): hjson takes JSON with `//`, `#` and
//! `/* */` comments, a UTF-8 BOM and trailing commas (and more), and the
//! hook refuses a key given twice in one object, at any depth ("Duplicate
//! keys in DeepSpeed config: ['stage']").
//!
//! The doctor reads strict JSON itself (a BOM allowed), then JSON with
//! comments and trailing commas (blanked out, outside strings); anything
//! else only hjson reads, so it asks DeepSpeed's own reader in the job's
//! Python (`read_config` in `config_probe.py`). Every way finds the
//! duplicate keys, with the object they are in; the value kept is the
//! last, as `dict` keeps it, so that the rest of the config is still checked.

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// How the file was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum How {
    /// Strict JSON (after a BOM, if any).
    Json,
    /// JSON once its comments and trailing commas are blanked out.
    JsonWithComments,
    /// By DeepSpeed's hjson reader in this Python.
    Hjson(PathBuf),
}

/// Keys given more than once in one object: DeepSpeed refuses the config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duplicate {
    /// The object's keys from the top (list indices as numbers); empty: the top level.
    pub object: Vec<String>,
    pub keys: Vec<String>,
    /// DeepSpeed's error.
    pub message: String,
}

impl Duplicate {
    /// Each duplicated key's full name: `zero_optimization.stage`.
    pub fn paths(&self) -> Vec<String> {
        self.keys.iter().map(|k| self.object.iter().chain([k]).cloned().collect::<Vec<_>>().join(".")).collect()
    }
}

/// The config as read.
#[derive(Clone, Debug)]
pub struct Read {
    pub value: Value,
    pub duplicates: Vec<Duplicate>,
    pub how: How,
}

/// A Python `repr` of a list of strings, as DeepSpeed's message prints it.
fn py_list(keys: &[String]) -> String {
    let repr = |s: &str| {
        let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
        let mut out = String::from(q);
        for c in s.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c == q => {
                    out.push('\\');
                    out.push(c)
                }
                c => out.push(c),
            }
        }
        out.push(q);
        out
    };
    format!("[{}]", keys.iter().map(|k| repr(k)).collect::<Vec<_>>().join(", "))
}

/// `dict_raise_error_on_duplicate_keys`'s message.
pub fn message(keys: &[String]) -> String {
    format!("Duplicate keys in DeepSpeed config: {}", py_list(keys))
}

/// Builds a [`Value`] as serde_json does, noting each object's duplicate keys.
struct Checked<'a> {
    path: Vec<String>,
    found: &'a RefCell<Vec<Duplicate>>,
}

impl Checked<'_> {
    fn child(&self, key: String) -> Checked<'_> {
        let mut path = self.path.clone();
        path.push(key);
        Checked { path, found: self.found }
    }
}

impl<'de> DeserializeSeed<'de> for Checked<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Checked<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(Value::from(i))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(Value::from(u))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        Ok(Value::from(f))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self.child(out.len().to_string()))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        // Each key and how often it comes, in the order of first appearance
        // (DeepSpeed's Counter lists the duplicates so).
        let mut counts: Vec<(String, usize)> = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(self.child(k.clone()))?;
            match counts.iter_mut().find(|(c, _)| *c == k) {
                Some((_, n)) => *n += 1,
                None => counts.push((k.clone(), 1)),
            }
            out.insert(k, v);
        }
        let keys: Vec<String> = counts.into_iter().filter(|(_, n)| *n > 1).map(|(k, _)| k).collect();
        if !keys.is_empty() {
            self.found.borrow_mut().push(Duplicate { object: self.path.clone(), message: message(&keys), keys });
        }
        Ok(Value::Object(out))
    }
}

/// Strict JSON, with the duplicate keys serde_json would silently drop.
pub fn json(text: &str) -> Result<(Value, Vec<Duplicate>), serde_json::Error> {
    let found = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Checked { path: Vec::new(), found: &found }.deserialize(&mut de)?;
    de.end()?;
    let mut found = found.into_inner();
    // Inner objects finish first; list them from the top, as a reader reads.
    found.sort_by_key(|d| d.object.len());
    Ok((value, found))
}

/// `text` with what hjson skips between JSON tokens and strict JSON
/// refuses blanked out: `//`, `#` and `/* */` comments, and a comma before
/// `}` or `]`, each outside strings. Blanks keep line breaks, so serde_json's
/// line and column still point into the file. None when there is nothing
/// to blank, or a `/*` is not closed (hjson refuses that too).
pub fn without_comments(text: &str) -> Option<String> {
    let mut b = text.as_bytes().to_vec();
    let blank = |b: &mut [u8]| b.iter_mut().filter(|c| !matches!(c, b'\n' | b'\r')).for_each(|c| *c = b' ');
    let mut changed = false;
    let (mut i, mut in_string) = (0, false);
    while i < b.len() {
        let (c, next) = (b[i], b.get(i + 1).copied());
        let end = if in_string {
            match c {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            None
        } else {
            match (c, next) {
                (b'"', _) => {
                    in_string = true;
                    None
                }
                (b'#', _) | (b'/', Some(b'/')) => {
                    Some(b[i..].iter().position(|&c| c == b'\n' || c == b'\r').map_or(b.len(), |n| i + n))
                }
                (b'/', Some(b'*')) => Some(i + 2 + b[i + 2..].windows(2).position(|w| w == b"*/")? + 2),
                _ => None,
            }
        };
        match end {
            Some(end) => {
                blank(&mut b[i..end]);
                changed = true;
                i = end;
            }
            None => i += 1,
        }
    }
    // Comments are spaces now: a comma whose next token closes is trailing.
    let (mut i, mut in_string) = (0, false);
    while i < b.len() {
        match (in_string, b[i]) {
            (true, b'\\') => i += 1,
            (_, b'"') => in_string = !in_string,
            (false, b',') => {
                let next = b[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
                if matches!(next, Some(b'}') | Some(b']')) {
                    b[i] = b' ';
                    changed = true;
                }
            }
            _ => {}
        }
        i += 1;
    }
    // Only ASCII bytes were replaced, by spaces: still UTF-8.
    changed.then(|| String::from_utf8(b).expect("blanked UTF-8"))
}

/// hjson's numbers: one written with a fraction or an exponent whose value
/// is whole (and under 1e10) is an int (`1e8`, `8.0`), as hjson's decoder
/// makes it. A file only hjson reads is read so by DeepSpeed alone.
pub fn hjson_numbers(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()).filter(|f| f.fract() == 0.0 && f.abs() < 1e10) {
                *v = if f >= 0.0 { Value::from(f as u64) } else { Value::from(f as i64) };
            }
        }
        Value::Array(a) => a.iter_mut().for_each(hjson_numbers),
        Value::Object(o) => o.values_mut().for_each(hjson_numbers),
        _ => {}
    }
}

/// Reads `text` (the file `path`): strict JSON, then JSON with comments,
/// then `hjson` (DeepSpeed's reader, run in `python` by `hjson`).
pub fn read(
    path: &Path,
    text: &str,
    hjson: impl FnOnce() -> Result<Result<Read, String>, String>,
) -> Result<Read, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let strict = match json(text) {
        Ok((value, duplicates)) => return Ok(Read { value, duplicates, how: How::Json }),
        Err(e) => e,
    };
    if let Some(Ok((mut value, duplicates))) = without_comments(text).map(|t| json(&t)) {
        hjson_numbers(&mut value);
        return Ok(Read { value, duplicates, how: How::JsonWithComments });
    }
    let file = path.display();
    match hjson() {
        Ok(Ok(read)) => Ok(read),
        Ok(Err(refused)) => {
            Err(format!("{file} is not JSON ({strict}), and DeepSpeed's reader refuses it too: {refused}"))
        }
        Err(why) => Err(format!(
            "{file} is not JSON ({strict}), nor JSON with comments; DeepSpeed reads it with hjson, which the \
             doctor asks of the job's Python, but {why}: pass --python with the Python that runs DeepSpeed"
        )),
    }
}

/// What `read_config` (`config_probe.py`) reported: `{"config": ...,
/// "duplicates": [{"object", "keys", "message"}]}`, or `{"error": ...}`
/// when hjson or the hook refuses the file.
pub fn from_report(report: &Value, python: &Path) -> Result<Read, String> {
    if let Some(e) = report.get("error").and_then(Value::as_str) {
        return Err(e.to_string());
    }
    let value = report.get("config").cloned().ok_or("its report has no config")?;
    Ok(Read { value, duplicates: duplicates_of(report), how: How::Hjson(python.to_path_buf()) })
}

/// The `duplicates` of a `read_config` report.
pub fn duplicates_of(report: &Value) -> Vec<Duplicate> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect()).unwrap_or_default()
    };
    report
        .get("duplicates")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|d| Duplicate {
                    object: strings(&d["object"]),
                    keys: strings(&d["keys"]),
                    message: d["message"].as_str().unwrap_or_default().to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn duplicate_keys_are_found_at_every_level() {
        let (v, d) = json(r#"{"a": {"b": 1, "c": 2, "b": 3}, "x": [{"y": 1, "y": 2}], "a": {"b": 4}}"#).unwrap();
        assert_eq!(v, json!({"a": {"b": 4}, "x": [{"y": 2}]}));
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!((d[0].object.clone(), d[0].paths()), (vec![], vec!["a".to_string()]));
        assert_eq!(d[0].message, "Duplicate keys in DeepSpeed config: ['a']");
        let paths: Vec<Vec<String>> = d.iter().map(Duplicate::paths).collect();
        assert!(paths.contains(&vec!["a.b".to_string()]) && paths.contains(&vec!["x.0.y".to_string()]), "{paths:?}");
        assert_eq!(message(&["it's".into(), "a\\b".into()]), r#"Duplicate keys in DeepSpeed config: ["it's", 'a\\b']"#);
        assert!(json(r#"{"a": 1, "b": 2}"#).unwrap().1.is_empty());
    }

    #[test]
    fn comments_and_trailing_commas_are_blanked_outside_strings() {
        let text = "// top\n{\"a\": \"http://x//y /* no */ # no\", /* c\n */ \"b\": [1, 2,], # c\n \"c\": 1 // c\n,}";
        let t = without_comments(text).unwrap();
        assert_eq!(t.lines().count(), text.lines().count());
        let (v, _) = json(&t).unwrap();
        assert_eq!(v, json!({"a": "http://x//y /* no */ # no", "b": [1, 2], "c": 1}));
        assert_eq!(json(&without_comments(r#"{"a": "q\"//", "b": 1,}"#).unwrap()).unwrap().0["a"], "q\"//");
        assert_eq!(without_comments(r#"{"a": 1}"#), None);
        assert_eq!(without_comments(r#"{"a": 1 /* open"#), None);
        // Two commas stay an error, as hjson has it.
        assert!(json(&without_comments(r#"{"a": 1,,}"#).unwrap()).is_err());
    }

    #[test]
    fn a_bom_and_comments_need_no_python() {
        let no_python = || Err("no Python".to_string());
        let r = read(Path::new("c.json"), "\u{feff}{\"a\": 1}", no_python).unwrap();
        assert_eq!((r.value, r.how), (json!({"a": 1}), How::Json));
        let r = read(Path::new("c.json"), "\u{feff}// c\n{\"a\": 1e8, \"b\": 2.5, \"c\": 1e10,}", no_python).unwrap();
        assert_eq!(r.how, How::JsonWithComments);
        assert_eq!(r.value, json!({"a": 100000000, "b": 2.5, "c": 1e10}));
        let e = read(Path::new("c.json"), "a: 1", no_python).unwrap_err();
        assert!(e.contains("c.json is not JSON") && e.contains("no Python") && e.contains("--python"), "{e}");
        let refused = || Ok(Err("HjsonDecodeError: bad".to_string()));
        let e = read(Path::new("c.json"), "{", refused).unwrap_err();
        assert!(e.contains("refuses it too: HjsonDecodeError: bad"), "{e}");
    }
}
