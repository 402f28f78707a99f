//! `deepnvme doctor` against DeepSpeed configs broken the ways users break
//! them, checked by the doctor's table of DeepSpeed 0.19.8's rules (`--python
//! /bin/false`: no DeepSpeed to ask; tests/python/test_doctor.py runs the
//! same configs through DeepSpeed itself and compares): a device spelled
//! "NVMe" or "nvme ", a buffer_count of "five", an aio block aio_handle
//! refuses (queue_depth 0 or "8"), NVMe offload without nvme_path, use_gds
//! without a GPU; values DeepSpeed accepts ("yes", "8", "auto") are no
//! finding. Then the swap buffers against the model (DeepSpeed #3506,
//! #3062), and the exit codes: 0, 1, and 2 when the doctor could not run,
//! with stdout one JSON document under --json in every case.

mod common;

use std::path::Path;

use common::doctor::*;
use common::*;
use serde_json::{json, Value};

/// `doctor --only config --json` on `cfg` written in `dir`, with the table.
fn validate(dir: &Path, cfg: &Value) -> (Value, Option<i32>) {
    let path = write_json(dir, "ds.json", cfg);
    let mut cmd = doctor_in(dir, &["--json", "--only", "config", "--python", "/bin/false", "--config"]);
    cmd.arg(&path);
    let (j, code, _) = run(cmd);
    (j, code)
}

/// A stage-3 config offloading parameters to `dir` with `param` merged in.
fn params(dir: &Path, param: Value, aio: Value) -> Value {
    let mut p = json!({"device": "nvme", "nvme_path": dir});
    p.as_object_mut().unwrap().extend(param.as_object().unwrap().clone());
    json!({"zero_optimization": {"stage": 3, "offload_param": p}, "aio": aio})
}

#[test]
fn what_deepspeed_refuses_fails_with_its_reason_and_the_key() {
    let dir = TempDir::new("doctor-validate");
    let d = &dir.0;
    for device in ["NVMe", "nvme "] {
        let (j, code) = validate(d, &params(d, json!({"device": device}), json!({})));
        let f = finding_at(&j, "config", "validation", "zero_optimization.offload_param.device");
        expect(
            f,
            "fail",
            &["Input should be 'none', 'cpu' or 'nvme'", device, "DeepSpeed 0.19.8 refuses it"],
            &["\"device\": \"nvme\"", "lowercase"],
        );
        assert_eq!(code, Some(1));
    }
    // Every error in one run: the aio block too, though DeepSpeed stops at the first.
    let (j, _) = validate(d, &params(d, json!({"device": "NVMe"}), json!({"queue_depth": 0})));
    expect(finding_at(&j, "config", "aio_handle", "aio.queue_depth"), "fail", &["must be positive"], &[]);
    let (j, code) = validate(d, &params(d, json!({"buffer_count": "five"}), json!({})));
    let f = finding_at(&j, "config", "validation", "zero_optimization.offload_param.buffer_count");
    expect(f, "fail", &["\"five\"", "valid integer"], &["whole number"]);
    assert_eq!(code, Some(1));
    // A key DeepSpeed does not know, with the one meant.
    let (j, _) = validate(d, &params(d, json!({"buffer_cnt": 4}), json!({})));
    let f = finding_at(&j, "config", "validation", "zero_optimization.offload_param.buffer_cnt");
    expect(f, "fail", &["Extra inputs are not permitted"], &["did you mean \"buffer_count\""]);
}

#[test]
fn what_deepspeed_accepts_is_no_finding() {
    let dir = TempDir::new("doctor-accept");
    let d = &dir.0;
    let cfg = params(
        d,
        json!({"pin_memory": "yes", "buffer_count": "8", "buffer_size": 1e8, "max_in_cpu": "auto"}),
        json!({"queue_depth": 8, "single_submit": 1, "overlap_events": null}),
    );
    let mut cfg = cfg;
    cfg["checkpoint"] = json!({"writer": {"type": "fast"}});
    let (j, code) = validate(d, &cfg);
    assert!(problems(&j).is_empty(), "{:#?}", problems(&j));
    expect(finding(&j, "config", "validation"), "ok", &["follow DeepSpeed 0.19.8's rules"], &[]);
    // FastPersist's folder is save_checkpoint()'s argument: the finding says to pass it.
    expect(finding(&j, "config", "checkpoint writer"), "ok", &["another --dir"], &[]);
    expect(finding(&j, "config", "offload"), "ok", &["8 buffers"], &[]);
    assert_eq!(code, Some(0));
}

#[test]
fn an_aio_block_aio_handle_refuses_fails() {
    let dir = TempDir::new("doctor-aio");
    let d = &dir.0;
    let (j, code) = validate(d, &params(d, json!({}), json!({"queue_depth": 0})));
    let f = finding_at(&j, "config", "aio_handle", "aio.queue_depth");
    expect(f, "fail", &["queue_depth must be positive", "aio_handle(...)"], &["aio.queue_depth"]);
    assert_eq!(code, Some(1));
    let (j, _) = validate(d, &params(d, json!({}), json!({"queue_depth": "8", "block_size": 1e6})));
    expect(finding_at(&j, "config", "aio_handle", "aio.queue_depth"), "fail", &["\"8\" is a str"], &["an integer"]);
    expect(finding_at(&j, "config", "aio_handle", "aio.block_size"), "fail", &["is a float"], &["an integer"]);
    // Without NVMe offload no aio_handle is made: nothing to refuse.
    let (j, code) = validate(d, &json!({"zero_optimization": {"stage": 3}, "aio": {"queue_depth": 0}}));
    assert!(findings(&j, "config", "aio_handle").is_empty(), "{j:#}");
    assert_eq!(code, Some(0));
}

/// FastPersist (`checkpoint.writer.type: fast`) builds aio_handle(...)
/// from the aio block at deepspeed.initialize, with no NVMe offload at all.
#[test]
fn a_fastpersist_writer_checks_the_aio_block() {
    let dir = TempDir::new("doctor-fastpersist");
    let d = &dir.0;
    let fast = |aio: Value, kind: &str| {
        let writer = json!({ "type": kind });
        json!({"zero_optimization": {"stage": 2}, "checkpoint": {"writer": writer}, "aio": aio})
    };
    let (j, code) = validate(d, &fast(json!({"queue_depth": 0}), "fast"));
    let f = finding_at(&j, "config", "aio_handle", "aio.queue_depth");
    expect(f, "fail", &["queue_depth must be positive", "FastPersist"], &["aio.queue_depth"]);
    assert_eq!(code, Some(1));
    // Any case DeepSpeed upper-cases; a writer block without a type is FAST too.
    let (j, _) = validate(d, &fast(json!({"block_size": "1M"}), "Fast"));
    expect(finding_at(&j, "config", "aio_handle", "aio.block_size"), "fail", &["is a str"], &["an integer"]);
    let (j, _) = validate(
        d,
        &json!({"zero_optimization": {"stage": 2}, "checkpoint": {"writer": {}}, "aio": {"queue_depth": 0}}),
    );
    expect(finding_at(&j, "config", "aio_handle", "aio.queue_depth"), "fail", &[], &[]);
    // The python writer (and a null type: no writer DeepSpeed builds) makes no handle.
    for kind in [json!("python"), json!(null)] {
        let cfg = json!({"zero_optimization": {"stage": 2}, "checkpoint": {"writer": {"type": kind}},
            "aio": {"queue_depth": 0}});
        let (j, code) = validate(d, &cfg);
        assert!(findings(&j, "config", "aio_handle").is_empty(), "{kind}: {j:#}");
        assert_eq!(code, Some(0), "{kind}");
    }
}

/// A healthy FastPersist config that offloads nothing: its aio goes to the
/// checkpoint folder, so "nothing goes to NVMe" is no warning.
#[test]
fn a_fastpersist_config_without_offload_is_ok() {
    let dir = TempDir::new("doctor-fastpersist-ok");
    let cfg = json!({"zero_optimization": {"stage": 2}, "checkpoint": {"writer": {"type": "fast"}},
        "aio": {"queue_depth": 8}});
    let (j, code) = validate(&dir.0, &cfg);
    expect(finding(&j, "config", "offload"), "ok", &["FastPersist"], &[]);
    assert!(problems(&j).is_empty(), "{:#?}", problems(&j));
    assert_eq!(code, Some(0));
}

/// Keys DeepSpeed 0.19.8 removed, at the top of the config: it refuses them
/// before anything else, with its own text and the issue it links.
#[test]
fn removed_top_level_keys_fail_with_deepspeeds_text() {
    let dir = TempDir::new("doctor-removed");
    let d = &dir.0;
    let (j, code) = validate(d, &json!({"amp": {"enabled": true}, "zero_optimization": {"stage": 3}}));
    let f = finding_at(&j, "config", "validation", "amp");
    expect(
        f,
        "fail",
        &["DeepSpeedConfigError: NVIDIA Apex AMP integration has been removed. Use DeepSpeed 'fp16', 'bf16', or \
             'torch_autocast' instead. See https://github.com/deepspeedai/DeepSpeed/issues/8489."],
        &["remove amp"],
    );
    assert_eq!(code, Some(1));
    for key in ["elasticity", "sparse_attention", "curriculum_learning", "nebula", "progressive_layer_drop"] {
        let (j, code) = validate(d, &json!({ key: null }));
        let f = finding_at(&j, "config", "validation", key);
        expect(f, "fail", &["DeepSpeedConfigError", "has been removed"], &[&format!("remove {key}")]);
        assert_eq!(code, Some(1), "{key}");
    }
    // A removed zero_optimization key: DeepSpeed's whole text, with the link.
    let (j, _) = validate(d, &json!({"zero_optimization": {"stage": 3, "mics_shard_size": 2}}));
    expect(
        finding_at(&j, "config", "validation", "zero_optimization.mics_shard_size"),
        "fail",
        &["is no longer supported. See https://github.com/deepspeedai/DeepSpeed/issues/8489."],
        &[],
    );
}

#[test]
fn nvme_offload_without_nvme_path_fails() {
    let dir = TempDir::new("doctor-nopath");
    let cfg = json!({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"},
        "offload_optimizer": {"device": "nvme"}}});
    let (j, code) = validate(&dir.0, &cfg);
    let p = finding_at(&j, "config", "nvme_path", "zero_optimization.offload_param.nvme_path");
    expect(p, "fail", &["\"nvme_path\" in DeepSpeed Config cannot be None"], &["add \"nvme_path\""]);
    let o = finding_at(&j, "config", "nvme_path", "zero_optimization.offload_optimizer.nvme_path");
    expect(o, "fail", &["os.path.join", "NoneType"], &["add \"nvme_path\""]);
    assert_eq!(code, Some(1));
}

/// An nvme_path that is a file: DeepSpeed's makedirs fails there.
#[test]
fn an_nvme_path_that_is_a_file_fails() {
    let dir = TempDir::new("doctor-file-path");
    let d = &dir.0;
    let file = d.join("not-a-folder");
    std::fs::write(&file, b"x").unwrap();
    let cfg = write_json(d, "ds.json", &params(&file, json!({}), json!({})));
    let mut cmd = doctor_in(d, &["--json", "--only", "filesystem", "--config"]);
    cmd.arg(&cfg);
    let (j, code, _) = run(cmd);
    let f = finding_at(&j, "filesystem", "folder", "zero_optimization.offload_param.nvme_path");
    expect(f, "fail", &["is not a folder", "FileExistsError"], &["point zero_optimization.offload_param.nvme_path"]);
    assert_eq!(code, Some(1));
}

/// No GPU here: DeepSpeed refuses use_gds (its accelerator is the CPU), and
/// the gds section leads with use_gds false, without the compatibility-mode
/// noise.
#[test]
fn use_gds_without_a_gpu_says_set_it_false() {
    if nvidia_gpu() {
        skip("use_gds_without_a_gpu_says_set_it_false: this machine has an NVIDIA GPU");
        return;
    }
    let dir = TempDir::new("doctor-gds-nogpu");
    let d = &dir.0;
    let cfg = write_json(d, "ds.json", &params(d, json!({}), json!({"use_gds": true})));
    let mut cmd = doctor_in(d, &["--json", "--only", "config,gds", "--python", "/bin/false", "--config"]);
    cmd.arg(&cfg);
    let (j, code, _) = run(cmd);
    let v = finding_at(&j, "config", "validation", "aio.use_gds");
    expect(v, "fail", &["GDS currently only supported for CUDA accelerator"], &["\"use_gds\": false"]);
    let libs = finding(&j, "gds", "libraries");
    assert_eq!(libs["status"], "fail", "{libs}");
    assert!(text(libs, "fix").starts_with("there is no GPU here"), "{libs}");
    assert!(findings(&j, "gds", "mode").is_empty(), "no compatibility-mode noise without a GPU: {j:#}");
    assert_eq!(code, Some(1));
}

/// `doctor --only buffers` for a config and a model.
fn buffers(dir: &Path, cfg: &Value, model: &[&str]) -> (Value, Option<i32>) {
    let path = write_json(dir, "ds.json", cfg);
    let mut cmd = doctor_in(dir, &["--json", "--only", "buffers", "--python", "/bin/false", "--config"]);
    cmd.arg(&path).args(model);
    let (j, code, _) = run(cmd);
    (j, code)
}

#[test]
fn a_buffer_smaller_than_the_largest_parameter_fails_with_the_size_to_write() {
    let dir = TempDir::new("doctor-bufsize");
    let d = &dir.0;
    // DeepSpeed #3506: a 524709888-element embedding against the default 1e8.
    let cfg = params(d, json!({}), json!({}));
    let (j, code) = buffers(d, &cfg, &["--largest-param", "524709888", "--model-params", "6.7B"]);
    let f = finding(&j, "buffers", "buffer_size");
    expect(
        f,
        "fail",
        &["More elements 524709888 than buffer size 100000000", "#3506"],
        &["buffer_size to at least 524709888 (e.g. 530000000)"],
    );
    assert_eq!(f["key"], "zero_optimization.offload_param.buffer_size");
    assert_eq!(code, Some(1));
    // Over 8 ranks each holds an eighth: it fits.
    let (j, _) = buffers(d, &cfg, &["--largest-param", "524709888", "--world-size", "8"]);
    expect(finding(&j, "buffers", "buffer_size"), "ok", &["65588736 elements", "it fits"], &[]);
    // Without the model, not compared (never ok).
    let (j, _) = buffers(d, &cfg, &[]);
    expect(finding(&j, "buffers", "buffer_size"), "skip", &["not compared"], &["--largest-param"]);
}

#[test]
fn too_few_buffers_for_the_parameters_zero3_keeps_gathered_fail() {
    let dir = TempDir::new("doctor-bufcount");
    let d = &dir.0;
    // Two 1 MiB fp32 weights (the tests' tiny model): both stay gathered
    // through the turn from forward to backward, a buffer each.
    let cfg = params(d, json!({"buffer_count": 1, "buffer_size": 262144}), json!({}));
    let model = ["--model-params", "525312", "--largest-param", "262144"];
    let (j, code) = buffers(d, &cfg, &model);
    let f = finding(&j, "buffers", "buffer_count");
    expect(
        f,
        "fail",
        &["Not enough buffers 0 for swapping 1", "#3062", "= 2 parameters"],
        &["buffer_count to at least 2"],
    );
    assert_eq!(code, Some(1));
    let (j, code) = buffers(d, &params(d, json!({"buffer_count": 2, "buffer_size": 262144}), json!({})), &model);
    expect(finding(&j, "buffers", "buffer_count"), "ok", &[], &[]);
    assert_eq!(code, Some(0));
    // A 7B model with the defaults: the reuse window keeps more than 5.
    let big = params(d, json!({}), json!({}));
    let (j, _) = buffers(d, &big, &["--model-params", "7B", "--largest-param", "100M", "--world-size", "8"]);
    expect(finding(&j, "buffers", "buffer_count"), "ok", &["at least 5 parameters"], &[]);
    let (j, _) = buffers(d, &big, &["--model-params", "7B", "--largest-param", "50M", "--world-size", "8"]);
    expect(
        finding(&j, "buffers", "buffer_count"),
        "fail",
        &["= 10 parameters"],
        &["stage3_max_reuse_distance to 400000000"],
    );
    // The same over 8 nodes: only parameters of 64 x 262144 elements or more
    // are swapped, and the model's other weights may be smaller: a WARN.
    let args = ["--model-params", "7B", "--largest-param", "50M", "--world-size", "8", "--nodes", "8"];
    let (j, code) = buffers(d, &big, &args);
    expect(
        finding(&j, "buffers", "buffer_count"),
        "warn",
        &["= 10 parameters", "assumes", "16777216 elements", "1/16 of the largest"],
        &["buffer_count to at least 10"],
    );
    assert_eq!(code, Some(0));
}

#[test]
fn too_few_optimizer_buffers_fail() {
    let dir = TempDir::new("doctor-optbuf");
    let d = &dir.0;
    let cfg = json!({"zero_optimization": {"stage": 3, "sub_group_size": 1e6,
        "offload_optimizer": {"device": "nvme", "nvme_path": d, "buffer_count": 3}}});
    let (j, code) = buffers(d, &cfg, &[]);
    let f = finding(&j, "buffers", "optimizer buffer_count");
    expect(f, "fail", &["exp_avg", "one for its gradient: 4"], &["buffer_count to at least 4"]);
    assert_eq!(code, Some(1));
    // Pipelined, with several sub-groups per rank: the next and previous too.
    let cfg = json!({"zero_optimization": {"stage": 3, "sub_group_size": 1e6,
        "offload_optimizer": {"device": "nvme", "nvme_path": d, "pipeline_read": true, "pipeline_write": true}}});
    let (j, _) = buffers(d, &cfg, &["--model-params", "4M"]);
    expect(finding(&j, "buffers", "optimizer buffer_count"), "fail", &["4 x 3 = 12"], &["at least 12"]);
    let (j, code) = buffers(d, &cfg, &[]);
    expect(finding(&j, "buffers", "optimizer buffer_count"), "warn", &["more than one sub-group"], &["at least 12"]);
    assert_eq!(code, Some(0));
}

/// Exit codes: 0 nothing failed (warnings allowed), 1 a check failed, 2 the
/// doctor could not run; under --json stdout is one JSON document in every
/// case, with the error when it could not run.
#[test]
fn exit_codes_and_json_in_every_case() {
    let dir = TempDir::new("doctor-exit");
    let d = &dir.0;
    let could_not_run = |args: &[&str], words: &str| {
        let o = doctor_in(d, args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(words), "{args:?}: {}", stderr(&o));
        let mut json = args.to_vec();
        json.push("--json");
        let o = doctor_in(d, &json).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{json:?}");
        let (j, _) = report(&o);
        assert_eq!(j["status"], "error", "{j}");
        assert_eq!(j["exit_code"], 2);
        assert!(text(&j, "error").contains(words), "{j}");
        assert_eq!(j["checks"], json!([]));
    };
    let bad = d.join("bad.json");
    std::fs::write(&bad, "{ not json").unwrap();
    let list = d.join("list.json");
    std::fs::write(&list, "[1]").unwrap();
    could_not_run(&["--config", "missing.json"], "cannot read missing.json");
    could_not_run(&["--config", bad.to_str().unwrap()], "bad.json is not JSON");
    could_not_run(&["--config", list.to_str().unwrap()], "list.json is not a JSON object");
    could_not_run(&["--dir", bad.to_str().unwrap()], "bad.json is not a folder");
    could_not_run(&["--only", "disks"], "expected one of");
    could_not_run(&["--no-such-flag"], "--no-such-flag");

    // 1: a check failed; stdout is the report, stderr names the check.
    let cfg = write_json(d, "fail.json", &params(d, json!({"device": "NVMe"}), json!({})));
    let o = doctor_in(d, &["--json", "--only", "config", "--python", "/bin/false", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let (j, code) = report(&o);
    assert_eq!((code, j["status"].as_str()), (Some(1), Some("fail")));
    assert!(stderr(&o).contains("config/validation"), "{}", stderr(&o));
    // 0: a warning alone (nothing swaps to NVMe).
    let cfg = write_json(d, "warn.json", &json!({"zero_optimization": {"stage": 3}}));
    let o = doctor_in(d, &["--json", "--only", "config", "--python", "/bin/false", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let (j, code) = report(&o);
    assert_eq!((code, j["status"].as_str()), (Some(0), Some("warn")), "{j}");
    // 0: all ok, in text too.
    let o = doctor_in(d, &["--only", "engine"]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("summary: "));
}

/// Swap buffers that lock more than the machine has free: the fix says how
/// many buffers (or how big) fit.
#[test]
fn swap_buffers_beyond_the_free_memory_fail_with_what_fits() {
    let dir = TempDir::new("doctor-ram");
    let d = &dir.0;
    let avail: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024;
    // 4-byte elements, 16 buffers of a quarter of the free memory each: 4 times too much.
    let size = avail / 16;
    let cfg = write_json(d, "ds.json", &params(d, json!({"buffer_count": 16, "buffer_size": size}), json!({})));
    let mut cmd = doctor_in(d, &["--json", "--only", "memlock", "--python", "/bin/false", "--config"]);
    cmd.arg(&cfg);
    let (j, code, _) = run(cmd);
    let f = finding(&j, "memlock", "memory");
    expect(f, "fail", &["exceed MemAvailable", "locked pages stay in RAM"], &["elements or less"]);
    // A quarter of what was free when the test looked: 4, or 3 if the doctor found less free.
    let fix = text(f, "fix");
    let count =
        fix.split("buffer_count to ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<u64>().ok());
    assert!(matches!(count, Some(3 | 4)), "{fix}");
    assert_eq!(code, Some(1));
}

/// `doctor --only config,filesystem --json` on the config file `text`, with the table.
fn read_config(dir: &Path, text: &str) -> (Value, Option<i32>, String) {
    let path = dir.join("ds.json");
    std::fs::write(&path, text).unwrap();
    let mut cmd = doctor_in(dir, &["--json", "--only", "config,filesystem", "--python", "/bin/false", "--config"]);
    cmd.arg(&path);
    run(cmd)
}

/// DeepSpeed reads the file with hjson: a BOM, `//`, `/* */` and `#`
/// comments and trailing commas are a config it takes, so the doctor reads
/// it (without Python) and checks its nvme_path; `//`, `/*` and `#` inside
/// strings are text, kept as written.
#[test]
fn a_commented_config_with_a_bom_is_read_and_its_nvme_path_checked() {
    let dir = TempDir::new("doctor-comments");
    let d = &dir.0;
    std::fs::create_dir(d.join("swap#1")).unwrap();
    let nvme = format!("{}//swap#1", d.display());
    let text = format!(
        "\u{feff}// ZeRO-3 to NVMe\n{{\n  \"train_batch_size\": 8, # the global batch\n  \"zero_optimization\": {{\n    \
         \"stage\": 3, /* parameters\n       to NVMe */\n    \"offload_param\": {{\"device\": \"nvme\", \"nvme_path\": \
         \"{nvme}\", \"buffer_count\": 5,}},\n  }},\n  \"note\": \"http://x//y /* not a comment */ # nor this\",\n}}\n"
    );
    let (j, code, err) = read_config(d, &text);
    assert_eq!(code, Some(0), "{err}\n{j:#}");
    expect(finding(&j, "config", "read"), "ok", &["JSON with comments"], &[]);
    expect(finding(&j, "config", "offload"), "ok", &[&format!("parameters to {nvme} (5 buffers")], &[]);
    let f = finding_at(&j, "filesystem", "O_DIRECT", "zero_optimization.offload_param.nvme_path");
    assert_eq!(f["path"], nvme.as_str(), "{f:#}");
    assert!(problems(&j).is_empty(), "{:#?}", problems(&j));
}

/// DeepSpeed's duplicate-key hook refuses a key given twice in one object,
/// at any depth: a FAIL with its text, naming the key (serde_json alone
/// keeps the last and says nothing).
#[test]
fn a_duplicate_key_fails_with_deepspeeds_text_at_any_depth() {
    let dir = TempDir::new("doctor-duplicates");
    let d = &dir.0;
    let block = format!(r#"{{"stage": 3, "offload_param": {{"device": "nvme", "nvme_path": "{}"}}}}"#, d.display());
    let (j, code, err) = read_config(d, &format!(r#"{{"zero_optimization": {block}, "zero_optimization": {block}}}"#));
    assert_eq!(code, Some(1), "{j:#}");
    assert!(err.contains("config/duplicate keys"), "{err}");
    let f = finding_at(&j, "config", "duplicate keys", "zero_optimization");
    expect(f, "fail", &["Duplicate keys in DeepSpeed config: ['zero_optimization']", "at the top level"], &[]);
    assert_eq!(findings(&j, "config", "duplicate keys").len(), 1, "{j:#}");

    let nested = format!(
        r#"{{"zero_optimization": {{"stage": 3, "offload_param": {{"device": "nvme", "nvme_path": "{d}", "nvme_path": "{d}/x"}}}}}}"#,
        d = d.display()
    );
    let (j, code, _) = read_config(d, &nested);
    assert_eq!(code, Some(1), "{j:#}");
    let f = finding_at(&j, "config", "duplicate keys", "zero_optimization.offload_param.nvme_path");
    expect(
        f,
        "fail",
        &["Duplicate keys in DeepSpeed config: ['nvme_path']", "in zero_optimization.offload_param"],
        &["keep one"],
    );
}

/// What only hjson reads (quoteless keys) needs DeepSpeed's reader in the
/// job's Python: without it the doctor cannot run, and says so.
#[test]
fn a_config_only_hjson_reads_needs_deepspeeds_reader() {
    let dir = TempDir::new("doctor-hjson");
    let d = &dir.0;
    let (j, code, err) = read_config(d, "{\n  zero_optimization: {stage: 3}\n}\n");
    assert_eq!(code, Some(2), "{j:#}");
    assert_eq!(j["status"], "error", "{j}");
    for words in ["ds.json is not JSON", "DeepSpeed reads it with hjson", "--python"] {
        assert!(text(&j, "error").contains(words) && err.contains(words), "{words}: {j}");
    }
}
