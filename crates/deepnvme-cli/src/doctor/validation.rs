//! The `config` section: what the DeepSpeed config asks for, and whether
//! DeepSpeed takes it. Where the job's Python has DeepSpeed, its own code
//! decides (`config_probe.py`: `DeepSpeedZeroConfig`, `get_aio_config`, and
//! `aio_handle(...)` called as the swappers call it); otherwise the tables
//! of DeepSpeed 0.19.8's rules in `ds_rules` and `aio_rules`. Each error is
//! a FAIL naming the key, DeepSpeed's message and what to write instead. A
//! value DeepSpeed accepts is never one (`"yes"` for a bool, `"8"` for an
//! int, `"auto"`).
//! Also here: an NVMe offload without `nvme_path` (DeepSpeed fails when the
//! swapper starts), and what DeepSpeed accepts but ignores.

use std::path::Path;

use serde_json::Value;

use super::aio_rules;
use super::config::read::{self, Duplicate, How};
use super::config::{DsConfig, NvmeOffload};
use super::ds_rules::{self, Violation};
use super::report::{Finding, Status};
use super::Context;

const SECTION: &str = "config";

/// Who decided: DeepSpeed itself, or the table.
enum Source {
    DeepSpeed { version: String, python: String, handle: Option<String> },
    Table { why: String },
}

impl Source {
    fn why(&self) -> String {
        match self {
            Source::DeepSpeed { version, python, .. } => format!(
                "DeepSpeed {version}'s own validation in {python} (DeepSpeedZeroConfig, get_aio_config, as \
                 deepspeed.initialize runs them) refuses it, so the job stops before training"
            ),
            Source::Table { why } => format!(
                "DeepSpeed 0.19.8 refuses it (the doctor's table of its rules: {why}), so deepspeed.initialize \
                 stops the job before training"
            ),
        }
    }
}

/// DeepSpeed's errors from the probe, when it ran with DeepSpeed.
fn from_probe(ctx: &Context) -> Result<(Source, Vec<Violation>, Option<bool>), String> {
    let p = ctx.python_probe().as_ref().map_err(|e| format!("the job's Python gave no report: {e}"))?;
    let python = p.python.display().to_string();
    if let Some(e) = p.raw.get("config_check_error").and_then(Value::as_str) {
        return Err(format!("DeepSpeed's validation could not run in {python}: {e}"));
    }
    let check = p.raw.get("config_check").ok_or_else(|| format!("{python} reported no config check"))?;
    if let Some(e) = check.get("read_error").and_then(Value::as_str) {
        return Err(format!("DeepSpeed's reader in {python} refuses the file ({e})"));
    }
    let Some(version) = check.get("deepspeed").and_then(Value::as_str) else {
        return Err(format!("no deepspeed in {python}"));
    };
    let errors = check.get("errors").and_then(Value::as_array).cloned().unwrap_or_default();
    let violations = errors
        .iter()
        .map(|e| Violation {
            loc: e["loc"]
                .as_array()
                .map(|l| l.iter().filter_map(Value::as_str).map(String::from).collect())
                .unwrap_or_default(),
            kind: e["kind"].as_str().unwrap_or("").to_string(),
            msg: e["msg"].as_str().unwrap_or("").to_string(),
            input: e.get("input").filter(|v| !v.is_null()).cloned(),
            fields: e["fields"]
                .as_array()
                .map(|l| l.iter().filter_map(Value::as_str).map(String::from).collect())
                .unwrap_or_default(),
        })
        .collect();
    let handle = check.get("aio_handle");
    let tried = handle.and_then(|h| h.get("tried")).and_then(Value::as_bool);
    let note = handle.and_then(|h| h.get("op").or(h.get("why_not"))).and_then(Value::as_str).map(String::from);
    Ok((Source::DeepSpeed { version: version.to_string(), python, handle: note }, violations, tried))
}

/// Whether DeepSpeed would pick its CUDA accelerator here: `DS_ACCELERATOR`,
/// else whether there is a GPU (DeepSpeed asks torch.cuda), as the gds
/// section sees it.
fn cuda_accelerator() -> bool {
    match std::env::var("DS_ACCELERATOR") {
        Ok(a) if !a.is_empty() => a == "cuda",
        _ => super::gds::has_gpu(),
    }
}

/// The table's errors: removed keys and `zero_optimization`, then the `aio` block.
fn from_table(cfg: &DsConfig) -> Vec<Violation> {
    let mut out = ds_rules::check(&cfg.raw);
    // Checked even when zero_optimization has errors (DeepSpeed would stop
    // there first): every error in one run.
    let creates_handle = !cfg.aio_handle_users().is_empty();
    out.extend(aio_rules::check(cfg.raw.get("aio"), creates_handle, cuda_accelerator()));
    out
}

/// The closest of `fields` to `key` (ignoring case and `-`/`_`): within two
/// edits, or one edit in five letters.
fn nearest<'a>(key: &str, fields: &'a [String]) -> Option<&'a str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    let k = norm(key);
    let distance = |a: &str, b: &str| {
        let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for i in 1..=a.len() {
            let mut prev = row[0];
            row[0] = i;
            for j in 1..=b.len() {
                let cur = row[j];
                row[j] = (row[j] + 1).min(row[j - 1] + 1).min(prev + usize::from(a[i - 1] != b[j - 1]));
                prev = cur;
            }
        }
        row[b.len()]
    };
    fields
        .iter()
        .map(|f| (distance(&k, &norm(f)), f))
        .filter(|(d, f)| (*d <= 2 && *d < f.len() / 2) || *d * 5 <= f.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f.as_str())
}

/// What to write instead, from the kind of error.
fn fix_for(v: &Violation, config: &Path) -> String {
    let key = v.key();
    let last = v.loc.last().map(String::as_str).unwrap_or("");
    let file = config.display();
    match v.kind.as_str() {
        "enum" if last == "device" => {
            format!("write \"device\": \"nvme\" (or \"cpu\", \"none\"): lowercase, no spaces, in {file}")
        }
        "enum" => format!("use one of the values the message lists for {key}"),
        "int_parsing" | "int_type" | "int_from_float" | "int_parsing_size" | "finite_number" => format!(
            "write {key} as a whole number (a JSON number such as 5 or 1e8, or a string of digits), or \"auto\" \
             for DeepSpeed's default"
        ),
        "bool_parsing" | "bool_type" => format!("write {key} as true or false"),
        "float_parsing" | "float_type" => format!("write {key} as a number"),
        "greater_than_equal" | "greater_than" | "less_than_equal" | "less_than" => {
            format!("bring {key} into range ({})", v.msg.trim_start_matches("Input should be "))
        }
        "extra_forbidden" => {
            let hint = nearest(last, &v.fields).map(|n| format!("did you mean \"{n}\"? ")).unwrap_or_default();
            format!(
                "{hint}remove or rename {key}: DeepSpeed refuses keys it does not know here{}",
                if v.fields.is_empty() { String::new() } else { format!(" (it takes: {})", v.fields.join(", ")) }
            )
        }
        "model_type" | "not_a_mapping" => format!("make {key} a JSON object ({{...}}), or remove it"),
        "path_type" => format!("write {key} as a folder path string"),
        "string_type" | "list_type" => format!("write {key} as the message asks"),
        "removed" => format!("remove {key}: DeepSpeed 0.19.8 no longer has it"),
        "deprecated" => format!("remove the deprecated {key}; keep the key that replaces it"),
        "assertion_error" if key == "aio.use_gds" => {
            "no CUDA accelerator here (no GPU, or DS_ACCELERATOR names another): set \"use_gds\": false in the aio \
             block, or run where DeepSpeed finds a GPU"
                .into()
        }
        "aio_handle" if v.msg.contains("TypeError") => {
            format!("write {key} as {} (a JSON number without a point, or true/false)", aio_rules::type_word(last))
        }
        "aio_handle" => format!(
            "give {key} a value aio_handle accepts: {}",
            v.msg.trim_start_matches("RuntimeError: invalid argument: ")
        ),
        _ if v.msg.contains("compute_grad_norm") => {
            "set compute_grad_norm true (the default), or use ZeRO stage 1 or 2".into()
        }
        _ if v.msg.contains("Partial offloading") => {
            "set offload_optimizer.ratio to 1.0, or use ZeRO stage 3 for partial offload".into()
        }
        _ => format!("edit {key} in {file} as DeepSpeed's message says"),
    }
}

fn violation_finding(v: &Violation, source: &Source, cfg: &DsConfig) -> Finding {
    let key = v.key();
    let input = v.input.as_ref().map(|i| format!(" = {i}")).unwrap_or_default();
    let check = if v.kind == "aio_handle" { "aio_handle" } else { "validation" };
    let why = if v.kind == "aio_handle" {
        let users = cfg.aio_handle_users();
        format!(
            "DeepSpeed reads the aio block as written and passes it to aio_handle(...), which refuses it, when {} \
             build{} one; {}",
            if users.is_empty() { "a swapper".to_string() } else { users.join(" and ") },
            if users.len() == 1 { "s" } else { "" },
            match source {
                Source::DeepSpeed { handle: Some(op), .. } => format!("called with it here, {op} raised"),
                _ if cfg.fast_writer() => "the job dies in deepspeed.initialize".to_string(),
                _ => "the job dies when DeepSpeed initializes ZeRO-3".to_string(),
            }
        )
    } else {
        source.why()
    };
    Finding::fail(SECTION, check, format!("DeepSpeed refuses {key}{input}: {}", v.msg))
        .why(why)
        .fix(fix_for(v, &cfg.path))
        .key(key)
}

/// How the file was read, when it is not plain JSON.
fn read_finding(cfg: &DsConfig) -> Option<Finding> {
    let how = match &cfg.how {
        How::Json => return None,
        How::JsonWithComments => "JSON with comments or trailing commas (read here as hjson reads them)".to_string(),
        How::Hjson(python) => format!("hjson, read by DeepSpeed's own reader in {}", python.display()),
    };
    Some(Finding::ok(SECTION, "read", format!("{} is {how}", cfg.path.display())).why(
        "deepspeed.initialize(config=path) reads the file with hjson, which takes it; a script that reads it \
             with json.load and passes the dict refuses it",
    ))
}

/// A key given twice in one object: DeepSpeed's duplicate-key hook refuses the file.
fn duplicate_finding(d: &Duplicate, cfg: &DsConfig, by: &str) -> Finding {
    let file = cfg.path.display();
    let within =
        if d.object.is_empty() { "at the top level".to_string() } else { format!("in {}", d.object.join(".")) };
    let keys = d.paths();
    Finding::fail(SECTION, "duplicate keys", format!("DeepSpeed refuses {file}: {} ({within})", d.message))
        .why(format!(
            "DeepSpeedConfig reads the file with hjson.load(..., object_pairs_hook=dict_raise_error_on_duplicate_keys), \
             which raises ValueError, so deepspeed.initialize stops before training ({by}); the doctor checked the \
             rest with each key's last value"
        ))
        .fix(format!("keep one of each of {} in {file} (merge the blocks if both hold settings)", keys.join(", ")))
        .key(keys.join(", "))
}

/// Whether two readings differ; `at` is then the first key where they do.
fn first_difference(a: &Value, b: &Value, at: &mut Vec<String>) -> bool {
    let mut differs_at = |k: String, p: Option<&Value>, q: Option<&Value>| {
        at.push(k);
        let differs = match (p, q) {
            (Some(p), Some(q)) => first_difference(p, q, at),
            _ => true,
        };
        if !differs {
            at.pop();
        }
        differs
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.keys().chain(y.keys()).any(|k| differs_at(k.clone(), x.get(k), y.get(k)))
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().any(|(i, (p, q))| differs_at(i.to_string(), Some(p), Some(q)))
        }
        _ => a != b,
    }
}

/// DeepSpeed's own reading of the file in the job's Python (the probe),
/// against the doctor's: what it refuses that the doctor read.
fn deepspeed_reading(ctx: &Context, cfg: &DsConfig) -> Vec<Finding> {
    let Some(p) = ctx.python() else { return Vec::new() };
    let Some(check) = p.raw.get("config_check") else { return Vec::new() };
    let python = p.python.display().to_string();
    let file = cfg.path.display();
    if let Some(e) = check.get("read_error").and_then(Value::as_str) {
        return vec![Finding::fail(SECTION, "read", format!("DeepSpeed's reader refuses {file}: {e}"))
            .why(format!(
                "deepspeed.initialize reads the file with hjson.load (DeepSpeed's duplicate-key hook) in {python}, \
                 which raises; the doctor's own reading took it, and the checks here use that"
            ))
            .fix(format!("edit {file} so that it is plain JSON"))];
    }
    let Some(found) = check.get("read") else { return Vec::new() };
    let mut out = Vec::new();
    if cfg.duplicates.is_empty() {
        for d in read::duplicates_of(found) {
            out.push(duplicate_finding(&d, cfg, &format!("DeepSpeed's reader in {python} says so")));
        }
    }
    // hjson makes a whole 1e8 or 8.0 an int; the rest must agree.
    let (mut mine, mut theirs) = (cfg.raw.clone(), found.get("config").cloned().unwrap_or_default());
    read::hjson_numbers(&mut mine);
    read::hjson_numbers(&mut theirs);
    let mut at = Vec::new();
    if first_difference(&mine, &theirs, &mut at) {
        let key = if at.is_empty() { "the top level".to_string() } else { at.join(".") };
        out.push(
            Finding::warn(SECTION, "read", format!("DeepSpeed's reader in {python} reads {key} of {file} otherwise"))
                .why(format!(
                    "the doctor read the file as {}; hjson has {}, the doctor {}: the checks of other sections \
                     used the doctor's",
                    match &cfg.how {
                        How::Json => "JSON",
                        How::JsonWithComments => "JSON with comments",
                        How::Hjson(_) => "hjson",
                    },
                    value_at(&theirs, &at),
                    value_at(&mine, &at)
                ))
                .fix(format!("write {key} as plain JSON in {file}"))
                .key(key),
        );
    }
    out
}

fn value_at(v: &Value, at: &[String]) -> String {
    let mut v = Some(v);
    for k in at {
        v = v.and_then(
            |x| if let Value::Array(a) = x { k.parse().ok().and_then(|i: usize| a.get(i)) } else { x.get(k) },
        );
    }
    v.map_or("nothing".to_string(), Value::to_string)
}

/// The summary of what the config asks for.
fn offload_finding(cfg: &DsConfig) -> Finding {
    let offload = |name: &str, o: &Option<NvmeOffload>| match o {
        Some(o) => format!(
            "{name} to {} ({} buffers{})",
            o.nvme_path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "?".into()),
            o.buffer_count,
            if name == "parameters" { format!(" of {} elements", o.buffer_size) } else { String::new() }
        ),
        None => format!("{name} not to NVMe"),
    };
    let a = &cfg.aio;
    let f = Finding::ok(
        SECTION,
        "offload",
        format!(
            "ZeRO stage {}: {}; {}",
            cfg.stage.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
            offload("parameters", &cfg.param),
            offload("optimizer state", &cfg.optimizer)
        ),
    )
    .why(format!(
        "aio{}: block_size {}, queue_depth {}, intra_op_parallelism {}, single_submit {}, overlap_events {}, \
         use_gds {}; model dtype {}",
        if cfg.aio_given { "" } else { " (no block: DeepSpeed's defaults)" },
        a.block_size,
        a.queue_depth,
        a.intra_op_parallelism,
        a.single_submit,
        a.overlap_events,
        a.use_gds,
        cfg.model_dtype
    ));
    if cfg.swaps() {
        f
    } else if cfg.fast_writer() {
        let why = format!("{}; no ZeRO offload to NVMe: FastPersist writes the checkpoints through aio", f.why);
        f.why(why)
    } else {
        let mut f = f.why("nothing goes to NVMe: no offload_param or offload_optimizer has device nvme");
        f.status = Status::Warn;
        f.fix("set \"device\": \"nvme\" and \"nvme_path\" in zero_optimization.offload_param or offload_optimizer")
    }
}

/// NVMe offload without a folder: DeepSpeed accepts the config, then the
/// swapper fails when it starts.
fn missing_paths(cfg: &DsConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    if cfg.stage != Some(3) {
        return out;
    }
    for o in cfg.offloads().filter(|o| o.nvme_path.is_none()) {
        let why = if o.block.ends_with("offload_param") {
            "zero.Init asserts it: \"nvme_path\" in DeepSpeed Config cannot be None if remote device is nvme"
        } else {
            "stage3.py's _configure_tensor_swapping calls os.path.join(nvme_path, 'zero_stage_3'): TypeError, \
             expected str, bytes or os.PathLike object, not NoneType"
        };
        out.push(
            Finding::fail(SECTION, "nvme_path", format!("{} has device nvme but no nvme_path", o.block))
                .why(format!("DeepSpeed accepts the config, then fails when the swapper starts: {why}"))
                .fix(format!("add \"nvme_path\": \"/path/on/the/nvme/drive\" to {}", o.block))
                .key(o.path_key()),
        );
    }
    out
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    let Some(cfg) = ctx.config.as_ref() else { return Vec::new() };
    let mut out: Vec<Finding> = read_finding(cfg).into_iter().collect();
    for d in &cfg.duplicates {
        out.push(duplicate_finding(d, cfg, "found by the doctor's own reading"));
    }
    out.push(offload_finding(cfg));
    let (source, violations, handle_tried) = match from_probe(ctx) {
        Ok(found) => found,
        Err(why) => (Source::Table { why }, from_table(cfg), None),
    };
    out.extend(deepspeed_reading(ctx, cfg));
    for v in &violations {
        out.push(violation_finding(v, &source, cfg));
    }
    if violations.is_empty() {
        let what = match &source {
            Source::DeepSpeed { version, python, handle } => format!(
                "DeepSpeed {version} in {python} accepts zero_optimization and aio{}",
                match (handle_tried, handle) {
                    (Some(true), Some(op)) => format!(", and {op}.aio_handle(...) takes the aio block"),
                    (_, Some(why)) => format!(" (aio_handle not tried: {why})"),
                    _ => String::new(),
                }
            ),
            Source::Table { why } => format!(
                "zero_optimization and aio follow DeepSpeed 0.19.8's rules (the doctor's table; {why}: pass \
                 --python with the job's Python to ask DeepSpeed itself)"
            ),
        };
        out.push(Finding::ok(SECTION, "validation", what));
    }
    out.extend(missing_paths(cfg));
    if cfg.fast_writer() {
        out.push(
            Finding::ok(SECTION, "checkpoint writer", "FastPersist (checkpoint.writer type fast) writes through aio")
                .why(
                    "its folder is save_checkpoint()'s argument, not in the config: pass it as another --dir to \
                     check it like nvme_path",
                )
                .key("checkpoint.writer"),
        );
    }
    for note in &cfg.notes {
        out.push(
            Finding::warn(SECTION, "ignored", note.clone())
                .why("DeepSpeed accepts it but does not do what it says")
                .fix(format!("edit {}", cfg.path.display())),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn table(v: Value) -> Vec<Violation> {
        from_table(&DsConfig::from_value(Path::new("ds.json"), &v))
    }

    #[test]
    fn the_aio_block_is_checked_when_a_swapper_makes_a_handle() {
        let nvme = json!({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"}});
        let keys = |v: Value| table(v).iter().map(Violation::key).collect::<Vec<_>>();
        assert_eq!(keys(json!({"zero_optimization": nvme, "aio": {"queue_depth": 0}})), ["aio.queue_depth"]);
        // Nothing swaps: no aio_handle, so nothing to refuse; FastPersist's writer builds one.
        assert!(table(json!({"aio": {"queue_depth": 0}})).is_empty());
        let fast = json!({"checkpoint": {"writer": {"type": "fast"}}, "aio": {"queue_depth": 0}});
        assert_eq!(keys(fast), ["aio.queue_depth"]);
        assert_eq!(table(json!({"aio": [1]}))[0].kind, "type_error");
    }

    #[test]
    fn readings_that_differ_name_the_first_key() {
        let mut at = Vec::new();
        let a = json!({"a": {"b": [1, {"c": 2}]}, "d": 1});
        assert!(!first_difference(&a, &a.clone(), &mut at) && at.is_empty());
        assert!(first_difference(&a, &json!({"a": {"b": [1, {"c": 3}]}, "d": 1}), &mut at));
        assert_eq!(at, ["a", "b", "1", "c"]);
        let mut at = Vec::new();
        assert!(first_difference(&a, &json!({"a": {"b": [1, {"c": 2}]}}), &mut at));
        assert_eq!(at, ["d"]);
    }

    #[test]
    fn fixes_name_what_to_write() {
        let v = &table(json!({"zero_optimization": {"stage": 3, "offload_param": {"device": "NVMe"}}}))[0];
        assert!(fix_for(v, Path::new("c.json")).contains("\"device\": \"nvme\""));
        let v = &table(json!({"zero_optimization": {"stage": 3, "offload_param": {"buffer_cnt": 4}}}))[0];
        assert!(
            fix_for(v, Path::new("c.json")).contains("did you mean \"buffer_count\""),
            "{}",
            fix_for(v, Path::new("c"))
        );
        assert_eq!(
            nearest("stage3_max_live_params", &["stage3_max_live_parameters".into()]),
            Some("stage3_max_live_parameters")
        );
        assert_eq!(nearest("zzz", &["stage".into()]), None);
    }
}
