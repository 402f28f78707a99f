//! DeepSpeed 0.19.8's rules for the `zero_optimization` section, as a
//! table, for when the job's Python has no DeepSpeed to ask
//! (`config_probe.py` asks DeepSpeed itself when it can): the fields of
//! `DeepSpeedZeroConfig` and its nested models (`offload_param`,
//! `offload_optimizer`, `zenflow`, `leaf_module`) with their types, enums
//! and bounds, read with pydantic 2's lax-mode coercions (`lax`); unknown
//! keys refused (`extra="forbid"`), the model validators and the
//! deprecated-key checks, and the keys DeepSpeed removed. The `aio` block's
//! rules are `aio_rules`'; the models themselves, as data, are
//! `ds_zero_table`'s.
//!
//! Every fact here was read from DeepSpeed 0.19.8's models and checked by
//! running them; `tests/python/test_doctor.py` runs the same configs
//! through DeepSpeed and through this table and compares the verdicts.

use serde_json::{Map, Value};

use super::ds_zero_table::{Kind, Model, LEAF_MODULE, REMOVED_TOP_KEYS, REMOVED_ZERO_KEYS, ZENFLOW, ZERO};
use super::lax::{check_bounds, is_auto, lax_bool, lax_float, lax_int, python_type};

/// One error, in pydantic's terms so that DeepSpeed's own errors (from the
/// probe) and the table's render alike.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    /// Keys from the top of the config: `["zero_optimization", "offload_param", "device"]`.
    pub loc: Vec<String>,
    /// pydantic's error type (`enum`, `int_parsing`, `extra_forbidden`,
    /// `value_error`, ...), or `aio_handle`, `removed`, `not_a_mapping`.
    pub kind: String,
    pub msg: String,
    /// The value written, when there is one.
    pub input: Option<Value>,
    /// For `extra_forbidden`: the keys that object takes.
    pub fields: Vec<String>,
}

impl Violation {
    fn new(loc: &[String], kind: &str, msg: impl Into<String>, input: Option<&Value>) -> Violation {
        Violation { loc: loc.to_vec(), kind: kind.into(), msg: msg.into(), input: input.cloned(), fields: Vec::new() }
    }
    pub fn key(&self) -> String {
        self.loc.join(".")
    }
}

fn quoted_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        _ => format!("{} or {}", items[..items.len() - 1].join(", "), items[items.len() - 1]),
    }
}

/// A validated value the model validators look at.
#[derive(Clone, Debug, PartialEq)]
enum Val {
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Other,
}

struct Walk<'a> {
    out: &'a mut Vec<Violation>,
}

impl Walk<'_> {
    fn err(&mut self, loc: &[String], kind: &str, msg: impl Into<String>, input: Option<&Value>) {
        self.out.push(Violation::new(loc, kind, msg, input));
    }

    fn field(&mut self, loc: &[String], kind: Kind, v: &Value, optional: bool) -> Option<Val> {
        if v.is_null() && optional {
            return Some(Val::Other);
        }
        let before = self.out.len();
        let val = match kind {
            Kind::Bool => lax_bool(v).map(Val::Bool).map_err(|e| self.err(loc, e.0, e.1, Some(v))).ok(),
            Kind::Int(b) => match lax_int(v) {
                Ok(i) => match check_bounds(i as f64, &b) {
                    Ok(()) => Some(Val::Int(i)),
                    Err(e) => {
                        self.err(loc, e.0, e.1, Some(v));
                        None
                    }
                },
                Err(e) => {
                    self.err(loc, e.0, e.1, Some(v));
                    None
                }
            },
            Kind::Float(b) => match lax_float(v) {
                Ok(x) => match check_bounds(x, &b) {
                    Ok(()) => Some(Val::Float(x)),
                    Err(e) => {
                        self.err(loc, e.0, e.1, Some(v));
                        None
                    }
                },
                Err(e) => {
                    self.err(loc, e.0, e.1, Some(v));
                    None
                }
            },
            Kind::StrEnum(values) => match v.as_str().filter(|s| values.contains(s)) {
                Some(s) => Some(Val::Str(s.to_string())),
                None => {
                    let list: Vec<String> = values.iter().map(|s| format!("'{s}'")).collect();
                    self.err(loc, "enum", format!("Input should be {}", quoted_list(&list)), Some(v));
                    None
                }
            },
            Kind::IntEnum(values) => match lax_int(v).ok().filter(|i| values.iter().any(|x| *x as i128 == *i)) {
                Some(i) => Some(Val::Int(i)),
                None => {
                    let list: Vec<String> = values.iter().map(|s| s.to_string()).collect();
                    self.err(loc, "enum", format!("Input should be {}", quoted_list(&list)), Some(v));
                    None
                }
            },
            Kind::Path => match v {
                Value::String(s) => Some(Val::Str(s.clone())),
                _ => {
                    self.err(loc, "path_type", "Input is not a valid path", Some(v));
                    None
                }
            },
            Kind::Str => match v {
                Value::String(s) => Some(Val::Str(s.clone())),
                _ => {
                    self.err(loc, "string_type", "Input should be a valid string", Some(v));
                    None
                }
            },
            // A union: one error naming each branch's refusal, as the probe
            // merges pydantic's per-branch errors.
            Kind::StrOrInt => match v {
                Value::String(s) => Some(Val::Str(s.clone())),
                _ => match lax_int(v) {
                    Ok(i) => Some(Val::Int(i)),
                    Err((_, int)) => {
                        let msg = format!("str: Input should be a valid string; int: {int}");
                        self.err(loc, "string_type", msg, Some(v));
                        None
                    }
                },
            },
            Kind::StrList => match v {
                Value::String(_) => Some(Val::Other),
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        if !item.is_string() {
                            let mut l = loc.to_vec();
                            l.push(i.to_string());
                            self.err(&l, "string_type", "Input should be a valid string", Some(item));
                        }
                    }
                    Some(Val::Other)
                }
                _ => {
                    self.err(loc, "list_type", "Input should be a valid list", Some(v));
                    None
                }
            },
            Kind::Model(m) => {
                if std::ptr::eq(m, &LEAF_MODULE) && v.is_null() {
                    return Some(Val::Other);
                }
                match v {
                    Value::Object(obj) => {
                        self.model(loc, m, obj);
                        Some(Val::Other)
                    }
                    _ if std::ptr::eq(m, &LEAF_MODULE) => {
                        self.err(
                            loc,
                            "type_error",
                            "leaf_module configuration must be a mapping of fields to values",
                            Some(v),
                        );
                        None
                    }
                    _ => {
                        self.err(
                            loc,
                            "model_type",
                            format!("Input should be a valid dictionary or instance of {}", m.class),
                            Some(v),
                        );
                        None
                    }
                }
            }
        };
        if self.out.len() > before {
            None
        } else {
            val
        }
    }

    /// One model's fields; then, when they are all valid, its validators.
    /// Returns the values given (by field name) and the fields given.
    fn model(&mut self, loc: &[String], m: &'static Model, obj: &Map<String, Value>) -> Vec<(&'static str, Val)> {
        let before = self.out.len();
        let mut given = Vec::new();
        for (key, v) in obj {
            let mut l = loc.to_vec();
            l.push(key.clone());
            let field = m.fields.iter().find(|f| f.alias == Some(key.as_str()) || f.name == key);
            let Some(field) = field else {
                let mut e = Violation::new(&l, "extra_forbidden", "Extra inputs are not permitted", Some(v));
                e.fields = m.fields.iter().map(|f| f.alias.unwrap_or(f.name).to_string()).collect();
                self.out.push(e);
                continue;
            };
            // With both the alias and the name given, pydantic takes the
            // alias and calls the name an extra input.
            if field.alias.is_some() && key == field.name && obj.contains_key(field.alias.unwrap_or("")) {
                let mut e = Violation::new(&l, "extra_forbidden", "Extra inputs are not permitted", Some(v));
                e.fields = m.fields.iter().map(|f| f.alias.unwrap_or(f.name).to_string()).collect();
                self.out.push(e);
                continue;
            }
            if is_auto(v) {
                continue;
            }
            if let Some(val) = self.field(&l, field.kind, v, field.optional) {
                given.push((field.name, val));
            } else {
                given.push((field.name, Val::Other));
            }
        }
        if self.out.len() > before {
            return given;
        }
        if std::ptr::eq(m, &ZENFLOW) {
            self.zenflow(loc, &given);
        }
        given
    }

    fn zenflow(&mut self, loc: &[String], given: &[(&str, Val)]) {
        let get = |n: &str| given.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        let mut fail = |msg: &str| self.err(loc, "value_error", format!("Value error, {msg}"), None);
        if let Some(Val::Str(s)) = get("select_strategy") {
            if !["auto", "step", "epoch"].contains(&s.as_str()) {
                return fail("select_strategy must be one of \"auto\", \"step\", or \"epoch\"");
            }
        }
        if let Some(Val::Str(s)) = get("select_interval") {
            if s != "auto" {
                return fail("If select_interval is a string, it must be \"auto\"");
            }
        }
        match get("update_interval") {
            Some(Val::Str(s)) if s != "auto" => fail("If update_interval is a string, it must be \"auto\""),
            Some(Val::Int(i)) if i < 1 => fail("If update_interval is a number, it must be at least 1"),
            _ => {}
        }
    }
}

/// The errors DeepSpeed 0.19.8 raises on a config's keys and its
/// `zero_optimization` section: every removed key (DeepSpeed stops at the
/// first), then the section's model with those keys left out.
pub fn check(config: &Value) -> Vec<Violation> {
    let mut out = check_removed(config);
    out.extend(check_zero(config));
    out
}

/// The removed keys the config has, top-level first, in DeepSpeed's order,
/// each with DeepSpeed's whole message.
fn check_removed(config: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    let top = config.as_object();
    let zero = config.get("zero_optimization").and_then(Value::as_object);
    let blocks = [(top, REMOVED_TOP_KEYS, None), (zero, REMOVED_ZERO_KEYS, Some("zero_optimization"))];
    for (block, table, prefix) in blocks {
        let Some(obj) = block else { continue };
        for (key, msg) in table.iter().filter(|(k, _)| obj.contains_key(*k)) {
            let loc: Vec<String> = prefix.into_iter().chain([*key]).map(String::from).collect();
            out.push(Violation::new(&loc, "removed", format!("DeepSpeedConfigError: {msg}"), obj.get(*key)));
        }
    }
    out
}

/// The errors DeepSpeed 0.19.8 raises on the `zero_optimization` section's
/// model, as `DeepSpeedConfig` meets them: every field error at once, then
/// the first validator or deprecated-key check that fails.
fn check_zero(config: &Value) -> Vec<Violation> {
    let top = vec!["zero_optimization".to_string()];
    let mut out = Vec::new();
    let zero = match config.get("zero_optimization") {
        None => return out,
        Some(Value::Object(o)) => o.clone(),
        // The old format: `"zero_optimization": true` is stage 1, with the
        // top-level `allgather_size` as its bucket.
        Some(Value::Bool(b)) => {
            let mut o = Map::new();
            o.insert("stage".into(), Value::from(*b as u8));
            if *b {
                o.insert(
                    "allgather_bucket_size".into(),
                    config.get("allgather_size").cloned().unwrap_or(Value::from(500_000_000u64)),
                );
            }
            o
        }
        Some(other) => {
            out.push(Violation::new(
                &top,
                "not_a_mapping",
                format!(
                    "DeepSpeedZeroConfig(**zero_config_dict) raises TypeError: argument after ** must be a mapping, \
                     not {}",
                    python_type(other)
                ),
                Some(other),
            ));
            return out;
        }
    };
    // Removed keys are check_removed's findings; the rest is still checked.
    let mut zero = zero;
    for (key, _) in REMOVED_ZERO_KEYS {
        zero.remove(*key);
    }
    let given = Walk { out: &mut out }.model(&top, &ZERO, &zero);
    if !out.is_empty() {
        return out;
    }
    let get = |n: &str| given.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
    let stage = match get("stage") {
        Some(Val::Int(i)) => i,
        _ => 0,
    };
    // The model validators, in DeepSpeed's order.
    if get("compute_grad_norm") == Some(Val::Bool(false)) && !(stage == 1 || stage == 2) {
        out.push(Violation::new(
            &top,
            "value_error",
            "Value error, compute_grad_norm=false is supported only with ZeRO Stage 1 or 2",
            None,
        ));
        return out;
    }
    let ratio = zero
        .get("offload_optimizer")
        .and_then(|o| o.get("ratio"))
        .filter(|r| !is_auto(r))
        .and_then(|r| lax_float(r).ok());
    if ratio.is_some_and(|r| r < 1.0) && stage != 3 {
        out.push(Violation::new(
            &top,
            "assertion_error",
            "Assertion failed, Partial offloading only supported for ZeRO Stage 3.",
            None,
        ));
        return out;
    }
    // Deprecated keys set their replacement, which must not be given too.
    for field in ZERO.fields.iter().filter(|f| f.replaced_by.is_some()) {
        let new = field.replaced_by.unwrap_or("");
        let new_given = given.iter().any(|(k, _)| *k == new);
        if given.iter().any(|(k, _)| *k == field.name) && new_given {
            let mut loc = top.clone();
            loc.push(field.name.to_string());
            out.push(Violation::new(
                &loc,
                "deprecated",
                format!(
                    "AssertionError: Cannot provide deprecated parameter '{}' and replacing parameter '{new}' together",
                    field.name
                ),
                zero.get(field.name),
            ));
            return out;
        }
    }
    out
}
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(v: Value) -> Vec<String> {
        check(&json!({ "zero_optimization": v })).iter().map(Violation::key).collect()
    }

    #[test]
    fn the_issues_configs() {
        let nvme = |extra: Value| {
            let mut o = json!({"device": "nvme", "nvme_path": "/x"});
            o.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            json!({"stage": 3, "offload_param": o})
        };
        assert_eq!(
            keys(json!({"stage": 3, "offload_param": {"device": "NVMe"}})),
            ["zero_optimization.offload_param.device"]
        );
        assert_eq!(
            keys(json!({"stage": 3, "offload_param": {"device": "nvme "}})),
            ["zero_optimization.offload_param.device"]
        );
        assert_eq!(keys(nvme(json!({"buffer_count": "five"}))), ["zero_optimization.offload_param.buffer_count"]);
        assert!(keys(nvme(json!({"pin_memory": "yes", "buffer_count": "8", "buffer_size": 1e8}))).is_empty());
        assert!(keys(nvme(json!({"buffer_count": "auto"}))).is_empty());
        assert_eq!(keys(nvme(json!({"buffer_size": "1e8"}))), ["zero_optimization.offload_param.buffer_size"]);
        let e = check(&json!({"zero_optimization": nvme(json!({"thread_count": 2}))}));
        assert_eq!(e[0].kind, "extra_forbidden");
        assert!(e[0].fields.contains(&"buffer_count".to_string()));
    }

    #[test]
    fn validators_aliases_deprecations_and_removed_keys() {
        assert_eq!(keys(json!({"compute_grad_norm": false})), ["zero_optimization"]);
        assert!(keys(json!({"stage": 1, "compute_grad_norm": false})).is_empty());
        assert_eq!(keys(json!({"stage": 2, "offload_optimizer": {"ratio": "0.5"}})), ["zero_optimization"]);
        assert!(keys(json!({"stage3_prefetch_bucket_size": 5})).is_empty());
        assert!(keys(json!({"prefetch_bucket_size": 5})).is_empty());
        assert_eq!(
            keys(json!({"prefetch_bucket_size": 5, "stage3_prefetch_bucket_size": 6})),
            ["zero_optimization.prefetch_bucket_size"]
        );
        assert_eq!(
            keys(json!({"cpu_offload": false, "offload_optimizer": {"device": "cpu"}})),
            ["zero_optimization.cpu_offload"]
        );
        assert!(keys(json!({"cpu_offload": true})).is_empty());
        assert_eq!(keys(json!({"mics_shard_size": 2})), ["zero_optimization.mics_shard_size"]);
        assert_eq!(keys(json!({"stage": 4})), ["zero_optimization.stage"]);
        assert!(keys(json!({"stage": "3"})).is_empty());
        assert_eq!(keys(json!({"zenflow": {"update_interval": 0}})), ["zero_optimization.zenflow"]);
        let union = check(&json!({"zero_optimization": {"zenflow": {"select_interval": 2.5}}}));
        assert_eq!(union.len(), 1);
        assert_eq!(
            union[0].msg,
            "str: Input should be a valid string; int: Input should be a valid integer, got a number with a \
             fractional part"
        );
        assert!(keys(json!({"leaf_module": {"classes": "a"}})).is_empty());
        assert_eq!(keys(json!({"leaf_module": {"classes": [1]}})), ["zero_optimization.leaf_module.classes.0"]);
        assert_eq!(check(&json!({"zero_optimization": "x"}))[0].kind, "not_a_mapping");
        assert!(check(&json!({"zero_optimization": true})).is_empty());
    }

    #[test]
    fn removed_keys_first_with_deepspeeds_text_and_the_rest_still_checked() {
        let e = check(&json!({"zero_optimization": {"stage": 4, "mics_shard_size": 2}, "amp": {}, "nebula": null}));
        let keys: Vec<String> = e.iter().map(Violation::key).collect();
        assert_eq!(keys, ["nebula", "amp", "zero_optimization.mics_shard_size", "zero_optimization.stage"]);
        assert_eq!(e[1].kind, "removed");
        assert!(e[1].msg.starts_with("DeepSpeedConfigError: NVIDIA Apex AMP integration has been removed. Use"));
        assert!(e[1].msg.ends_with("instead. See https://github.com/deepspeedai/DeepSpeed/issues/8489."));
        assert!(e[2].msg.contains("'zero_optimization.mics_shard_size' is no longer supported. See https://"));
        let elastic = &check(&json!({"elasticity": {}}))[0];
        assert!(elastic.msg.ends_with("gradient_accumulation_steps directly. "), "{}", elastic.msg);
    }
}
