//! A small hand-written JSON value and writer for `--json` output and the
//! DeepSpeed `"aio"` config block (the project takes no serde). Objects keep
//! their keys in insertion order; non-finite numbers are written as `null`.

use std::fmt::Write as _;

#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// An empty object to fill with [`Json::set`].
    pub fn object() -> Json {
        Json::Obj(Vec::new())
    }

    /// Adds `key: value` to an object (builder style). No-op on non-objects.
    pub fn set(mut self, key: &str, value: impl Into<Json>) -> Json {
        if let Json::Obj(fields) = &mut self {
            fields.push((key.to_string(), value.into()));
        }
        self
    }

    /// A number rounded to `decimals` places, for readable output.
    pub fn rounded(v: f64, decimals: i32) -> Json {
        let scale = 10f64.powi(decimals);
        Json::Num((v * scale).round() / scale)
    }

    /// Writes the value, indented by `indent` spaces per level (0 = one line).
    pub fn render(&self, indent: usize) -> String {
        let mut out = String::new();
        self.write(&mut out, indent, 0);
        out
    }

    fn write(&self, out: &mut String, indent: usize, level: usize) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Json::Num(x) if x.is_finite() => {
                // Integral floats print without a fraction; both are JSON.
                let _ = write!(out, "{x}");
            }
            Json::Num(_) => out.push_str("null"),
            Json::Str(s) => deepnvme::json::push_string(out, s),
            Json::Arr(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                // Arrays of scalars stay on one line: they are series of numbers.
                let flat = indent == 0 || items.iter().all(|v| !matches!(v, Json::Arr(_) | Json::Obj(_)));
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        if flat && indent > 0 {
                            out.push(' ');
                        }
                    }
                    if !flat {
                        newline(out, indent, level + 1);
                    }
                    v.write(out, indent, level + 1);
                }
                if !flat {
                    newline(out, indent, level);
                }
                out.push(']');
            }
            Json::Obj(fields) => {
                if fields.is_empty() {
                    out.push_str("{}");
                    return;
                }
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    newline(out, indent, level + 1);
                    deepnvme::json::push_string(out, k);
                    out.push(':');
                    if indent > 0 {
                        out.push(' ');
                    }
                    v.write(out, indent, level + 1);
                }
                newline(out, indent, level);
                out.push('}');
            }
        }
    }
}

fn newline(out: &mut String, indent: usize, level: usize) {
    if indent > 0 {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', indent * level));
    }
}


impl From<bool> for Json {
    fn from(v: bool) -> Json {
        Json::Bool(v)
    }
}
impl From<i64> for Json {
    fn from(v: i64) -> Json {
        Json::Int(v)
    }
}
impl From<u64> for Json {
    fn from(v: u64) -> Json {
        i64::try_from(v).map(Json::Int).unwrap_or(Json::Num(v as f64))
    }
}
impl From<usize> for Json {
    fn from(v: usize) -> Json {
        Json::from(v as u64)
    }
}
impl From<f64> for Json {
    fn from(v: f64) -> Json {
        Json::Num(v)
    }
}
impl From<&str> for Json {
    fn from(v: &str) -> Json {
        Json::Str(v.to_string())
    }
}
impl From<String> for Json {
    fn from(v: String) -> Json {
        Json::Str(v)
    }
}
impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(v: Option<T>) -> Json {
        v.map(Into::into).unwrap_or(Json::Null)
    }
}
impl<T: Into<Json>> From<Vec<T>> for Json {
    fn from(v: Vec<T>) -> Json {
        Json::Arr(v.into_iter().map(Into::into).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        let v = Json::object()
            .set("a", 1u64)
            .set("s", "q\"\\\n\u{1}")
            .set("x", vec![1.5, f64::NAN])
            .set("o", Json::object().set("t", true))
            .set("n", Json::Null);
        assert_eq!(v.render(0), r#"{"a":1,"s":"q\"\\\n\u0001","x":[1.5,null],"o":{"t":true},"n":null}"#);
        assert_eq!(Json::object().set("aio", Json::object().set("b", 1u64)).render(2), "{\n  \"aio\": {\n    \"b\": 1\n  }\n}");
        assert_eq!(Json::rounded(1.23456, 2), Json::Num(1.23));
    }
}
