//! The `aio` block as DeepSpeed 0.19.8 hands it to `aio_handle(...)`, for
//! when the job's Python has no DeepSpeed to ask (`config_probe.py` calls
//! the real handle when it can). `get_aio_config` reads the block raw, so a
//! wrong type only fails when something builds the handle: ZeRO-3's NVMe
//! swappers, or FastPersist's checkpoint writer at `deepspeed.initialize`.
//! Checked here: `use_gds` needs DeepSpeed's CUDA accelerator; then the
//! types DeepSpeed's pybind11 binding converts (an `int`: no `"8"`, no
//! `1e6`); then the values the handle accepts (the core's own
//! `AioConfig::check`, as the handle says it: positive first).

use serde_json::Value;

use super::ds_rules::Violation;
use super::lax::{python_type, truthy};
use crate::runner::AioConfig;

/// The `aio` keys DeepSpeed reads (`swap_tensor/constants.py`), with how
/// the binding takes each.
pub const AIO_KEYS: [(&str, AioType); 6] = [
    ("block_size", AioType::Int),
    ("queue_depth", AioType::Int),
    ("intra_op_parallelism", AioType::Int),
    ("single_submit", AioType::Bool),
    ("overlap_events", AioType::Bool),
    ("use_gds", AioType::Flag),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AioType {
    /// A C++ `int` through pybind11: a Python int or bool in int's range.
    Int,
    /// A C++ `bool` through pybind11 (conversion allowed): None, bool, int
    /// or float, by truth value; a str or list is refused.
    Bool,
    /// Only tested for truth by DeepSpeed (`if aio_config[use_gds]`).
    Flag,
}

/// What to write for `key`, in words: "an integer", "true or false".
pub fn type_word(key: &str) -> &'static str {
    match AIO_KEYS.iter().find(|(k, _)| *k == key).map(|(_, t)| *t) {
        Some(AioType::Int) => "an integer",
        _ => "true or false",
    }
}

/// The `aio` block as `aio_handle(...)` gets it: each value raw (DeepSpeed
/// does not coerce), as DeepSpeed's binding converts it. `Err` is the
/// binding's refusal of that key.
pub fn aio_value(key: &str, v: &Value) -> Result<i64, String> {
    let ty = AIO_KEYS.iter().find(|(k, _)| *k == key).map(|(_, t)| *t).unwrap_or(AioType::Flag);
    let int_range = |i: i64| (i32::MIN as i64..=i32::MAX as i64).contains(&i);
    match (ty, v) {
        (AioType::Int, Value::Bool(b)) => Ok(*b as i64),
        (AioType::Int, Value::Number(n)) if n.as_i64().is_some_and(int_range) => Ok(n.as_i64().unwrap_or(0)),
        (AioType::Int, Value::Number(n)) if n.is_f64() => {
            Err(format!("{n} is a float (JSON numbers with a point or exponent are), and the binding takes an int"))
        }
        (AioType::Int, Value::Number(n)) => Err(format!("{n} does not fit a C int")),
        (AioType::Int, other) => Err(format!("{other} is a {}, and the binding takes an int", python_type(other))),
        (AioType::Bool, Value::String(_) | Value::Array(_) | Value::Object(_)) => {
            Err(format!("{v} is a {}, and the binding takes a bool (true or false)", python_type(v)))
        }
        (_, v) => Ok(truthy(v) as i64),
    }
}

/// The errors DeepSpeed raises on the config's `aio` block: `get_aio_config`'s
/// (`use_gds` without the CUDA accelerator, a block that is not an object),
/// then, when `creates_handle` (something builds `aio_handle`, not
/// `gds_handle`), the binding's and the handle's.
pub fn check(aio: Option<&Value>, creates_handle: bool, cuda_accelerator: bool) -> Vec<Violation> {
    let mut out = Vec::new();
    let loc = |k: &str| vec!["aio".to_string(), k.to_string()];
    let violation = |key: &str, kind: &str, msg: String, input: Option<&Value>| Violation {
        loc: loc(key),
        kind: kind.into(),
        msg,
        input: input.cloned(),
        fields: Vec::new(),
    };
    let a = match aio.filter(|a| !a.is_null()) {
        None => return out,
        Some(Value::Object(a)) => a,
        Some(other) => {
            out.push(Violation {
                loc: vec!["aio".into()],
                kind: "type_error".into(),
                msg: format!("AttributeError: '{}' object has no attribute 'get'", python_type(other)),
                input: Some(other.clone()),
                fields: Vec::new(),
            });
            return out;
        }
    };
    let use_gds = a.get("use_gds").is_some_and(truthy);
    if use_gds && !cuda_accelerator {
        out.push(violation(
            "use_gds",
            "assertion_error",
            "AssertionError: GDS currently only supported for CUDA accelerator".into(),
            a.get("use_gds"),
        ));
        return out;
    }
    if !creates_handle || use_gds {
        return out;
    }
    // aio_handle(...): the binding's types first, then the values.
    for (key, _) in AIO_KEYS.iter().filter(|(k, _)| *k != "use_gds") {
        if let Some(Err(why)) = a.get(*key).map(|v| aio_value(key, v)) {
            let msg = format!("TypeError: aio_handle(): incompatible constructor arguments: {key} = {why}");
            out.push(violation(key, "aio_handle", msg, a.get(*key)));
        }
    }
    if !out.is_empty() {
        return out;
    }
    let d = super::config::Aio::default();
    let given = |k: &str| a.get(k).and_then(|v| aio_value(k, v).ok());
    for key in ["block_size", "queue_depth", "intra_op_parallelism"] {
        // Each value alone against the defaults, as the probe names them.
        let one = |k: &str, def: usize| {
            if k == key {
                given(k).unwrap_or(def as i64).max(0) as usize
            } else {
                def
            }
        };
        let knobs = AioConfig {
            block_size: one("block_size", d.block_size),
            queue_depth: one("queue_depth", d.queue_depth),
            single_submit: false,
            overlap_events: true,
            parallelism: one("intra_op_parallelism", d.intra_op_parallelism),
        };
        let refused = match given(key) {
            Some(v) if v <= 0 => Some(format!("{key} must be positive, got {v}")),
            _ => knobs.check(None).err(),
        };
        if let Some(e) = refused {
            out.push(violation(key, "aio_handle", format!("RuntimeError: invalid argument: {e}"), a.get(key)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(aio: Value) -> Vec<String> {
        check(Some(&aio), true, false).iter().map(Violation::key).collect()
    }

    #[test]
    fn the_aio_block_as_aio_handle_takes_it() {
        assert_eq!(keys(json!({"queue_depth": 0})), ["aio.queue_depth"]);
        assert_eq!(keys(json!({"queue_depth": "8"})), ["aio.queue_depth"]);
        assert_eq!(keys(json!({"block_size": 1e6})), ["aio.block_size"]);
        assert_eq!(keys(json!({"intra_op_parallelism": 4097})), ["aio.intra_op_parallelism"]);
        assert!(keys(json!({"queue_depth": 8, "single_submit": 1, "overlap_events": null})).is_empty());
        assert_eq!(keys(json!({"single_submit": "yes"})), ["aio.single_submit"]);
        // No handle built: nothing to refuse but get_aio_config's own errors.
        assert!(check(Some(&json!({"queue_depth": 0})), false, false).is_empty());
        assert_eq!(check(Some(&json!([1])), false, false)[0].kind, "type_error");
        assert_eq!(keys(json!({"use_gds": true, "queue_depth": 0})), ["aio.use_gds"]);
        assert!(check(Some(&json!({"use_gds": true, "queue_depth": 0})), true, true).is_empty());
    }

    #[test]
    fn aio_values_as_the_binding_converts_them() {
        assert_eq!(aio_value("queue_depth", &json!(8)), Ok(8));
        assert_eq!(aio_value("queue_depth", &json!(true)), Ok(1));
        assert!(aio_value("queue_depth", &json!("8")).is_err());
        assert!(aio_value("block_size", &json!(1e6)).unwrap_err().contains("float"));
        assert!(aio_value("block_size", &json!(1u64 << 31)).is_err());
        assert_eq!(aio_value("single_submit", &json!(null)), Ok(0));
        assert_eq!(aio_value("single_submit", &json!(2)), Ok(1));
        assert!(aio_value("single_submit", &json!("yes")).is_err());
        assert_eq!(aio_value("use_gds", &json!("false")), Ok(1));
        assert_eq!((type_word("queue_depth"), type_word("single_submit")), ("an integer", "true or false"));
    }
}
