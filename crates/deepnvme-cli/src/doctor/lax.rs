//! JSON values as DeepSpeed's Python code reads them, for the table of its
//! rules (`ds_rules`, `aio_rules`) and the config reader (`config`):
//! pydantic 2's lax-mode coercions, as DeepSpeed's models apply them
//! (`"8"`, `" 8"`, `8.0` and `true` are integers, the string `"1e8"` is
//! not; `"yes"`, `"off"`, `0.0` are booleans; `"auto"` keeps the default),
//! with pydantic's error kinds and messages; its numeric bounds; and
//! Python's own view of a value: its type's name and its truth.

use serde_json::Value;

/// A number's bounds, as pydantic's `Field(ge=..., gt=..., le=..., lt=...)`.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub gt: Option<f64>,
    pub ge: Option<f64>,
    pub lt: Option<f64>,
    pub le: Option<f64>,
}

pub const NONE: Bounds = Bounds { gt: None, ge: None, lt: None, le: None };
pub const GE0: Bounds = Bounds { ge: Some(0.0), ..NONE };
pub const GT0: Bounds = Bounds { gt: Some(0.0), ..NONE };
pub const UNIT: Bounds = Bounds { ge: Some(0.0), le: Some(1.0), ..NONE };
pub const OPEN_UNIT: Bounds = Bounds { gt: Some(0.0), lt: Some(1.0), ..NONE };

/// `"auto"` (exactly) is dropped by `DeepSpeedConfigModel.__init__`: the
/// field keeps its default (the HF Trainer's placeholder).
pub fn is_auto(v: &Value) -> bool {
    v.as_str() == Some("auto")
}

pub type Coerced<T> = Result<T, (&'static str, String)>;

/// An integer as pydantic reads one: a bool, a float without a fraction, or
/// a string of digits (whitespace, a sign, `_` between digits and a `.000`
/// fraction allowed; `1e8` is not).
pub fn lax_int(v: &Value) -> Coerced<i128> {
    const PARSING: &str = "Input should be a valid integer, unable to parse string as an integer";
    match v {
        Value::Bool(b) => Ok(*b as i128),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Ok(i as i128);
            }
            if let Some(u) = n.as_u64() {
                return Ok(u as i128);
            }
            let x = n.as_f64().unwrap_or(f64::NAN);
            if !x.is_finite() {
                Err(("finite_number", "Input should be a finite number".into()))
            } else if x.fract() != 0.0 {
                Err(("int_from_float", "Input should be a valid integer, got a number with a fractional part".into()))
            } else if x.abs() > i64::MAX as f64 {
                Err(("int_parsing_size", "Unable to parse input string as an integer, exceeded maximum size".into()))
            } else {
                Ok(x as i128)
            }
        }
        Value::String(s) => parse_int_str(s.trim()).ok_or(("int_parsing", PARSING.into())),
        _ => Err(("int_type", "Input should be a valid integer".into())),
    }
}

fn parse_int_str(t: &str) -> Option<i128> {
    let (neg, body) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    // A fraction is allowed when it is all zeros ("8.00"), not empty ("8.").
    let int = match body.split_once('.') {
        Some((i, f)) if !f.is_empty() && f.bytes().all(|c| c == b'0') => i,
        Some(_) => return None,
        None => body,
    };
    let b = int.as_bytes();
    if b.is_empty() || !b[0].is_ascii_digit() || !b[b.len() - 1].is_ascii_digit() {
        return None;
    }
    if b.windows(2).any(|w| w[0] == b'_' && w[1] == b'_') || !b.iter().all(|c| c.is_ascii_digit() || *c == b'_') {
        return None;
    }
    let digits: String = int.chars().filter(|c| *c != '_').collect();
    let n: i128 = digits.parse().ok()?;
    Some(if neg { -n } else { n })
}

/// A float as pydantic reads one: a number, a bool, or a string Python's
/// float() takes.
pub fn lax_float(v: &Value) -> Coerced<f64> {
    match v {
        Value::Bool(b) => Ok(*b as u8 as f64),
        Value::Number(n) => Ok(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => s.trim().parse::<f64>().map_err(|_| {
            ("float_parsing", "Input should be a valid number, unable to parse string as a number".into())
        }),
        _ => Err(("float_type", "Input should be a valid number".into())),
    }
}

/// A bool as pydantic reads one: true/false, 0/1 (int or float), or one of
/// its words in any case (no surrounding spaces).
pub fn lax_bool(v: &Value) -> Coerced<bool> {
    const PARSING: &str = "Input should be a valid boolean, unable to interpret input";
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(0), _) => Ok(false),
            (Some(1), _) => Ok(true),
            (Some(_), _) => Err(("bool_parsing", PARSING.into())),
            (None, Some(0.0)) => Ok(false),
            (None, Some(1.0)) => Ok(true),
            _ => Err(("bool_type", "Input should be a valid boolean".into())),
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            _ => Err(("bool_parsing", PARSING.into())),
        },
        _ => Err(("bool_type", "Input should be a valid boolean".into())),
    }
}

fn fmt_bound(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// pydantic checks le, lt, ge, gt in this order; NaN fails them all.
pub fn check_bounds(x: f64, b: &Bounds) -> Result<(), (&'static str, String)> {
    let checks = [
        (b.le, "less_than_equal", "less than or equal to", x <= b.le.unwrap_or(0.0)),
        (b.lt, "less_than", "less than", x < b.lt.unwrap_or(0.0)),
        (b.ge, "greater_than_equal", "greater than or equal to", x >= b.ge.unwrap_or(0.0)),
        (b.gt, "greater_than", "greater than", x > b.gt.unwrap_or(0.0)),
    ];
    for (bound, kind, words, holds) in checks {
        if let Some(v) = bound {
            if !holds {
                return Err((kind, format!("Input should be {words} {}", fmt_bound(v))));
            }
        }
    }
    Ok(())
}

/// Python's name for a JSON value's type, as DeepSpeed's messages show it.
pub fn python_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python's truth value of a JSON value.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lax_mode_coercions_are_pydantics() {
        for ok in
            [json!(8), json!("8"), json!(" 8"), json!("+8"), json!("8_000"), json!("8.00"), json!(8.0), json!(true)]
        {
            assert!(lax_int(&ok).is_ok(), "{ok}");
        }
        for bad in
            [json!("five"), json!("1e8"), json!("8."), json!("8.5"), json!(8.5), json!(""), json!(null), json!("0x10")]
        {
            assert!(lax_int(&bad).is_err(), "{bad}");
        }
        assert_eq!(lax_int(&json!(1e20)).unwrap_err().0, "int_parsing_size");
        for ok in ["yes", "Y", "on", "TRUE", "0", "f"] {
            assert!(lax_bool(&json!(ok)).is_ok(), "{ok}");
        }
        assert_eq!(lax_bool(&json!("yes")), Ok(true));
        assert_eq!(lax_bool(&json!(1.0)), Ok(true));
        for bad in [json!(" true"), json!("2"), json!(2), json!(0.5), json!(null), json!("1.0")] {
            assert!(lax_bool(&bad).is_err(), "{bad}");
        }
        assert_eq!(lax_float(&json!(" 0.5")), Ok(0.5));
        assert!(lax_float(&json!("")).is_err());
    }
}
